package cache

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/cache/store"
)

// TestHandlerRoutes: paths that RequestInfo parses but kube-apiserver has no
// route for are forwarded, never answered from a cluster-scoped store. In
// particular a cluster-scoped resource under /namespaces/<ns>/ would be
// authorized in <ns>, so a namespaced Role must not open the whole store.
func TestHandlerRoutes(t *testing.T) {
	reviewer := &stubReviewer{result: access.Result{Verdict: access.Allowed}}
	c, err := New(Config{NodeName: "node-a", RESTConfig: &rest.Config{}, Reviewer: reviewer, WaitTimeout: 100 * time.Millisecond,
		Resources: []ResourceSpec{{Resource: "namespaces"}, {Resource: "services"}}})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"namespaces": "Namespace", "services": "Service"}
	for _, res := range c.resources {
		r := testInformer(res)
		gvr := corev1.SchemeGroupVersion.WithResource(r.spec.Resource)
		namespaced := r.spec.Resource != "namespaces"
		r.gvr, r.gvk, r.namespaced, r.builtin = gvr, gvr.GroupVersion().WithKind(kinds[r.spec.Resource]), namespaced, true
		r.fields = store.FieldLabelsFor(gvr.GroupResource(), true, namespaced)
		r.store = store.NewStore(store.AttrsFor(r.fields, namespaced), r.prepare, nil)
		r.encoder = store.NewEncoder(r.gvk, true)
		r.ready.Store(true)
		r.watchState.Store(1<<1 | 1)
	}
	nsRes := c.byGR[schema.GroupResource{Resource: "namespaces"}].current.Load()
	if err := nsRes.store.Replace([]any{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a", ResourceVersion: "3"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-b", ResourceVersion: "4"}},
	}, "10"); err != nil {
		t.Fatal(err)
	}
	svcRes := c.byGR[schema.GroupResource{Resource: "services"}].current.Load()
	if err := svcRes.store.Replace([]any{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "s1", ResourceVersion: "5"}}}, "10"); err != nil {
		t.Fatal(err)
	}
	tc := &handlerCache{Cache: c, reviewer: reviewer}
	tc.handler = c.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(299) }),
		func(h http.Handler) http.Handler { return h })

	cases := []struct {
		path     string
		answered bool
	}{
		// Routes kube-apiserver serves.
		{"/api/v1/namespaces/tenant-a", true},
		{"/api/v1/namespaces/tenant-a/", true},
		{"/api/v1/namespaces", true},
		{"/api/v1/namespaces/tenant-a/services/s1", true},
		{"/api/v1/services", true},
		// Cluster-scoped resource under a namespace: no such route.
		{"/api/v1/namespaces/tenant-a/namespaces", false},
		{"/api/v1/namespaces/tenant-a/namespaces/tenant-b", false},
		{"/api/v1/namespaces/tenant-a/namespaces/tenant-a", false},
		// Namespaced object by name without its namespace: no such route.
		{"/api/v1/services/s1", false},
		// Leading slashes RequestInfo trims but kube-apiserver's routing
		// does not (its 404).
		{"//api/v1/namespaces", false},
		{"//api/v1/namespaces/tenant-a/services/s1", false},
	}
	for _, tt := range cases {
		t.Run(tt.path, func(t *testing.T) {
			got := tc.get(t, tt.path)
			if tt.answered && got.code != http.StatusOK {
				t.Fatalf("got %d %s, want an answer from the cache", got.code, got.body)
			}
			if !tt.answered && !got.forwarded() {
				t.Fatalf("got %d %s, want forwarded", got.code, got.body)
			}
		})
	}
}

// TestObserveWriteBarrier: which forwarded writes hold consistent reads back,
// and how.
func TestObserveWriteBarrier(t *testing.T) {
	podOn := func(node, rv string) string {
		return `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"` + rv +
			`"},"spec":{"nodeName":"` + node + `"}}`
	}
	podList := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"40"},"items":[` + podOn("node-a", "30") + `]}`
	emptyPods := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"40"},"items":[]}`
	emptyTable := `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"40"},"columnDefinitions":[{"name":"Name","type":"string"}],"rows":[]}`
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "30"}}
	cases := []struct {
		name        string
		method      string
		path        string
		code        int
		body        string
		contentType string
		wantRV      uint64
		wantUnknown bool
	}{
		{name: "a pod on this node", method: "POST", path: "/api/v1/namespaces/ns/pods", code: 201,
			body: podOn("node-a", "50"), wantRV: 50},
		{name: "a pod on another node cannot change a cached answer", method: "POST", path: "/api/v1/namespaces/ns/pods", code: 201,
			body: podOn("node-b", "51")},
		{name: "deletecollection answers with the list before the deletions", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: podList, wantUnknown: true},
		{name: "deletecollection in protobuf", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: protobufListBody(t, "v1", "PodList", &corev1.PodList{Items: []corev1.Pod{pod}}), contentType: runtime.ContentTypeProtobuf, wantUnknown: true},
		{name: "deletecollection as a Table", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: strings.Replace(emptyTable, `"rows":[]`, `"rows":[{"cells":["p"]}]`, 1), contentType: "application/json;as=Table;v=v1;g=meta.k8s.io", wantUnknown: true},
		// An empty answer deleted nothing: however the caller asked for it.
		{name: "deletecollection that deleted nothing", method: "DELETE", path: "/api/v1/namespaces/ns/pods?labelSelector=none", code: 200,
			body: emptyPods},
		{name: "deletecollection that deleted nothing, in YAML", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: "apiVersion: v1\nkind: PodList\nmetadata:\n  resourceVersion: \"40\"\nitems: []\n", contentType: "application/yaml"},
		{name: "deletecollection that deleted nothing, in protobuf", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: protobufListBody(t, "v1", "PodList", &corev1.PodList{}), contentType: runtime.ContentTypeProtobuf},
		{name: "deletecollection that deleted nothing, as metadata in protobuf", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body:        protobufListBody(t, "meta.k8s.io/v1", "PartialObjectMetadataList", &metav1.PartialObjectMetadataList{}),
			contentType: runtime.ContentTypeProtobuf + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"},
		{name: "deletecollection that deleted nothing, as a Table", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: emptyTable, contentType: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		// Anything but an empty collection of the resource deleted
		// something, as far as the agent knows.
		{name: "deletecollection answered with an empty list of another kind", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: strings.Replace(emptyPods, "PodList", "ServiceList", 1), wantUnknown: true},
		{name: "deletecollection answered with a Status", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: `{"kind":"Status","apiVersion":"v1","status":"Success"}`, wantUnknown: true},
		{name: "deletecollection in CBOR", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: "\xd9\xd9\xf7\xa0", contentType: "application/cbor", wantUnknown: true},
		{name: "deletecollection with an unreadable answer", method: "DELETE", path: "/api/v1/namespaces/ns/pods", code: 200,
			body: emptyPods[:20], wantUnknown: true},
		{name: "a 5xx may follow a committed write", method: "POST", path: "/api/v1/namespaces/ns/pods", code: 504,
			body: `{"kind":"Status","apiVersion":"v1","status":"Failure","code":504}`, wantUnknown: true},
		{name: "a refused write changes nothing", method: "POST", path: "/api/v1/namespaces/ns/pods", code: 409,
			body: `{"kind":"Status","apiVersion":"v1","status":"Failure","code":409}`},
		{name: "a dry run changes nothing", method: "POST", path: "/api/v1/namespaces/ns/pods?dryRun=All", code: 201,
			body: podOn("node-a", "")},
		{name: "a status write of a pod on this node", method: "PUT", path: "/api/v1/namespaces/ns/pods/p/status", code: 200,
			body: podOn("node-a", "52"), wantRV: 52},
		// A pod's backend answers a proxied request; the tenant chooses
		// the body, so it must never move the barrier.
		{name: "a proxied answer naming the largest RV", method: "POST", path: "/api/v1/namespaces/ns/pods/p/proxy/x", code: 200,
			body: podOn("node-a", "18446744073709551615")},
		{name: "a proxied answer with a bare RV", method: "PUT", path: "/api/v1/namespaces/ns/pods/p:8080/proxy/", code: 200,
			body: `{"metadata":{"resourceVersion":"18446744073709551615"}}`},
		{name: "a proxied 5xx is not a failed write", method: "POST", path: "/api/v1/namespaces/ns/pods/p/proxy", code: 502,
			body: `boom`},
		{name: "an answer of another kind is not the written object", method: "PUT", path: "/api/v1/namespaces/ns/pods/p", code: 200,
			body: `{"kind":"Service","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"60"}}`},
		{name: "an answer for another object is not the written object", method: "PUT", path: "/api/v1/namespaces/ns/pods/q", code: 200,
			body: podOn("node-a", "61")},
		{name: "an answer in another namespace is not the written object", method: "POST", path: "/api/v1/namespaces/other/pods", code: 201,
			body: podOn("node-a", "62")},
		{name: "a delete answered with a Status has an unknown RV", method: "DELETE", path: "/api/v1/namespaces/ns/pods/p", code: 200,
			body: `{"kind":"Status","apiVersion":"v1","status":"Success"}`, wantUnknown: true},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			tc := newHandlerCache(t)
			resp := forwardedWrite(t, tt.path, tt.method, tt.body)
			resp.StatusCode = tt.code
			if tt.contentType != "" {
				resp.Header.Set("Content-Type", tt.contentType)
			}
			tc.ObserveWrite(resp)
			rv, unknown, _ := tc.pods.barrierState(time.Now(), time.Second)
			if rv != tt.wantRV || unknown != tt.wantUnknown {
				t.Errorf("barrier (rv %d, unknown write %v), want (%d, %v)", rv, unknown, tt.wantRV, tt.wantUnknown)
			}
		})
	}
}

// protobufListBody returns list in kube-apiserver's protobuf envelope, as
// apiVersion and kind.
func protobufListBody(t *testing.T, apiVersion, kind string, list interface{ Marshal() ([]byte, error) }) string {
	t.Helper()
	raw, err := list.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	env, err := (&runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: raw}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return string(store.ProtobufMagic) + string(env)
}

// TestEmptyDeleteCollection: with --cache-consistent-reads=local-writes, a
// deletecollection that deleted nothing (a caller deleting what is not
// there, in a loop) leaves consistent reads of the resource to the cache,
// whatever form the caller asked its answer in; one that deleted
// something sends them upstream for the wait timeout.
func TestEmptyDeleteCollection(t *testing.T) {
	tc := newHandlerCache(t)
	tc.cfg.ConsistentReads = ConsistentLocalWrites
	forwarded := func() float64 {
		return testutil.ToFloat64(tc.metrics.requests.WithLabelValues("get", "services", "forwarded", reasonRecentWrite))
	}
	for _, answer := range []struct{ contentType, body string }{
		{"application/json", `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"40"},"items":[]}`},
		{"application/yaml", "apiVersion: v1\nitems: []\nkind: ServiceList\nmetadata:\n  resourceVersion: \"40\"\n"},
		{"application/json;as=Table;v=v1;g=meta.k8s.io", `{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"40"},"columnDefinitions":[],"rows":[]}`},
	} {
		resp := forwardedWrite(t, "/api/v1/namespaces/ns/services?labelSelector=app%3Dnone", "DELETE", answer.body)
		resp.Header.Set("Content-Type", answer.contentType)
		tc.ObserveWrite(resp)
		if got := tc.get(t, "/api/v1/namespaces/ns/services/s1"); got.code != 200 {
			t.Errorf("consistent read after a deletecollection that deleted nothing (%s): %d, want 200 from the cache", answer.contentType, got.code)
		}
	}
	if n := forwarded(); n != 0 {
		t.Errorf("%v consistent reads forwarded as %s, want none", n, reasonRecentWrite)
	}
	tc.ObserveWrite(forwardedWrite(t, "/api/v1/namespaces/ns/services", "DELETE",
		`{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"40"},"items":[{"metadata":{"name":"s9","namespace":"ns","resourceVersion":"30"}}]}`))
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1"); !got.forwarded() || forwarded() != 1 {
		t.Errorf("consistent read after a deletecollection that deleted something: %d, want forwarded as %s", got.code, reasonRecentWrite)
	}
}

// TestBarrierNeverReached: a barrier the cache does not reach holds one
// read back for the wait timeout; later reads go upstream at once, and
// after maxBarrierAge the barrier is dropped and reads are answered again.
func TestBarrierNeverReached(t *testing.T) {
	tc := newHandlerCache(t)
	// The read-your-writes barrier of --cache-consistent-reads=local-writes.
	tc.cfg.ConsistentReads = ConsistentLocalWrites
	now := time.Now()
	tc.now = func() time.Time { return now }
	tc.ObserveWrite(forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PUT",
		`{"kind":"Service","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns","resourceVersion":"1000"}}`))
	if rv, _, _ := tc.services.barrierState(now, time.Second); rv != 1000 {
		t.Fatalf("barrier %d, want 1000", rv)
	}
	start := time.Now()
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() || time.Since(start) < 100*time.Millisecond {
		t.Errorf("first read behind the barrier: %d after %v, want forwarded after the 100ms wait", got.code, time.Since(start))
	}
	now = now.Add(time.Second)
	start = time.Now()
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() || time.Since(start) >= 100*time.Millisecond {
		t.Errorf("read behind an overdue barrier: %d after %v, want forwarded at once", got.code, time.Since(start))
	}
	now = now.Add(maxBarrierAge)
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); got.code != 200 {
		t.Errorf("read after the barrier expired: %d, want 200 from the cache", got.code)
	}
	if rv, _, _ := tc.services.barrierState(now, time.Second); rv != 10 {
		t.Errorf("barrier after expiry %d, want the cache's RV 10", rv)
	}
}

// TestObserveWriteBudget: write answers are read within an agent-wide byte
// budget; past it a write counts as one of unknown RV, and the budget is
// returned once the answer has been read.
func TestObserveWriteBudget(t *testing.T) {
	tc := newHandlerCache(t)
	tc.observing.Store(maxObservedBytes - 10)
	body := `{"kind":"Service","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns","resourceVersion":"30"}}`
	tc.ObserveWrite(forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PUT", body))
	if rv, unknown, _ := tc.services.barrierState(time.Now(), time.Second); rv != 0 || !unknown {
		t.Errorf("over budget: barrier (%d, unknown %v), want (0, true)", rv, unknown)
	}
	tc.observing.Store(0)
	resp := forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PUT", body)
	resp.ContentLength = int64(len(body))
	tc.ObserveWrite(resp)
	if rv, _, _ := tc.services.barrierState(time.Now(), time.Second); rv != 30 {
		t.Errorf("within budget: barrier %d, want 30", rv)
	}
	if n := tc.observing.Load(); n != 0 {
		t.Errorf("%d bytes still reserved after the write was observed", n)
	}
}

// TestWithoutScopeTerms: requirements the cached scope guarantees are
// dropped from list predicates; everything else is kept as it was.
func TestWithoutScopeTerms(t *testing.T) {
	scope := map[string]string{"spec.nodeName": "node-a"}
	cases := []struct{ in, want string }{
		{"spec.nodeName=node-a", ""},
		{"spec.nodeName==node-a", ""},
		{"spec.nodeName=node-a,status.phase=Running", "status.phase=Running"},
		{"spec.nodeName=node-a,spec.nodeName!=node-a", "spec.nodeName!=node-a"},
		{"status.phase!=Failed", "status.phase!=Failed"},
		{"spec.nodeName=node-b", "spec.nodeName=node-b"},
	}
	for _, tt := range cases {
		sel, err := fields.ParseSelector(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		got := withoutScopeTerms(sel, scope)
		if got.String() != tt.want {
			t.Errorf("%q: got %q, want %q", tt.in, got.String(), tt.want)
		}
		if tt.want == "" && !got.Empty() {
			t.Errorf("%q: selector not empty", tt.in)
		}
	}
	sel := fields.ParseSelectorOrDie("spec.nodeName=node-a")
	if got := withoutScopeTerms(sel, nil); got.String() != sel.String() {
		t.Errorf("without a scope: got %q", got.String())
	}
}
