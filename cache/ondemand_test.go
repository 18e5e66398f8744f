package cache

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/cache/store"
)

// fakeAPIServer serves discovery, lists and watches of core v1 services
// and namespaces (one object each, at RV 5), and counts the lists and the
// watches open.
type fakeAPIServer struct {
	*httptest.Server
	lists   atomic.Int64
	watches atomic.Int64
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	t.Helper()
	f := &fakeAPIServer{}
	kinds := map[string]string{"services": "Service", "namespaces": "Namespace"}
	item := func(resource string) string {
		ns := `"namespace":"default",`
		if resource == "namespaces" {
			ns = ""
		}
		return `{"kind":"` + kinds[resource] + `","apiVersion":"v1","metadata":{"name":"x",` + ns + `"resourceVersion":"5"}}`
	}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api":
			fmt.Fprint(w, `{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}`)
			return
		case "/apis":
			fmt.Fprint(w, `{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`)
			return
		case "/api/v1":
			fmt.Fprint(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"v1","resources":[`+
				`{"name":"services","namespaced":true,"kind":"Service","verbs":["get","list","watch"]},`+
				`{"name":"namespaces","namespaced":false,"kind":"Namespace","verbs":["get","list","watch"]}]}`)
			return
		}
		resource := strings.TrimPrefix(r.URL.Path, "/api/v1/")
		if kinds[resource] == "" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		if q.Get("watch") != "true" {
			f.lists.Add(1)
			fmt.Fprintf(w, `{"kind":"%sList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[%s]}`, kinds[resource], item(resource))
			return
		}
		f.watches.Add(1)
		defer f.watches.Add(-1)
		if q.Get("sendInitialEvents") == "true" {
			f.lists.Add(1)
			fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", item(resource))
			fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"%s","apiVersion":"v1","metadata":{"resourceVersion":"5","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", kinds[resource])
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(f.Close)
	return f
}

// onDemandCache is a running on-demand Cache of services and namespaces
// against a fake kube-apiserver, with a fake clock.
type onDemandCache struct {
	*Cache
	api      *fakeAPIServer
	clock    *testingclock.FakeClock
	reviewer *stubReviewer
	reg      *prometheus.Registry
	handler  http.Handler
}

func newOnDemandCache(t *testing.T, pinned ...ResourceSpec) *onDemandCache {
	t.Helper()
	tc := &onDemandCache{api: newFakeAPIServer(t), clock: testingclock.NewFakeClock(time.Now()),
		reviewer: &stubReviewer{result: access.Result{Verdict: access.Allowed}}, reg: prometheus.NewRegistry()}
	c, err := New(Config{NodeName: "node-a", RESTConfig: &rest.Config{Host: tc.api.URL}, Reviewer: tc.reviewer,
		Resources: []ResourceSpec{{Resource: "services"}, {Resource: "namespaces"}}, OnDemand: true, Pinned: pinned,
		IdleTimeout: time.Minute, Registerer: tc.reg})
	if err != nil {
		t.Fatal(err)
	}
	c.clock = tc.clock
	tc.Cache = c
	tc.handler = c.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) }),
		func(h http.Handler) http.Handler { return h })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return tc
}

func (tc *onDemandCache) get(t *testing.T, path, token string) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	info, err := handlerInfoFactory.NewRequestInfo(req)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	tc.handler.ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
	return rec.Code
}

func (tc *onDemandCache) state(t *testing.T, resource string) ResourceState {
	t.Helper()
	for _, st := range tc.Resources() {
		if st.Resource == resource {
			return st
		}
	}
	t.Fatalf("no resource %s", resource)
	return ResourceState{}
}

func (tc *onDemandCache) waitState(t *testing.T, resource, want string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return tc.state(t, resource).State == want, nil
	})
	if err != nil {
		t.Fatalf("%s: state %+v, want %s", resource, tc.state(t, resource), want)
	}
}

func (tc *onDemandCache) outcomes(resource, outcome, reason string) float64 {
	return testutil.ToFloat64(tc.metrics.requests.WithLabelValues("list", resource, outcome, reason))
}

// TestOnDemandLifecycle: given an on-demand cache with nothing pinned,
// nothing is discovered, listed or watched until a read the cache would
// answer comes from an allowed caller; reads without a token, with
// impersonation, of a plain watch, or from a denied caller start nothing.
// The first allowed read is forwarded and starts the informer; once it has
// synced, reads are answered from the cache. After the idle timeout
// without reads the informer stops (its watch ends, its Store is closed)
// and the next read starts a new one, from a new list.
func TestOnDemandLifecycle(t *testing.T) {
	tc := newOnDemandCache(t)
	const list = "/api/v1/services?resourceVersion=0"
	if st := tc.state(t, "services"); st.State != StateIdle || st.Pinned {
		t.Fatalf("services at start: %+v, want idle and not pinned", st)
	}

	// Reads that would not start anything.
	if code := tc.get(t, list, ""); code != 299 {
		t.Errorf("read without a token: %d, want forwarded", code)
	}
	if code := tc.get(t, "/api/v1/services?watch=true&resourceVersion=5", "t"); code != 299 {
		t.Errorf("plain watch: %d, want forwarded", code)
	}
	tc.reviewer.result = access.Result{Verdict: access.Denied, Err: apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", fmt.Errorf("no"))}
	if code := tc.get(t, list, "t"); code != http.StatusForbidden {
		t.Errorf("denied caller: %d, want 403", code)
	}
	tc.reviewer.result = access.Result{Verdict: access.Forward, Reason: "token-rejected"}
	if code := tc.get(t, list, "t"); code != 299 {
		t.Errorf("rejected token: %d, want forwarded", code)
	}
	time.Sleep(100 * time.Millisecond)
	if n, st := tc.api.lists.Load()+tc.api.watches.Load(), tc.state(t, "services"); n != 0 || st.State != StateIdle || tc.Informers() != 0 {
		t.Fatalf("after reads no allowed caller made: %d lists and watches, services %s, %d informers; want none", n, st.State, tc.Informers())
	}

	// An allowed caller's read is forwarded and starts the informer.
	tc.reviewer.result = access.Result{Verdict: access.Allowed}
	if code := tc.get(t, list, "t"); code != 299 {
		t.Errorf("first allowed read: %d, want forwarded", code)
	}
	if n := tc.outcomes("services", "forwarded", reasonIdle); n != 1 {
		t.Errorf("reads forwarded as idle: %v, want 1", n)
	}
	tc.waitState(t, "services", StateSynced)
	if code := tc.get(t, list, "t"); code != http.StatusOK {
		t.Errorf("read once synced: %d, want answered by the cache", code)
	}
	if st := tc.state(t, "namespaces"); st.State != StateIdle {
		t.Errorf("namespaces, never read: %s, want idle", st.State)
	}
	if got := tc.Informers(); got != 1 {
		t.Errorf("informers: %d, want 1", got)
	}
	first := tc.byGR[schema.GroupResource{Resource: "services"}].current.Load()

	// Reads keep it running; the idle timeout after the last one stops it.
	tc.clock.Step(50 * time.Second)
	if code := tc.get(t, list, "t"); code != http.StatusOK {
		t.Errorf("read before the idle timeout: %d, want answered by the cache", code)
	}
	tc.clock.Step(50 * time.Second)
	time.Sleep(100 * time.Millisecond)
	if st := tc.state(t, "services"); st.State != StateSynced {
		t.Fatalf("60s after start, 50s after the last read: %s, want synced", st.State)
	}
	tc.clock.Step(11 * time.Second)
	tc.waitState(t, "services", StateIdle)
	if !first.stopped.Load() || first.store.WaitForResourceVersion(context.Background(), 1000) != store.ErrStoreClosed {
		t.Errorf("stopped informer: not marked stopped, or its Store still open")
	}
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return tc.api.watches.Load() == 0, nil
	})
	if err != nil {
		t.Errorf("watches open after the idle stop: %d", tc.api.watches.Load())
	}
	if starts, stops := testutil.ToFloat64(tc.metrics.starts.WithLabelValues("services")), testutil.ToFloat64(tc.metrics.stops.WithLabelValues("services")); starts != 1 || stops != 1 {
		t.Errorf("starts %v stops %v, want 1 and 1", starts, stops)
	}

	// The next allowed read starts a new informer, from a new list.
	lists := tc.api.lists.Load()
	if code := tc.get(t, list, "t"); code != 299 {
		t.Errorf("read after the idle stop: %d, want forwarded", code)
	}
	tc.waitState(t, "services", StateSynced)
	if tc.api.lists.Load() <= lists {
		t.Errorf("restarted informer did not list again")
	}
	if again := tc.byGR[schema.GroupResource{Resource: "services"}].current.Load(); again == first || again.store == first.store {
		t.Errorf("restarted informer reuses the stopped one's Store")
	}
}

// TestOnDemandPinned: a pinned resource's informer starts without any read
// and never stops for idleness; the others stay idle.
func TestOnDemandPinned(t *testing.T) {
	tc := newOnDemandCache(t, ResourceSpec{Resource: "namespaces"})
	tc.waitState(t, "namespaces", StateSynced)
	if st := tc.state(t, "namespaces"); !st.Pinned {
		t.Errorf("namespaces not reported pinned")
	}
	tc.clock.Step(time.Hour)
	time.Sleep(100 * time.Millisecond)
	if st := tc.state(t, "namespaces"); st.State != StateSynced {
		t.Errorf("pinned resource after an idle hour: %s, want synced", st.State)
	}
	if st := tc.state(t, "services"); st.State != StateIdle {
		t.Errorf("services: %s, want idle", st.State)
	}
	if got := testutil.CollectAndCount(tc.reg, "kube_apicache_cache_state"); got != 6 {
		t.Errorf("kube_apicache_cache_state series: %d, want 3 per resource", got)
	}
	if got, err := testutil.GatherAndCount(tc.reg, "kube_apicache_cache_informers"); err != nil || got != 1 {
		t.Errorf("kube_apicache_cache_informers series: %d %v", got, err)
	}
}

// TestWouldServe: which reads of an idle resource may start its informer.
func TestWouldServe(t *testing.T) {
	c, err := New(Config{NodeName: "node-a", RESTConfig: &rest.Config{}, OnDemand: true,
		Resources: []ResourceSpec{{Resource: "pods"}, {Resource: "nodes"}, {Resource: "services"}, {Group: "example.com", Resource: "widgets", Version: "v1"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path   string
		header map[string]string
		want   bool
	}{
		{path: "/api/v1/services", want: true},
		{path: "/api/v1/namespaces/ns/services/s?resourceVersion=0", want: true},
		{path: "/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", want: true},
		{path: "/api/v1/services?watch=true&resourceVersion=5", want: false},
		// A legacy watch from "" gets initial events: a watch-list.
		{path: "/api/v1/services?watch=true", want: true},
		{path: "/api/v1/services?continue=abc", want: false},
		{path: "/api/v1/services?resourceVersion=5&resourceVersionMatch=Exact", want: false},
		{path: "/api/v1/services?pretty=true", want: false},
		{path: "/api/v1/services", header: map[string]string{"Impersonate-User": "x"}, want: false},
		{path: "/api/v1/services", header: map[string]string{"Authorization": ""}, want: false},
		{path: "/api/v1/services", header: map[string]string{"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"}, want: false},
		// Pods and Nodes: only this node's.
		{path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a", want: true},
		{path: "/api/v1/pods", want: false},
		{path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-b", want: false},
		{path: "/api/v1/namespaces/ns/pods/p", want: true},
		{path: "/api/v1/nodes/node-a", want: true},
		{path: "/api/v1/nodes/node-b", want: false},
		{path: "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a", want: true},
		// A custom resource at its configured version only.
		{path: "/apis/example.com/v1/widgets", want: true},
		{path: "/apis/example.com/v2/widgets", want: false},
		{path: "/apis/example.com/v1/widgets", header: map[string]string{"Accept": "application/vnd.kubernetes.protobuf"}, want: false},
	} {
		req := httptest.NewRequest(http.MethodGet, tt.path, nil)
		req.Header.Set("Authorization", "Bearer t")
		for k, v := range tt.header {
			if v == "" {
				req.Header.Del(k)
				continue
			}
			req.Header.Set(k, v)
		}
		info, err := handlerInfoFactory.NewRequestInfo(req)
		if err != nil {
			t.Fatal(err)
		}
		res := c.byGR[schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}]
		if got := c.wouldServe(req, info, res); got != tt.want {
			t.Errorf("%s %v: would serve %v, want %v", tt.path, tt.header, got, tt.want)
		}
	}
}

// TestBarrierOutlivesInformer: a write relayed before an informer stopped
// (or while the resource was idle) still holds consistent reads back on
// the next informer, whose first list may be older than the write.
func TestBarrierOutlivesInformer(t *testing.T) {
	tc := newHandlerCache(t)
	// The read-your-writes barrier of --cache-consistent-reads=local-writes.
	tc.cfg.ConsistentReads = ConsistentLocalWrites
	tc.services.resource.noteWrite(20, true, time.Now(), time.Now())
	old := tc.services
	old.stop()
	// A new informer, synced from a list at RV 10.
	r := testInformer(old.resource)
	r.gvr, r.gvk, r.namespaced, r.builtin, r.fields = old.gvr, old.gvk, true, true, old.fields
	r.store = store.NewStore(store.AttrsFor(r.fields, true), r.prepare, r.changed(nil))
	r.encoder = store.NewEncoder(r.gvk, true)
	r.ready.Store(true)
	r.watchState.Store(1<<1 | 1)
	if err := r.store.Replace(nil, "10"); err != nil {
		t.Fatal(err)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() {
		t.Errorf("consistent read behind a write relayed before the restart: %d, want forwarded", got.code)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/services?resourceVersion=0"); got.forwarded() {
		t.Errorf("RV=0 read: forwarded, want answered by the new informer")
	}
}
