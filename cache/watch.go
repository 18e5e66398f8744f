package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// Watches of a cached scope are served from the Store's event history
// (store/history.go), as kube-apiserver's cacher serves them from its watch
// cache: the initial events (a watch-list, or a legacy watch from "0" or
// unset) from a snapshot, then every event after it that the watch's
// selectors see, converted as the cacher converts them, with periodic
// bookmarks for clients that accept them. The upstream sees one watch per
// resource however many clients watch it.

// Timing of served watches, as kube-apiserver's.
var (
	// bookmarkFrequency is how often a watch that accepts bookmarks gets
	// one (kube-apiserver's cacher: once a minute, and shortly before the
	// watch times out).
	bookmarkFrequency = time.Minute
	// bookmarkBeforeTimeout is how long before its timeout a watch gets
	// its last bookmark.
	bookmarkBeforeTimeout = 2 * time.Second
	// minRequestTimeout is kube-apiserver's --min-request-timeout default:
	// a watch without timeoutSeconds ends after a random time between it
	// and twice it.
	minRequestTimeout = 1800 * time.Second
	// watchWriteTimeout bounds each write of a served watch once its
	// initial events are sent. Clients are on this node: one that reads
	// nothing for this long while events wait for it is stuck, and its
	// watch is ended, as kube-apiserver's cacher ends a watcher whose
	// buffer stays full. It re-watches from the last RV it got.
	watchWriteTimeout = 10 * time.Second
)

// watchBatch is how many events a watch takes from the history at once;
// its memory is these pointers, its writer's buffer and the event being
// encoded, however far behind it is.
const watchBatch = 64

// Why a served watch ended, for metrics.
const (
	endClient   = "client"
	endTimeout  = "timeout"
	endRelisted = "relisted"
	endSlow     = "slow"
	endStopped  = "informer-stopped"
	endTooOld   = "too-old"
	endWentBack = "resource-version-went-back"
)

// serveWatch answers a watch from the cache: p's initial events if it
// asks for them, else from p.minRV (a resourceVersion N, from the cursor
// placeWatch took) or from the Store's current RV ("0" or unset); then the
// events after that RV until the client goes away, the request's context
// ends (the agent drains), the timeout passes, the client falls behind the
// event window or stops reading, or the Store relists or stops.
func (c *Cache) serveWatch(w http.ResponseWriter, r *http.Request, p *plan) {
	start := time.Now()
	res := p.res
	st := res.store
	logger := klog.FromContext(r.Context())
	ww, err := newWatchWriter(w, p.media)
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	var objs []*store.Object
	var from uint64
	var cur store.Cursor
	switch {
	case p.initialEvents:
		var all []*store.Object
		all, from, cur = st.SnapshotForWatch()
		objs = make([]*store.Object, 0, len(all))
		for _, o := range all {
			if st.Selects(p.pred, o) {
				objs = append(objs, o)
			}
		}
	case p.fromRV:
		from, cur = p.minRV, p.cursor
		if p.expired != nil {
			// kube-apiserver answers a watch it has authorized and whose
			// resourceVersion it parsed with a stream holding one ERROR
			// event, not with an HTTP error.
			c.metrics.watchEnded(res.label, endTooOld)
			b, encErr := p.events.Status(statusOf(p.expired))
			if encErr != nil {
				c.encodingFailed(w, r, res, encErr)
				return
			}
			ww.start()
			_ = ww.event(watch.Error, b)
			ww.flush()
			return
		}
	default:
		from, cur = st.CurrentCursor()
	}
	// Encode every initial object before writing anything, so an
	// encoding error is still an HTTP error. The encodings are kept with
	// the objects; each event is framed from them only as it is written.
	for _, o := range objs {
		if err := p.events.Prepare(o); err != nil {
			c.encodingFailed(w, r, res, err)
			return
		}
	}
	var initialEnd []byte
	if p.initialEvents && p.bookmarks {
		if initialEnd, err = c.bookmarkObject(p, from, true); err != nil {
			c.encodingFailed(w, r, res, err)
			return
		}
	}

	done := c.metrics.watchStarted(res)
	reason := endClient
	defer func() { done(reason) }()
	ww.start()
	for _, o := range objs {
		b, err := p.events.Object(o)
		if err != nil {
			return
		}
		if err := ww.event(watch.Added, b); err != nil {
			return
		}
	}
	if initialEnd != nil {
		// As kube-apiserver's watch cache: the initial-events-end bookmark
		// only for clients that accept bookmarks. A legacy watch from "0"
		// or "" (sendInitialEvents defaulted to true) without them gets
		// the ADDED events alone.
		if err := ww.event(watch.Bookmark, initialEnd); err != nil {
			return
		}
	}
	ww.flush()
	ww.out.timeout = watchWriteTimeout
	logger.V(4).Info("Serving a watch from the cache", "resource", res.label, "initialEvents", len(objs), "resourceVersion", from)
	objs = nil

	timeout := p.timeout
	if timeout <= 0 {
		timeout = time.Duration(float64(minRequestTimeout) * (1 + rand.Float64()))
	}
	deadline := start.Add(timeout)
	end := time.NewTimer(time.Until(deadline))
	defer end.Stop()
	var bookmarks <-chan time.Time
	var bookmarkTimer *time.Timer
	nextBookmark := func() {
		at := time.Now().Add(bookmarkFrequency)
		if pre := deadline.Add(-bookmarkBeforeTimeout); pre.Before(at) {
			at = pre
		}
		if d := time.Until(at); d > 0 {
			bookmarkTimer.Reset(d)
		}
	}
	if p.bookmarks {
		bookmarkTimer = time.NewTimer(time.Hour)
		defer bookmarkTimer.Stop()
		bookmarks = bookmarkTimer.C
		nextBookmark()
	}
	bookmarkDue := false
	// seen is the RV up to which the watch has seen every event (sent it,
	// or found that its selectors do not see it): a bookmark's RV.
	seen := from
	buf := make([]*store.Event, 0, watchBatch)
	for {
		if r.Context().Err() != nil {
			return
		}
		evs, next, storeRV, changed, state := st.Next(cur, buf[:0], watchBatch)
		switch state {
		case store.CursorReplaced:
			// Ended once the informer's new watch is open (bounded), so
			// that the client's next watch is served from the new window
			// rather than forwarded as unhealthy. (One from an RV before
			// the new window is forwarded as too old: placeWatch. The
			// Store relists when kube-apiserver could not resume its own
			// watch, so kube-apiserver mostly answers that one with a
			// quick 410, and the client relists from the cache.)
			reason = endRelisted
			c.awaitHealthy(r.Context(), res)
			return
		case store.CursorWentBack:
			// The client's RVs belong to a history the upstream no
			// longer has: a watch from them would skip events. 410
			// makes it relist (store/history.go).
			reason = endWentBack
			logger.V(2).Info("Ended a watch: the resource's resourceVersion went back", "resource", res.label, "resourceVersion", seen)
			if b, err := p.events.Status(statusOf(apierrors.NewResourceExpired(
				"the resource's history was replaced by an older one (its resourceVersion went back): list again"))); err == nil {
				_ = ww.event(watch.Error, b)
				_ = ww.flushErr()
			}
			return
		case store.CursorBehind:
			reason = endSlow
			logger.V(2).Info("Ended a watch that fell behind the event window", "resource", res.label, "resourceVersion", seen)
			return
		case store.CursorClosed:
			reason = endStopped
			return
		}
		cur = next
		for _, e := range evs {
			if e.ResourceVersion() <= from {
				// A watch from an RV the Store has not reached yet.
				continue
			}
			t, o, err := c.convert(p, e)
			if err != nil {
				logger.Error(err, "Encoding a watch event failed", "resource", res.label)
				return
			}
			if o != nil {
				b, err := p.events.Object(o)
				if err != nil {
					logger.Error(err, "Encoding a watch event failed", "resource", res.label)
					return
				}
				if err := ww.event(t, b); err != nil {
					reason = writeEndReason(err)
					return
				}
				c.metrics.eventSent(res.label)
			}
			seen = e.ResourceVersion()
		}
		behind := len(evs) == watchBatch
		if !behind {
			// Caught up: every event up to storeRV has been seen.
			seen = max(seen, storeRV)
		} else {
			// A watch that stays behind, every read a full batch, still
			// ends at its deadline, as kube-apiserver's does whatever its
			// backlog, and gets the bookmarks that fall due.
			select {
			case <-end.C:
				reason = endTimeout
				_ = ww.flushErr()
				return
			case <-bookmarks:
				bookmarkDue = true
			default:
			}
		}
		if bookmarkDue {
			// As kube-apiserver's cacheWatcher: a bookmark whenever one is
			// due and the RV is past the one the watch started from, even
			// if no event came since the last event or bookmark sent (it
			// then repeats that RV). A behind watch's bookmark is at the
			// last event it has seen.
			if seen > from {
				b, err := c.bookmarkObject(p, seen, false)
				if err != nil {
					return
				}
				if err := ww.event(watch.Bookmark, b); err != nil {
					reason = writeEndReason(err)
					return
				}
			}
			bookmarkDue = false
			nextBookmark()
		}
		if behind {
			continue
		}
		if err := ww.flushErr(); err != nil {
			reason = writeEndReason(err)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			reason = endTimeout
			return
		case <-bookmarks:
			bookmarkDue = true
		case <-changed:
		}
	}
}

// placeWatch takes the place in the Store's history of p, a watch from
// p.minRV, and returns a reason to forward it if the event window no
// longer holds every event after p.minRV. Handler calls it once the
// caller is reviewed and the cache is ready to serve p, before anything of
// the answer is written.
//
// A watch from before the window is kube-apiserver's to answer, not the
// agent's: the agent's window starts at its own list and holds a bounded
// number of events, while kube-apiserver may still serve the revision
// (from its watch cache or from etcd; a watch from resourceVersion=1 on a
// young cluster replays its whole history), and answers 410 itself for a
// revision etcd has compacted. So the watch is forwarded unchanged, like
// any request the cache does not answer: with the caller's own
// credentials, under kube-apiserver's own authorization and limits. Any
// caller can have it forwarded at will by asking for an old
// resourceVersion; it costs kube-apiserver exactly what the same watch
// sent to it directly would, and no more. Its client watches again from
// its last resourceVersion when it ends, and is served from the cache if
// the window holds that one.
//
// The decision and the cursor are taken at once, under the Store's lock,
// so no event can fall between them: the events applied afterwards are
// the watch's to send, and should they push its cursor out of the window
// before it reads them, the watch ends as one that fell behind (its client
// watches again from the same resourceVersion, and is forwarded then). An
// RV newer than the Store's is in the window: the watch starts at once
// and skips the events up to it, as kube-apiserver's does.
//
// While kube-apiserver is unreachable (degraded mode) forwarding could
// only fail, and the client would retry the same resourceVersion until it
// is back; the watch gets the 410 kube-apiserver's watch cache answers
// once its window has moved on, and its client relists, from the cache.
func (c *Cache) placeWatch(ctx context.Context, p *plan) string {
	cur, floor, ok := p.res.store.WatchFrom(p.minRV)
	switch {
	case ok:
		p.cursor = cur
		return ""
	case degraded(ctx):
		p.expired = tooOld(p.minRV, floor)
		return ""
	}
	klog.FromContext(ctx).V(4).Info("Forwarding a watch from before the event window", "resource", p.res.label, "resourceVersion", p.minRV, "floor", floor)
	return reasonTooOld
}

// tooOld is kube-apiserver's answer to a watch from an RV its window has
// moved past.
func tooOld(rv, floor uint64) error {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, floor))
}

// writeEndReason is why a watch whose write failed ended: a write that
// timed out is a client that stopped reading.
func writeEndReason(err error) string {
	if isTimeout(err) {
		return endSlow
	}
	return endClient
}

// convert is e as p's watch sees it, as kube-apiserver's cacher converts
// an event for a watcher: ADDED when the object enters the watch's
// selectors, MODIFIED while it stays in them, DELETED when it leaves them
// (the previous state, at the event's resourceVersion) or is deleted
// while in them; a nil object when the watch does not see e.
func (c *Cache) convert(p *plan, e *store.Event) (watch.EventType, *store.Object, error) {
	st := p.res.store
	if e.Type() == watch.Deleted {
		// The upstream watch sent the deleted object as kube-apiserver
		// sends it: its last state at the deletion's resourceVersion.
		if st.Selects(p.pred, e.Object()) {
			return watch.Deleted, e.Object(), nil
		}
		return "", nil, nil
	}
	now := st.Selects(p.pred, e.Object())
	before := e.Prev() != nil && st.Selects(p.pred, e.Prev())
	switch {
	case now && before:
		return watch.Modified, e.Object(), nil
	case now:
		return watch.Added, e.Object(), nil
	case before:
		o, err := st.DeletedAt(e)
		return watch.Deleted, o, err
	}
	return "", nil, nil
}

// bookmarkObject is a bookmark's object at rv, as kube-apiserver's watch
// cache makes it: an empty object of the resource's kind carrying only the
// resourceVersion, and for the end of the initial events the
// k8s.io/initial-events-end annotation; embedded as p's events embed
// objects.
func (c *Cache) bookmarkObject(p *plan, rv uint64, initialEventsEnd bool) ([]byte, error) {
	res := p.res
	var obj runtime.Object
	if res.builtin {
		o, err := scheme.Scheme.New(res.gvk)
		if err != nil {
			return nil, err
		}
		obj = o
	} else {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(res.gvk)
		obj = u
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(strconv.FormatUint(rv, 10))
	if initialEventsEnd {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	obj.GetObjectKind().SetGroupVersionKind(res.gvk)
	return p.events.Bookmark(obj)
}
