package store

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
)

// The event history is the Store's window of recent changes, as
// kube-apiserver's watch cache keeps one: every watch of a cached scope is
// served from it (watch.go), so one upstream watch per resource feeds every
// client watch on the node.
//
// The window holds the events the Store applied after its last Replace,
// oldest first, bounded in count and in bytes. floor is the highest
// resourceVersion whose successors are all in the window: a watch from
// an RV ≥ floor gets exactly the events after it; the window cannot serve
// a watch from an older RV (WatchFrom's ok false), which the cache hands
// to kube-apiserver, which may still serve it or answers 410 Gone.
// A Replace (the Store's watch broke and it relisted) starts a new epoch:
// the window restarts empty at the list's RV and watches of the old epoch
// end, as kube-apiserver's cacher ends its watchers when it relists; their
// clients watch again from their last RV, which is before the new floor
// unless nothing changed.
//
// An RV that goes back (a list or an event older than the Store's RV: the
// upstream's etcd was restored from a backup) also starts a new epoch,
// but its watches cannot simply end: their clients would watch again from
// an RV that the new history has not reached, and be served from there,
// skipping every event up to it. So they end with a 410 Expired ERROR
// event, and their clients relist.

// Default bounds of a resource's event window.
const (
	DefaultHistoryEvents = 10000
	DefaultHistoryBytes  = 8 << 20
)

// Event is one change the Store applied, as a watch receives it before
// its own selectors are applied.
type Event struct {
	typ watch.EventType
	// obj is the object after the change; for a deletion, the deleted
	// object as the upstream watch sent it (its last state, at the
	// deletion's RV).
	obj *Object
	// prev is the object before the change; nil if the Store did not hold
	// it.
	prev *Object
	rv   uint64
	// at is when the Store applied it; size estimates what it keeps alive.
	at   time.Time
	size int

	// prevAtRV is prev at rv: what a watch whose selectors prev matched
	// but obj does not gets as a DELETED event (kube-apiserver's cacher
	// sends the previous state with the event's resourceVersion). Made
	// on first use.
	prevOnce sync.Once
	prevAtRV *Object
	prevErr  error
}

// Type is the event's type: ADDED, MODIFIED or DELETED.
func (e *Event) Type() watch.EventType { return e.typ }

// Object is the object after the change; for a deletion, the deleted
// object as the upstream watch sent it.
func (e *Event) Object() *Object { return e.obj }

// Prev is the object before the change; nil if the Store did not hold it.
func (e *Event) Prev() *Object { return e.prev }

// ResourceVersion is the RV of the change.
func (e *Event) ResourceVersion() uint64 { return e.rv }

// history is a Store's event window. The Store's mu protects it.
type history struct {
	maxEvents, maxBytes int
	// ring holds the window: events[start], events[start+1], ... (mod
	// len), n of them; seq is the sequence number of the next event, so
	// the window's events are numbered seq-n ... seq-1.
	ring  []*Event
	start int
	n     int
	seq   uint64
	bytes int
	// floor: every event with an RV > floor is in the window.
	floor uint64
	// epoch counts Replaces: a watch of an older epoch has ended.
	epoch uint64
	// backEpoch is the latest epoch that began with the RV going back: a
	// watch of an older epoch must make its client relist.
	backEpoch uint64
}

func newHistory(maxEvents, maxBytes int) *history {
	if maxEvents <= 0 {
		maxEvents = DefaultHistoryEvents
	}
	if maxBytes <= 0 {
		maxBytes = DefaultHistoryBytes
	}
	return &history{maxEvents: maxEvents, maxBytes: maxBytes}
}

// at returns the window's event with sequence number s, which must be in
// [seq-n, seq).
func (h *history) at(s uint64) *Event {
	i := (h.start + int(s-(h.seq-uint64(h.n)))) % len(h.ring)
	return h.ring[i]
}

// add appends e, evicting the oldest events past the bounds. An event
// whose RV does not follow the window's (a watch that went back) starts a
// new epoch at it: what came before cannot be ordered with it.
func (h *history) add(e *Event) {
	if h.n > 0 && e.rv <= h.at(h.seq-1).rv {
		h.wentBack(max(e.rv, 1) - 1)
	}
	if h.n == len(h.ring) {
		h.grow()
	}
	h.ring[(h.start+h.n)%len(h.ring)] = e
	h.n++
	h.seq++
	h.bytes += e.size
	for h.n > 1 && (h.n > h.maxEvents || h.bytes > h.maxBytes) {
		h.evict()
	}
}

// grow doubles the ring, up to maxEvents slots.
func (h *history) grow() {
	size := min(max(2*len(h.ring), 64), h.maxEvents)
	if size <= len(h.ring) {
		size = len(h.ring) + 1
	}
	ring := make([]*Event, size)
	for i := range h.n {
		ring[i] = h.ring[(h.start+i)%len(h.ring)]
	}
	h.ring, h.start = ring, 0
}

func (h *history) evict() {
	e := h.ring[h.start]
	h.ring[h.start] = nil
	h.start = (h.start + 1) % len(h.ring)
	h.n--
	h.bytes -= e.size
	h.floor = e.rv
}

// reset empties the window, whose floor becomes rv; a new epoch ends the
// watches of the old one.
func (h *history) reset(rv uint64, newEpoch bool) {
	clear(h.ring)
	h.start, h.n, h.bytes, h.floor = 0, 0, 0, rv
	if len(h.ring) > 64 {
		// Let a window that grew for a burst shrink again.
		h.ring = nil
	}
	if newEpoch {
		h.epoch++
	}
}

// wentBack empties the window, whose floor becomes rv, in a new epoch
// that began with the RV going back: the watches of older epochs end
// with 410 Expired.
func (h *history) wentBack(rv uint64) {
	h.reset(rv, true)
	h.backEpoch = h.epoch
}

// position returns the sequence number of the first event with an RV
// greater than rv, or ok false if events after rv have left the window.
func (h *history) position(rv uint64) (seq uint64, ok bool) {
	if rv < h.floor {
		return 0, false
	}
	lo, hi := h.seq-uint64(h.n), h.seq
	for lo < hi {
		mid := lo + (hi-lo)/2
		if h.at(mid).rv <= rv {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, true
}

// oldest returns when the oldest event in the window was applied.
func (h *history) oldest() (time.Time, bool) {
	if h.n == 0 {
		return time.Time{}, false
	}
	return h.ring[h.start].at, true
}

// Cursor is a watch's place in its Store's history.
type Cursor struct {
	seq   uint64
	epoch uint64
}

// CursorState says why a read of the history returned no events.
type CursorState int

const (
	CursorOK CursorState = iota
	// cursorReplaced: the Store relisted; the watch's epoch is over.
	CursorReplaced
	// cursorWentBack: the Store's RV went back since the watch's epoch;
	// its client must relist.
	CursorWentBack
	// cursorBehind: the watch's next event has left the window.
	CursorBehind
	// cursorClosed: the Store's informer stopped.
	CursorClosed
)

// WatchFrom returns a cursor at the first event after rv, or ok false
// and the window's floor if the window no longer holds every event after
// rv (a watch it cannot serve). The Store must be synced.
func (s *Store) WatchFrom(rv uint64) (c Cursor, floor uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	seq, ok := s.hist.position(rv)
	if !ok {
		return Cursor{}, s.hist.floor, false
	}
	return Cursor{seq: seq, epoch: s.hist.epoch}, s.hist.floor, true
}

// SnapshotForWatch returns every object in key order, the RV they are
// consistent at, and a cursor at the first event after it, all taken at
// once: a watch-list sends the objects, then exactly the events after.
func (s *Store) SnapshotForWatch() ([]*Object, uint64, Cursor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sorted := s.sortedLocked()
	return sorted, s.rv, Cursor{seq: s.hist.seq, epoch: s.hist.epoch}
}

// CurrentCursor returns the Store's RV and a cursor at the next event.
func (s *Store) CurrentCursor() (uint64, Cursor) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rv, Cursor{seq: s.hist.seq, epoch: s.hist.epoch}
}

// Next appends to buf up to max events from c on, and returns them with
// the cursor after them, the Store's RV when read (every event up to it has
// been returned once the result is empty), a channel closed at the next
// change, and why there is nothing to read if that is so.
func (s *Store) Next(c Cursor, buf []*Event, max int) ([]*Event, Cursor, uint64, <-chan struct{}, CursorState) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h := s.hist
	switch {
	case h.backEpoch > c.epoch:
		return buf, c, s.rv, nil, CursorWentBack
	case c.epoch != h.epoch:
		return buf, c, s.rv, nil, CursorReplaced
	case c.seq < h.seq-uint64(h.n):
		return buf, c, s.rv, nil, CursorBehind
	}
	for c.seq < h.seq && len(buf) < max {
		buf = append(buf, h.at(c.seq))
		c.seq++
	}
	if len(buf) == 0 && s.closed {
		return buf, c, s.rv, nil, CursorClosed
	}
	return buf, c, s.rv, s.rvChanged, CursorOK
}

// HistoryStats describes a Store's event window.
type HistoryStats struct {
	Events int
	Bytes  int
	// Oldest is when the oldest event was applied (zero when empty).
	Oldest time.Time
	// Floor is the oldest RV a watch may start from.
	Floor uint64
}

// History returns the event window's size.
func (s *Store) History() HistoryStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	oldest, _ := s.hist.oldest()
	return HistoryStats{Events: s.hist.n, Bytes: s.hist.bytes, Oldest: oldest, Floor: s.hist.floor}
}

// DeletedAt returns e's previous object at e's RV, the object of the
// DELETED event a watch gets when e takes an object out of its selectors.
func (s *Store) DeletedAt(e *Event) (*Object, error) {
	e.prevOnce.Do(func() {
		obj, err := e.prev.Decoded()
		if err != nil {
			e.prevErr = err
			return
		}
		obj = obj.DeepCopyObject()
		m, err := meta.Accessor(obj)
		if err != nil {
			e.prevErr = err
			return
		}
		m.SetResourceVersion(fmt.Sprint(e.rv))
		e.prevAtRV, e.prevErr = s.compact(obj, m.GetNamespace(), m.GetName())
	})
	return e.prevAtRV, e.prevErr
}

// objectSize estimates the memory an Object keeps alive.
func objectSize(o *Object) int {
	const overhead = 160
	n := overhead + len(o.key) + len(o.labels) + len(o.fieldValues) + len(o.raw)
	if u, ok := o.obj.(*unstructured.Unstructured); ok {
		n += valueSize(u.Object)
	} else if o.obj != nil {
		n += 1024
	}
	return n
}

// valueSize estimates the memory of a decoded JSON value.
func valueSize(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 48
		for k, e := range v {
			n += 16 + len(k) + valueSize(e)
		}
		return n
	case []any:
		n := 24
		for _, e := range v {
			n += valueSize(e)
		}
		return n
	case string:
		return 16 + len(v)
	default:
		return 16
	}
}
