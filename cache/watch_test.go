package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fastBookmarks makes served watches get a bookmark every d.
func fastBookmarks(t *testing.T, d time.Duration) {
	old := bookmarkFrequency
	bookmarkFrequency = d
	t.Cleanup(func() { bookmarkFrequency = old })
}

// next reads n events, failing after a few seconds without them.
func next(t *testing.T, w watch.Interface, n int) []watch.Event {
	t.Helper()
	var out []watch.Event
	// A wait for what must come, not a bound: it returns as soon as the
	// events are there, and is long enough for a loaded machine.
	timeout := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended after %v, want %d events", summarize(out), n)
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("got %v, want %d events", summarize(out), n)
		}
	}
	return out
}

// labeled is a pod of node-a with label app=v.
func labeled(name, rv, app string) *corev1.Pod {
	p := wlPod(name, rv)
	p.Labels = map[string]string{"app": app}
	return p
}

// TestWatchFormsFromHistory: every watch form is served from the Store's
// history with kube-apiserver's cacher semantics. Given a Store at RV 100
// holding a (app=x) and b (app=y), and a change history made after the
// watch starts (or before, for a watch from an earlier RV), each form gets
// exactly the events kube-apiserver would send it: the events after its
// RV, converted for its selectors (an object entering them is ADDED,
// leaving them DELETED with its previous state at the event's RV).
func TestWatchFormsFromHistory(t *testing.T) {
	fastBookmarks(t, time.Hour)
	changes := func(t *testing.T, st *store.Store) {
		mustDo(t, st.Update(labeled("a", "101", "y"))) // a leaves app=x
		mustDo(t, st.Update(labeled("b", "102", "x"))) // b enters app=x
		mustDo(t, st.Add(labeled("c", "103", "x")))    // c is created in app=x
		mustDo(t, st.Update(labeled("c", "104", "x"))) // c stays in app=x
		mustDo(t, st.Delete(labeled("b", "105", "x"))) // b is deleted in app=x
		mustDo(t, st.Delete(labeled("a", "106", "y"))) // a is deleted outside app=x
	}
	all := []string{"MODIFIED a@101", "MODIFIED b@102", "ADDED c@103", "MODIFIED c@104", "DELETED b@105", "DELETED a@106"}
	for _, tc := range []struct {
		name string
		opts metav1.ListOptions
		// before: the changes are made before the watch starts.
		before bool
		want   []string
	}{{
		name: "from now (sendInitialEvents=false, resourceVersion 0)",
		opts: metav1.ListOptions{ResourceVersion: "0", SendInitialEvents: ptr.To(false), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
		want: all,
	}, {
		name: "from now (sendInitialEvents=false, consistent)",
		opts: metav1.ListOptions{SendInitialEvents: ptr.To(false), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
		want: all,
	}, {
		name:   "from a resourceVersion in the window",
		opts:   metav1.ListOptions{ResourceVersion: "102"},
		before: true,
		want:   all[2:],
	}, {
		name:   "from the window's floor",
		opts:   metav1.ListOptions{ResourceVersion: "100"},
		before: true,
		want:   all,
	}, {
		name: "from a resourceVersion the cache has not reached",
		opts: metav1.ListOptions{ResourceVersion: "103"},
		want: all[3:],
	}, {
		name: "label selector",
		opts: metav1.ListOptions{ResourceVersion: "100", LabelSelector: "app=x"},
		want: []string{"DELETED a@101", "ADDED b@102", "ADDED c@103", "MODIFIED c@104", "DELETED b@105"},
	}, {
		name: "one object by name",
		opts: metav1.ListOptions{ResourceVersion: "100", FieldSelector: "spec.nodeName=node-a,metadata.name=b"},
		want: []string{"MODIFIED b@102", "DELETED b@105"},
	}, {
		name: "one namespace",
		opts: metav1.ListOptions{ResourceVersion: "100", FieldSelector: "metadata.namespace=other,spec.nodeName=node-a"},
		want: nil,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
			c, cfg := testCache(t, up, labeled("a", "80", "x"), labeled("b", "90", "y"))
			st := c.resources[0].current.Load().store
			if tc.before {
				changes(t, st)
			}
			opts := tc.opts
			if opts.FieldSelector == "" {
				opts.FieldSelector = "spec.nodeName=node-a"
			}
			w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").Watch(context.Background(), opts)
			mustDo(t, err)
			defer w.Stop()
			if !tc.before {
				// The watch is registered once its response has begun.
				waitWatchers(t, c, 1)
				changes(t, st)
			}
			got := summarize(next(t, w, len(tc.want)))
			select {
			case ev := <-w.ResultChan():
				t.Errorf("unexpected event %v after %v", summarize([]watch.Event{ev}), got)
			case <-time.After(200 * time.Millisecond):
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// waitWatchers waits until the cache serves n watches.
func waitWatchers(t *testing.T, c *Cache, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a wait, not a bound
	for c.resources[0].watchers.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d watches served, want %d", c.resources[0].watchers.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWatchLeavingSelectorGetsPreviousState: an object that leaves a
// watch's label selector is sent as DELETED with the state the watch last
// saw (its old labels), at the resourceVersion of the change, as
// kube-apiserver's cacher sends it.
func TestWatchLeavingSelectorGetsPreviousState(t *testing.T) {
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, labeled("a", "80", "x"))
	st := c.resources[0].current.Load().store
	mustDo(t, st.Update(labeled("a", "101", "y")))
	w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").Watch(context.Background(),
		metav1.ListOptions{ResourceVersion: "100", LabelSelector: "app=x", FieldSelector: "spec.nodeName=node-a"})
	mustDo(t, err)
	defer w.Stop()
	ev := next(t, w, 1)[0]
	p := ev.Object.(*corev1.Pod)
	if ev.Type != watch.Deleted || p.ResourceVersion != "101" || p.Labels["app"] != "x" {
		t.Errorf("got %s %s@%s labels %v, want DELETED a@101 with app=x", ev.Type, p.Name, p.ResourceVersion, p.Labels)
	}
}

// TestWatchWindow: a watch from a resourceVersion N is served from the
// cache's event window when the window holds every event after N, and
// otherwise forwarded as it came, with the caller's credentials, to
// kube-apiserver, which may still serve N (a watch from
// resourceVersion=1 on a young cluster replays its history) or answers
// 410 itself: the client gets kube-apiserver's stream, and the forward is
// counted with reason resource-version-too-old. Given a Store listed at RV
// 100 whose window, bounded to two events, holds 103 and 104 (floor 102):
// a watch from 1 or 101, with or without bookmarks or sendInitialEvents=
// false, is forwarded; one from 102 (the floor), 103, or an RV the Store
// has not reached is served from the window; the watches that start from
// a state (a watch-list from 101, legacy watches from "0" or unset) are
// served from the cache whatever the window holds.
func TestWatchWindow(t *testing.T) {
	upstream := []watch.Event{{Type: watch.Added, Object: wlPod("a", "50")}, {Type: watch.Added, Object: wlPod("b", "60")}}
	for _, tc := range []struct {
		name      string
		opts      metav1.ListOptions
		forwarded bool
		// after are changes made once a served watch has started.
		after func(t *testing.T, st *store.Store)
		want  []string
	}{{
		name:      "resourceVersion=1",
		opts:      metav1.ListOptions{ResourceVersion: "1"},
		forwarded: true,
	}, {
		name:      "just before the window's floor",
		opts:      metav1.ListOptions{ResourceVersion: "101"},
		forwarded: true,
	}, {
		name:      "before the floor, with bookmarks",
		opts:      metav1.ListOptions{ResourceVersion: "101", AllowWatchBookmarks: true},
		forwarded: true,
	}, {
		name: "before the floor, sendInitialEvents=false",
		opts: metav1.ListOptions{ResourceVersion: "101", SendInitialEvents: ptr.To(false),
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
		forwarded: true,
	}, {
		name: "the window's floor",
		opts: metav1.ListOptions{ResourceVersion: "102"},
		want: []string{"MODIFIED a@103", "MODIFIED a@104"},
	}, {
		name: "inside the window",
		opts: metav1.ListOptions{ResourceVersion: "103"},
		want: []string{"MODIFIED a@104"},
	}, {
		// It starts at once and skips the events up to its RV, as
		// kube-apiserver's watch does.
		name: "an RV the Store has not reached",
		opts: metav1.ListOptions{ResourceVersion: "106"},
		after: func(t *testing.T, st *store.Store) {
			mustDo(t, st.Update(wlPod("a", "105")))
			mustDo(t, st.Update(wlPod("a", "107")))
		},
		want: []string{"MODIFIED a@107"},
	}, {
		name: "watch-list from before the floor",
		opts: watchListOptions("101"),
		want: []string{"ADDED a@104", "BOOKMARK @104 initial-events-end"},
	}, {
		name: "legacy watch from 0",
		opts: metav1.ListOptions{ResourceVersion: "0"},
		want: []string{"ADDED a@104"},
	}, {
		name: "legacy watch, resourceVersion unset",
		want: []string{"ADDED a@104"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { writeWatch(t, w, r, upstream...) }}
			c, cfg := testCache(t, up, wlPod("a", "80"))
			st := c.resources[0].current.Load().store
			st.SetHistoryBounds(2, 0)
			for rv := 101; rv <= 104; rv++ {
				mustDo(t, st.Update(wlPod("a", fmt.Sprint(rv))))
			}
			if h := st.History(); h.Events != 2 || h.Floor != 102 {
				t.Fatalf("window %+v, want 2 events above 102", h)
			}
			opts := tc.opts
			if opts.FieldSelector == "" {
				opts.FieldSelector = "spec.nodeName=node-a"
			}
			w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").Watch(context.Background(), opts)
			mustDo(t, err)
			defer w.Stop()
			var got []string
			if tc.forwarded {
				got = summarize(collect(t, w))
			} else {
				if tc.after != nil {
					waitWatchers(t, c, 1)
					tc.after(t, st)
				}
				got = summarize(next(t, w, len(tc.want)))
			}
			want := tc.want
			if tc.forwarded {
				want = summarize(upstream)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			reqs := up.got()
			counted := testutil.ToFloat64(c.metrics.requests.WithLabelValues("watch", "pods", "forwarded", reasonTooOld))
			if !tc.forwarded {
				if len(reqs) != 0 || counted != 0 {
					t.Errorf("%d requests reached the forwarder, %v counted as too old; want the cache to serve it", len(reqs), counted)
				}
				return
			}
			if len(reqs) != 1 {
				t.Fatalf("%d requests reached the forwarder, want the watch", len(reqs))
			}
			q := reqs[0].URL.Query()
			if q.Get("watch") != "true" || q.Get("resourceVersion") != opts.ResourceVersion || q.Has("timeoutSeconds") {
				t.Errorf("forwarded query %q, want the watch's own", reqs[0].URL.RawQuery)
			}
			if auth := reqs[0].Header.Get("Authorization"); auth != "Bearer token-a" {
				t.Errorf("forwarded with Authorization %q, want the caller's", auth)
			}
			if counted != 1 {
				t.Errorf("%v watches counted as forwarded for reason %s, want 1", counted, reasonTooOld)
			}
			if ended := testutil.ToFloat64(c.metrics.watchEnds.WithLabelValues("pods", endTooOld)); ended != 0 {
				t.Errorf("%v watches answered 410 by the cache, want none", ended)
			}
		})
	}
}

// TestWatchEndsOnRelist: when the Store relists (its own watch broke past
// repair), the watches it serves end without an ERROR event, as
// kube-apiserver's cacher ends its watchers; a client watching again from
// its last RV, now before the new window, is forwarded and gets
// kube-apiserver's answer (here the 410 it gives for a revision it no
// longer has, on which the client relists).
func TestWatchEndsOnRelist(t *testing.T) {
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) {
		writeWatch(t, w, r, watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired("too old resource version: 101 (150)").ErrStatus})
	}}
	c, cfg := testCache(t, up, wlPod("a", "80"))
	st := c.resources[0].current.Load().store
	client := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("")
	w, err := client.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "100", FieldSelector: "spec.nodeName=node-a"})
	mustDo(t, err)
	waitWatchers(t, c, 1)
	mustDo(t, st.Update(wlPod("a", "101")))
	mustDo(t, st.Replace([]any{wlPod("a", "150")}, "200"))
	// The event before the relist may or may not have been sent when
	// the relist ended the watch; the stream ends either way.
	if got := summarize(collect(t, w)); len(got) > 1 || (len(got) == 1 && got[0] != "MODIFIED a@101") {
		t.Errorf("events %v, want at most the one before the relist, then the end", got)
	}
	if n := len(up.got()); n != 0 {
		t.Fatalf("%d requests forwarded before the watch from the old window", n)
	}
	w, err = client.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "101", FieldSelector: "spec.nodeName=node-a"})
	mustDo(t, err)
	if got := summarize(collect(t, w)); !cmp.Equal(got, []string{"ERROR 410 Expired"}) {
		t.Errorf("events %v, want ERROR 410 Expired", got)
	}
	if n := len(up.got()); n != 1 {
		t.Errorf("%d requests forwarded, want the watch from before the new window", n)
	}
}

// TestWatchTimeout: timeoutSeconds ends the stream, with a bookmark
// shortly before for a watch that accepts them (kube-apiserver sends one
// two seconds before the deadline).
func TestWatchTimeout(t *testing.T) {
	old := bookmarkBeforeTimeout
	bookmarkBeforeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { bookmarkBeforeTimeout = old })
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, wlPod("a", "80"))
	c.resources[0].current.Load().store.UpdateResourceVersion("120")
	start := time.Now()
	w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{
		ResourceVersion: "100", FieldSelector: "spec.nodeName=node-a", TimeoutSeconds: ptr.To[int64](1), AllowWatchBookmarks: true})
	mustDo(t, err)
	got := summarize(collect(t, w))
	if took := time.Since(start); took < 900*time.Millisecond || took > 3*time.Second {
		t.Errorf("the watch ended after %s, want about 1s", took)
	}
	if !cmp.Equal(got, []string{"BOOKMARK @120"}) {
		t.Errorf("events %v, want one bookmark at 120 before the timeout", got)
	}
}

// TestSlowWatcherEnded: given 10 watchers, one of which never reads its
// stream, when events far beyond what its connection buffers flow, then the
// one is ended once a write has waited watchWriteTimeout, the others get
// every event, and the writes of the stuck one hold no other back.
func TestSlowWatcherEnded(t *testing.T) {
	old := watchWriteTimeout
	// Long enough that a reader starved of CPU by a loaded machine (the
	// e2e suite runs beside the unit tests) is not taken for the stuck
	// one: it reads all the time, only slowly. The stuck one is ended
	// after it all the same.
	watchWriteTimeout = 5 * time.Second
	t.Cleanup(func() { watchWriteTimeout = old })
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, wlPod("a", "80"))
	st := c.resources[0].current.Load().store
	st.SetHistoryBounds(0, 64<<20) // every event stays in the window
	srv := h2Server(t, c, up, nil)
	q := url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-a"}, "resourceVersion": {"100"}}
	stuckReq, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/pods?"+q.Encode(), nil)
	stuckReq.Header.Set("Authorization", "Bearer token-a")
	stuck, err := srv.Client().Do(stuckReq)
	mustDo(t, err)
	defer stuck.Body.Close()

	cfg.Host = srv.URL
	cfg.TLSClientConfig.Insecure = true
	cfg.ContentType = runtime.ContentTypeProtobuf
	client := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("")
	var readers []watch.Interface
	for range 9 {
		w, err := client.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "100", FieldSelector: "spec.nodeName=node-a"})
		mustDo(t, err)
		defer w.Stop()
		readers = append(readers, w)
	}
	waitWatchers(t, c, 10)
	big := strings.Repeat("x", 32<<10)
	const events = 200 // 6.25 MiB, beyond the stuck stream's 4 MiB window
	go func() {
		for i := range events {
			p := wlPod("a", fmt.Sprint(101+i))
			p.Annotations["big"] = big
			if err := st.Update(p); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i, w := range readers {
		if n := len(next(t, w, events)); n != events {
			t.Fatalf("reader %d got %d events", i, n)
		}
	}
	waitWatchers(t, c, 9)
	if n, _ := io.Copy(io.Discard, stuck.Body); n >= int64(events*len(big)) {
		t.Errorf("the stuck client received all %d bytes, want its stream cut short", n)
	}
	if got := c.metrics.watchEnds.WithLabelValues("pods", endSlow); testutil.ToFloat64(got) != 1 {
		t.Errorf("watches ended as slow: %v, want 1", testutil.ToFloat64(got))
	}
}

// TestIdleWatchOutlivesWriteTimeout: a watch over HTTP/2 that has nothing
// to send for longer than the write timeout is not ended: the deadline
// bounds writes, not silences.
func TestIdleWatchOutlivesWriteTimeout(t *testing.T) {
	old := watchWriteTimeout
	watchWriteTimeout = 200 * time.Millisecond
	t.Cleanup(func() { watchWriteTimeout = old })
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, wlPod("a", "80"))
	srv := h2Server(t, c, up, nil)
	cfg.Host = srv.URL
	cfg.TLSClientConfig.Insecure = true
	w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("").Watch(context.Background(), watchListOptions("0"))
	mustDo(t, err)
	defer w.Stop()
	next(t, w, 2)
	st := c.resources[0].current.Load().store
	mustDo(t, st.Update(wlPod("a", "101")))
	next(t, w, 1)
	time.Sleep(4 * watchWriteTimeout)
	mustDo(t, st.Update(wlPod("a", "102")))
	if got := summarize(next(t, w, 1)); !cmp.Equal(got, []string{"MODIFIED a@102"}) {
		t.Errorf("after a silence: %v", got)
	}
}

// h2Server serves c over HTTP/2 with TLS, up as the forwarder; done, if
// not nil, gets a value as each request's handler returns.
func h2Server(t *testing.T, c *Cache, up http.Handler, done chan<- struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if done != nil {
			defer func() { done <- struct{}{} }()
		}
		info, _ := testInfoFactory.NewRequestInfo(req)
		req = req.WithContext(request.WithRequestInfo(req.Context(), info))
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(w, req)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestWatchWaitsForReopenedWatch: a watch that arrives while the cache's
// own watch is closed (between a relist and the next watch) waits, up to
// the wait timeout, for it to reopen, and is then served from the cache;
// if it stays closed, the watch is forwarded.
func TestWatchWaitsForReopenedWatch(t *testing.T) {
	for _, reopen := range []bool{true, false} {
		t.Run(fmt.Sprintf("reopen=%v", reopen), func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }}
			c, cfg := testCache(t, up, wlPod("a", "80"))
			inf := c.resources[0].current.Load()
			inf.watchState.Store(2 << 1) // closed
			if reopen {
				time.AfterFunc(100*time.Millisecond, func() { inf.watchState.Store(2<<1 | 1) })
			}
			req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion=100&fieldSelector=spec.nodeName%3Dnode-a", nil)
			req.Header.Set("Authorization", "Bearer token-a")
			resp, err := http.DefaultClient.Do(req)
			mustDo(t, err)
			resp.Body.Close()
			served := resp.StatusCode == http.StatusOK && len(up.got()) == 0
			if served != reopen {
				t.Errorf("status %d after %d upstream requests; want served from the cache: %v", resp.StatusCode, len(up.got()), reopen)
			}
		})
	}
}

// slowClient is a ResponseWriter that reads a watch slowly: each write of
// the served stream takes delay.
type slowClient struct {
	delay  time.Duration
	header http.Header
	mu     sync.Mutex
	body   bytes.Buffer
}

func (s *slowClient) Header() http.Header { return s.header }
func (s *slowClient) WriteHeader(int)     {}
func (s *slowClient) Flush()              {}

func (s *slowClient) Write(b []byte) (int, error) {
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body.Write(b)
}

// TestWatchBehindEndsAtTimeout: a watch that stays behind, every read of
// the window a full batch (5,000 events wait for a client that reads
// about 320 KB/s, some 6 s of them), still ends at its timeoutSeconds
// (1 s), as kube-apiserver's ends whatever its backlog, and still gets
// the bookmark due two seconds (here 0.5 s) before it, at the last event
// it had sent; the stream ends with whole events.
func TestWatchBehindEndsAtTimeout(t *testing.T) {
	old := bookmarkBeforeTimeout
	bookmarkBeforeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { bookmarkBeforeTimeout = old })
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, _ := testCache(t, up, wlPod("a", "80"))
	st := c.resources[0].current.Load().store
	st.SetHistoryBounds(0, 64<<20)
	const backlog = 5000
	for i := range backlog {
		mustDo(t, st.Update(wlPod("a", fmt.Sprint(101+i))))
	}
	q := url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-a"}, "resourceVersion": {"100"},
		"timeoutSeconds": {"1"}, "allowWatchBookmarks": {"true"}}
	req := httptest.NewRequest(http.MethodGet, "/api/v1/pods?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer token-a")
	info, _ := testInfoFactory.NewRequestInfo(req)
	req = req.WithContext(request.WithRequestInfo(req.Context(), info))
	client := &slowClient{delay: 100 * time.Millisecond, header: http.Header{}}
	start := time.Now()
	c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(client, req)
	if took := time.Since(start); took < 900*time.Millisecond || took > 3*time.Second {
		t.Errorf("the watch ended after %s, want about its 1s timeout", took)
	}
	if got := c.metrics.watchEnds.WithLabelValues("pods", endTimeout); testutil.ToFloat64(got) != 1 {
		t.Errorf("watches ended by their timeout: %v, want 1", testutil.ToFloat64(got))
	}
	dec := json.NewDecoder(&client.body)
	var events, bookmarks int
	var last string
	for {
		var ev struct {
			Type   string
			Object metav1.PartialObjectMetadata
		}
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("after %d events: %v", events, err)
		}
		rv := ev.Object.ResourceVersion
		if ev.Type == string(watch.Bookmark) {
			bookmarks++
			if rv != last {
				t.Errorf("bookmark at %s after the event at %s, want the RV of the last event sent", rv, last)
			}
			continue
		}
		events++
		last = rv
	}
	if events == 0 || events >= backlog {
		t.Errorf("%d of the %d events sent, want the watch ended behind", events, backlog)
	}
	if bookmarks != 1 {
		t.Errorf("%d bookmarks, want the one due before the timeout", bookmarks)
	}
}

// TestWatchBookmarkRepeatsLastEvent: a bookmark that falls due is sent
// whenever the RV is past the one the watch started from, even if it is
// the RV of the last event sent, as kube-apiserver's cacheWatcher sends
// it; a watch that started at the Store's RV gets none until it moves.
func TestWatchBookmarkRepeatsLastEvent(t *testing.T) {
	fastBookmarks(t, 200*time.Millisecond)
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, wlPod("a", "80"))
	st := c.resources[0].current.Load().store
	client := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("")
	w, err := client.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "100", FieldSelector: "spec.nodeName=node-a", AllowWatchBookmarks: true})
	mustDo(t, err)
	defer w.Stop()
	idle, err := client.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "101", FieldSelector: "spec.nodeName=node-a", AllowWatchBookmarks: true})
	mustDo(t, err)
	defer idle.Stop()
	waitWatchers(t, c, 2)
	mustDo(t, st.Update(wlPod("a", "101")))
	if got := summarize(next(t, w, 2)); !cmp.Equal(got, []string{"MODIFIED a@101", "BOOKMARK @101"}) {
		t.Errorf("events %v, want the event, then a bookmark at its RV", got)
	}
	select {
	case ev := <-idle.ResultChan():
		t.Errorf("a watch from the Store's RV got %v before the RV moved", summarize([]watch.Event{ev}))
	case <-time.After(600 * time.Millisecond):
	}
}

// TestWatchRVWentBack: when the Store's resourceVersion goes back (an
// event, or a list, older than it: the upstream's etcd was restored from
// a backup), the watches it serves end with 410 Expired, so that their
// clients relist instead of watching again from an RV the new history has
// not reached (which would skip every event up to it); the Store's RV
// follows the upstream's, so a watch from now gets the events after it.
func TestWatchRVWentBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		goBack func(st *store.Store) error
	}{
		{"an older event", func(st *store.Store) error { return st.Update(wlPod("a", "120")) }},
		{"an older list", func(st *store.Store) error { return st.Replace([]any{wlPod("a", "110")}, "120") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
			c, cfg := testCache(t, up, wlPod("a", "80"))
			st := c.resources[0].current.Load().store
			mustDo(t, st.Update(wlPod("a", "150")))
			client := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("")
			fromNow := metav1.ListOptions{ResourceVersion: "0", SendInitialEvents: ptr.To(false),
				ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, FieldSelector: "spec.nodeName=node-a"}
			w, err := client.Watch(context.Background(), fromNow)
			mustDo(t, err)
			waitWatchers(t, c, 1)
			mustDo(t, tc.goBack(st))
			if got := summarize(collect(t, w)); !cmp.Equal(got, []string{"ERROR 410 Expired"}) {
				t.Errorf("the watch from before got %v, want ERROR 410 Expired", got)
			}
			if rv := st.ResourceVersion(); rv != 120 {
				t.Errorf("the Store is at RV %d, want 120", rv)
			}
			if got := c.metrics.watchEnds.WithLabelValues("pods", endWentBack); testutil.ToFloat64(got) != 1 {
				t.Errorf("watches ended for the RV going back: %v, want 1", testutil.ToFloat64(got))
			}
			w, err = client.Watch(context.Background(), fromNow)
			mustDo(t, err)
			defer w.Stop()
			waitWatchers(t, c, 1)
			mustDo(t, st.Update(wlPod("a", "121")))
			if got := summarize(next(t, w, 1)); !cmp.Equal(got, []string{"MODIFIED a@121"}) {
				t.Errorf("a watch from now got %v, want MODIFIED a@121", got)
			}
		})
	}
}

// fakeListerWatcher hands out one watch.
type fakeListerWatcher struct{ w watch.Interface }

func (f fakeListerWatcher) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	return nil, errors.New("no list")
}

func (f fakeListerWatcher) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return f.w, nil
}

// TestInformerWatchRVWentBack: the informer's own watch passes events on
// while their RVs go forward, and turns the first object event whose RV
// is not after the one it started from, nor after the events' before it,
// into a 410 Expired ERROR for the reflector, which then relists; the
// watch counts as closed (kube_apicache_cache_upstream_watches 0) from
// then on. A watch-list's initial events, in key order, are not checked;
// its initial-events-end bookmark sets the RV to go forward from, even
// below the Store's (the relist after the RV went back).
func TestInformerWatchRVWentBack(t *testing.T) {
	bookmark := func(rv string, end bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
		if end {
			p.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		opts   metav1.ListOptions
		events []watch.Event
		want   []string
	}{{
		name: "watch from the Store's RV",
		opts: metav1.ListOptions{ResourceVersion: "100"},
		events: []watch.Event{{Type: watch.Modified, Object: wlPod("a", "101")}, {Type: watch.Bookmark, Object: bookmark("101", false)},
			{Type: watch.Modified, Object: wlPod("a", "90")}, {Type: watch.Modified, Object: wlPod("a", "102")}},
		want: []string{"MODIFIED a@101", "BOOKMARK @101", "ERROR 410 Expired"},
	}, {
		name:   "an event at the Store's RV",
		opts:   metav1.ListOptions{ResourceVersion: "100"},
		events: []watch.Event{{Type: watch.Added, Object: wlPod("b", "100")}},
		want:   []string{"ERROR 410 Expired"},
	}, {
		name: "watch-list",
		opts: metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
		events: []watch.Event{{Type: watch.Added, Object: wlPod("a", "95")}, {Type: watch.Added, Object: wlPod("b", "60")},
			{Type: watch.Bookmark, Object: bookmark("130", true)}, {Type: watch.Modified, Object: wlPod("a", "131")},
			{Type: watch.Modified, Object: wlPod("a", "125")}},
		want: []string{"ADDED a@95", "ADDED b@60", "BOOKMARK @130 initial-events-end", "MODIFIED a@131", "ERROR 410 Expired"},
	}, {
		// The informer's relist once the RV went back: the Store is
		// still at its old RV while the new initial events come.
		name: "watch-list below the Store's RV",
		opts: metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
		events: []watch.Event{{Type: watch.Added, Object: wlPod("a", "50")}, {Type: watch.Bookmark, Object: bookmark("60", true)},
			{Type: watch.Modified, Object: wlPod("a", "61")}, {Type: watch.Bookmark, Object: bookmark("70", false)},
			{Type: watch.Modified, Object: wlPod("a", "71")}},
		want: []string{"ADDED a@50", "BOOKMARK @60 initial-events-end", "MODIFIED a@61", "BOOKMARK @70", "MODIFIED a@71"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
			c, _ := testCache(t, up, wlPod("a", "80"))
			inf := c.resources[0].current.Load()
			fw := watch.NewFakeWithChanSize(len(tc.events), false)
			w, err := (&healthListerWatcher{lw: fakeListerWatcher{w: fw}, r: inf}).WatchWithContext(context.Background(), tc.opts)
			mustDo(t, err)
			defer w.Stop()
			if !c.Resources()[0].Watching {
				t.Errorf("the informer's watch is open, but its resource does not count it")
			}
			for _, ev := range tc.events {
				fw.Action(ev.Type, ev.Object)
			}
			// The upstream ends the watch after its events.
			fw.Stop()
			got := summarize(collect(t, w))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("events passed to the reflector (-want +got):\n%s", diff)
			}
			if c.Resources()[0].Watching {
				t.Errorf("the informer's watch ended, but its resource still counts it")
			}
		})
	}
}

// TestUpstreamWatchesMetric: kube_apicache_cache_upstream_watches is 1
// for a resource while its informer's watch is open upstream, and 0 while
// it is not (listing, retrying), whatever client watches it serves.
func TestUpstreamWatchesMetric(t *testing.T) {
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, _ := testCache(t, up, wlPod("a", "80"))
	reg := prometheus.NewPedanticRegistry()
	mustDo(t, c.metrics.register(reg))
	want := func(v int) string {
		return fmt.Sprintf(`# HELP kube_apicache_cache_upstream_watches %s
# TYPE kube_apicache_cache_upstream_watches gauge
kube_apicache_cache_upstream_watches{resource="pods"} %d
`, "Watches the cache holds open upstream for the resource: 1 while its informer's watch is open (its initial events included), 0 while it lists, retries or is idle. Every client watch of the resource served from the cache shares it.", v)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(1)), "kube_apicache_cache_upstream_watches"); err != nil {
		t.Errorf("while the watch is open: %v", err)
	}
	c.resources[0].current.Load().watchState.Store(2 << 1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0)), "kube_apicache_cache_upstream_watches"); err != nil {
		t.Errorf("while the watch is closed: %v", err)
	}
}

// discardClient is a ResponseWriter that reads a watch as fast as it is
// written, and keeps nothing.
type discardClient struct{ header http.Header }

func (d *discardClient) Header() http.Header         { return d.header }
func (d *discardClient) WriteHeader(int)             {}
func (d *discardClient) Flush()                      {}
func (d *discardClient) Write(b []byte) (int, error) { return len(b), nil }

// BenchmarkWatchEvent is the work a served watch does for each event it
// sends, once the object's encoding is cached (by the first watcher that
// sent it): the object's form for the watch's encoding and shape, framed
// into the stream; flushed every watchBatch events.
func BenchmarkWatchEvent(b *testing.B) {
	for _, tc := range []struct{ name, accept string }{
		{"json", "application/json"},
		{"protobuf", "application/vnd.kubernetes.protobuf"},
		{"metadata-json", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"},
		{"metadata-protobuf", "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			hc := newHandlerCache(b)
			req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=10&fieldSelector=spec.nodeName%3Dnode-a", nil)
			req.Header.Set("Authorization", "Bearer token")
			req.Header.Set("Accept", tc.accept)
			info, err := handlerInfoFactory.NewRequestInfo(req)
			if err != nil {
				b.Fatal(err)
			}
			p, reason := hc.classify(req, info)
			if p == nil {
				b.Fatalf("forwarded: %s", reason)
			}
			o, _, ok := hc.pods.store.Get("ns", "p1")
			if !ok {
				b.Fatal("no pod p1")
			}
			ww, err := newWatchWriter(&discardClient{header: http.Header{}}, p.media)
			if err != nil {
				b.Fatal(err)
			}
			ww.out.timeout = watchWriteTimeout
			if err := p.events.Prepare(o); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				ev, err := p.events.Object(o)
				if err != nil {
					b.Fatal(err)
				}
				if err := ww.event(watch.Modified, ev); err != nil {
					b.Fatal(err)
				}
				if i%watchBatch == watchBatch-1 {
					if err := ww.flushErr(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
