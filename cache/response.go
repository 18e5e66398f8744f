package cache

import (
	"bytes"
	"compress/gzip"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// Lists are compressed as kube-apiserver compresses its responses: with
// gzip at level 1 (least CPU) when the client accepts gzip and the body is
// over 128 KiB (k8s.io/apiserver's responsewriters; its APIResponseCompression
// feature is on by default).
const (
	gzipLevel     = gzip.BestSpeed
	gzipThreshold = 128 << 10
)

// acceptsGzip reports whether r's Accept-Encoding names gzip, read the way
// kube-apiserver reads it: comma-separated tokens, one of them exactly
// "gzip" (a token with parameters such as "gzip;q=0" does not count).
func acceptsGzip(r *http.Request) bool {
	// kube-apiserver reads the first Accept-Encoding line only.
	for tok := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		if strings.TrimSpace(tok) == "gzip" {
			return true
		}
	}
	return false
}

// maxCompressedLists bounds the compressed lists kept per resource.
const maxCompressedLists = 4

// compressedLists keeps a resource's most recent compressed list bodies.
// Compressing a large list costs several times more CPU than writing it,
// and callers on a node tend to list the same objects (an informer start,
// a DaemonSet's pods each listing their node's pods), so a compressed body
// is reused for as long as a list would select exactly the same objects at
// the same resourceVersion. Objects are immutable in a Store (a change
// replaces the Object), so the same Object pointers in the same order at
// the same resourceVersion mean the same bytes, whatever selectors picked
// them; access has been decided for each request before this is reached.
type compressedLists struct {
	mu      sync.Mutex  // protects the fields below
	entries []*gzipList // most recently used first
	// gen counts clears: a body compressed from a snapshot taken before
	// a clear is of an older resourceVersion and is not kept.
	gen uint64
}

// generation returns the clear count, to be read before a snapshot that
// may be compressed.
func (l *compressedLists) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// gzipList is one compressed list body. gz and err are set once, by the
// request that added the entry, before ready is closed.
type gzipList struct {
	media store.MediaType
	rv    uint64
	objs  []*store.Object

	ready chan struct{}
	gz    []byte
	err   error
}

func (e *gzipList) matches(media store.MediaType, objs []*store.Object, rv uint64) bool {
	return e.media == media && e.rv == rv && slices.Equal(e.objs, objs)
}

// find returns the entry for objs at rv in media, moved to the front, or
// nil. l.mu must be held.
func (l *compressedLists) find(media store.MediaType, objs []*store.Object, rv uint64) *gzipList {
	for i, e := range l.entries {
		if e.matches(media, objs, rv) {
			copy(l.entries[1:i+1], l.entries[:i])
			l.entries[0] = e
			return e
		}
	}
	return nil
}

// lookup returns the compressed body of objs at rv in media if it is kept
// (waiting for a compression still running).
func (l *compressedLists) lookup(media store.MediaType, objs []*store.Object, rv uint64) ([]byte, bool) {
	l.mu.Lock()
	e := l.find(media, objs, rv)
	l.mu.Unlock()
	if e == nil {
		return nil, false
	}
	<-e.ready
	return e.gz, e.err == nil
}

var gzipWriters = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(nil, gzipLevel) // a valid level: no error
	return zw
}}

// compress returns b, the body of objs at rv in media, compressed, and
// keeps it for later lookups unless it is already outdated: the lists
// were cleared since generation gen, or current (the Store's
// resourceVersion, read under l.mu so that a change's clear always comes
// after) is no longer rv. Concurrent callers for the same body share one
// compression.
func (l *compressedLists) compress(gen uint64, current func() uint64, media store.MediaType, objs []*store.Object, rv uint64, b *store.Body) ([]byte, error) {
	l.mu.Lock()
	e := l.find(media, objs, rv)
	if e != nil {
		l.mu.Unlock()
		<-e.ready
		return e.gz, e.err
	}
	e = &gzipList{media: media, rv: rv, objs: objs, ready: make(chan struct{})}
	if gen != l.gen || current() != rv {
		l.mu.Unlock()
		e.fill(b)
		return e.gz, e.err
	}
	if len(l.entries) == maxCompressedLists {
		l.entries[len(l.entries)-1] = nil
		l.entries = l.entries[:len(l.entries)-1]
	}
	l.entries = slices.Insert(l.entries, 0, e)
	l.mu.Unlock()

	e.fill(b)
	if e.err != nil {
		l.drop(e)
	}
	return e.gz, e.err
}

// fill compresses b into e and then closes e.ready, whatever happens, so
// that no waiter is left blocked.
func (e *gzipList) fill(b *store.Body) {
	defer close(e.ready)
	// Waiters see this if compressing panics.
	e.err = errors.New("list compression did not finish")
	var buf bytes.Buffer
	buf.Grow(b.Size() / 4)
	zw := gzipWriters.Get().(*gzip.Writer)
	zw.Reset(&buf)
	err := b.WriteAll(zw)
	if err == nil {
		err = zw.Close()
	}
	zw.Reset(nil)
	gzipWriters.Put(zw)
	// Kept as long as the entry: no spare capacity.
	e.gz, e.err = bytes.Clone(buf.Bytes()), err
}

// clear drops every kept body; compressions still running finish for
// their callers.
func (l *compressedLists) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.entries)
	l.entries = l.entries[:0]
	l.gen++
}

func (l *compressedLists) drop(e *gzipList) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.entries, e); i >= 0 {
		l.entries = slices.Delete(l.entries, i, i+1)
	}
}

// writeGzip writes a compressed body with kube-apiserver's headers for it.
func writeGzip(w http.ResponseWriter, gz []byte) {
	h := w.Header()
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
	_, _ = w.Write(gz)
}
