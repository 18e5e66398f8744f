package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/cache/store"
)

// stubReviewer returns a fixed result and counts its calls.
type stubReviewer struct {
	result access.Result
	calls  atomic.Int64
}

func (f *stubReviewer) Review(*http.Request, *request.RequestInfo) access.Result {
	f.calls.Add(1)
	return f.result
}

// testInformer makes a running informer of r, to be filled by hand.
func testInformer(r *resource) *informer {
	inf := newInformer(r)
	// Nothing is written behind the tests' backs: kube-apiserver's state
	// is the Store's, at its resourceVersion.
	inf.prober = &prober{list: func(context.Context) probeResult {
		return probeResult{rv: inf.store.ResourceVersion()}
	}}
	r.current.Store(inf)
	return inf
}

var handlerInfoFactory = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

// handlerCache is a Cache whose resources are filled by hand instead of by
// watches: pods of node-a and all services.
type handlerCache struct {
	*Cache
	pods, services *informer
	reviewer       *stubReviewer
	forwarded      []string
	handler        http.Handler
}

func newHandlerCache(t testing.TB) *handlerCache {
	t.Helper()
	tc := &handlerCache{reviewer: &stubReviewer{result: access.Result{Verdict: access.Allowed}}}
	c, err := New(Config{NodeName: "node-a", RESTConfig: &rest.Config{}, Reviewer: tc.reviewer, WaitTimeout: 100 * time.Millisecond,
		Resources: []ResourceSpec{{Resource: "pods"}, {Resource: "services"}}})
	if err != nil {
		t.Fatal(err)
	}
	tc.Cache = c
	for _, res := range c.resources {
		r := testInformer(res)
		gvr := corev1.SchemeGroupVersion.WithResource(r.spec.Resource)
		kind := map[string]string{"pods": "Pod", "services": "Service"}[r.spec.Resource]
		r.gvr, r.gvk, r.namespaced, r.builtin = gvr, gvr.GroupVersion().WithKind(kind), true, true
		r.fields = store.FieldLabelsFor(gvr.GroupResource(), true, true)
		r.store = store.NewStore(store.AttrsFor(r.fields, true), r.prepare, r.changed(nil))
		r.encoder = store.NewEncoder(r.gvk, true)
		r.ready.Store(true)
		r.watchState.Store(1<<1 | 1)
	}
	tc.pods, tc.services = c.byGR[schema.GroupResource{Resource: "pods"}].current.Load(), c.byGR[schema.GroupResource{Resource: "services"}].current.Load()
	pod := func(ns, name, rv string, restart corev1.RestartPolicy) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: "node-a", RestartPolicy: restart}}
	}
	if err := tc.pods.store.Replace([]any{pod("ns", "p1", "3", corev1.RestartPolicyAlways), pod("ns", "p2", "4", corev1.RestartPolicyNever),
		pod("other", "p3", "5", corev1.RestartPolicyAlways)}, "10"); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s1", ResourceVersion: "6"}}
	if err := tc.services.store.Replace([]any{svc}, "10"); err != nil {
		t.Fatal(err)
	}
	forward := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(299)
	})
	tc.handler = c.Handler(forward, func(h http.Handler) http.Handler { return h })
	return tc
}

type handlerResult struct {
	code        int
	contentType string
	body        []byte
}

func (r handlerResult) forwarded() bool { return r.code == 299 }

func (tc *handlerCache) get(t *testing.T, path string, header ...string) handlerResult {
	t.Helper()
	return tc.getFrom(t, "", path, header...)
}

// getFrom is get from the client address remote (host:port); empty for
// httptest's.
func (tc *handlerCache) getFrom(t *testing.T, remote, path string, header ...string) handlerResult {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if remote != "" {
		req.RemoteAddr = remote
	}
	req.Header.Set("Authorization", "Bearer token")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	info, err := handlerInfoFactory.NewRequestInfo(req)
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(request.WithRequestInfo(req.Context(), info))
	rec := httptest.NewRecorder()
	tc.handler.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Body)
	return handlerResult{code: rec.Code, contentType: rec.Header().Get("Content-Type"), body: b}
}

func itemNames(t *testing.T, b []byte) []string {
	t.Helper()
	var l struct {
		Metadata metav1.ListMeta `json:"metadata"`
		Items    []metav1.PartialObjectMetadata
	}
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	var names []string
	for _, it := range l.Items {
		names = append(names, it.Namespace+"/"+it.Name)
	}
	return names
}

func decodeStatus(t *testing.T, b []byte) metav1.Status {
	t.Helper()
	var s metav1.Status
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return s
}

// TestHandlerCoverage: only requests whose whole answer the cache holds are
// answered; everything else goes upstream unchanged.
func TestHandlerCoverage(t *testing.T) {
	tc := newHandlerCache(t)
	cases := []struct {
		name      string
		path      string
		header    []string
		wantNames []string // nil: forwarded
	}{
		{name: "this node's pods, all namespaces", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0",
			wantNames: []string{"ns/p1", "ns/p2", "other/p3"}},
		{name: "this node's pods in a namespace, by label", path: "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dnode-a&labelSelector=app%3Dp2",
			wantNames: []string{"ns/p2"}},
		{name: "this node's pods by another field", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a,spec.restartPolicy%3DNever",
			wantNames: []string{"ns/p2"}},
		{name: "limit with RV=0 gives the whole list", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0&limit=1",
			wantNames: []string{"ns/p1", "ns/p2", "other/p3"}},
		{name: "limit above the count", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=3",
			wantNames: []string{"ns/p1", "ns/p2", "other/p3"}},
		{name: "paginated consistent list", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=2"},
		{name: "namespace-wide pods", path: "/api/v1/namespaces/ns/pods"},
		{name: "another node's pods", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-b"},
		{name: "a selector that allows any node", path: "/api/v1/pods?fieldSelector=spec.nodeName!%3Dnode-b"},
		{name: "Exact", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=10&resourceVersionMatch=Exact"},
		{name: "legacy paginated RV", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=10&limit=5"},
		{name: "continue", path: "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&continue=abc"},
		{name: "subresource", path: "/api/v1/namespaces/ns/pods/p1/status"},
		{name: "uncached resource", path: "/api/v1/namespaces/ns/configmaps"},
		{name: "impersonation", path: "/api/v1/namespaces/ns/services", header: []string{"Impersonate-User", "admin"}},
		{name: "no token", path: "/api/v1/namespaces/ns/services", header: []string{"Authorization", ""}},
		{name: "YAML", path: "/api/v1/namespaces/ns/services", header: []string{"Accept", "application/yaml"}},
		{name: "pretty", path: "/api/v1/namespaces/ns/services?pretty=true"},
		{name: "curl indents", path: "/api/v1/namespaces/ns/services", header: []string{"User-Agent", "curl/8"}},
		{name: "unknown parameter", path: "/api/v1/namespaces/ns/services?shardSelector=x"},
		{name: "services", path: "/api/v1/services", wantNames: []string{"ns/s1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := tc.get(t, c.path, c.header...)
			if c.wantNames == nil {
				if !got.forwarded() {
					t.Fatalf("answered %d %s, want forwarded", got.code, got.body)
				}
				return
			}
			if got.code != http.StatusOK {
				t.Fatalf("code %d %s", got.code, got.body)
			}
			if names := itemNames(t, got.body); !slices.Equal(names, c.wantNames) {
				t.Errorf("items %v, want %v", names, c.wantNames)
			}
		})
	}
}

// TestHandlerGet: gets of cached objects are answered; a miss is a 404 only
// where the cache's scope holds every object of the name.
func TestHandlerGet(t *testing.T) {
	tc := newHandlerCache(t)
	got := tc.get(t, "/api/v1/namespaces/ns/pods/p1")
	var pod corev1.Pod
	if err := json.Unmarshal(got.body, &pod); got.code != 200 || err != nil || pod.Name != "p1" || pod.Kind != "Pod" || pod.APIVersion != "v1" {
		t.Errorf("get p1: %d %s", got.code, got.body)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/pods/elsewhere"); !got.forwarded() {
		t.Errorf("get of a pod the node's cache cannot vouch for: %d %s, want forwarded", got.code, got.body)
	}
	got = tc.get(t, "/api/v1/namespaces/ns/services/missing")
	st := decodeStatus(t, got.body)
	want := apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, "missing").ErrStatus
	if got.code != 404 || st.Message != want.Message || st.Reason != metav1.StatusReasonNotFound || st.Details == nil ||
		st.Details.Name != "missing" || st.Details.Kind != "services" || st.Kind != "Status" {
		t.Errorf("missing service: %d %s", got.code, got.body)
	}
	got = tc.get(t, "/api/v1/namespaces/ns/services/s1", "Accept", "application/vnd.kubernetes.protobuf")
	if got.code != 200 || got.contentType != runtime.ContentTypeProtobuf || !bytes.HasPrefix(got.body, store.ProtobufMagic) {
		t.Errorf("protobuf get: %d %q %q", got.code, got.contentType, got.body)
	}
}

// TestHandlerErrors: unparsable selectors get kube-apiserver's 400 after
// authorization; field labels the cache does not know are forwarded, never
// refused; a denied caller gets the reviewer's 403; a caller the reviewer
// cannot vouch for is forwarded.
func TestHandlerErrors(t *testing.T) {
	tc := newHandlerCache(t)
	for path, msg := range map[string]string{
		"/api/v1/namespaces/ns/services?labelSelector=a+in+(b":  "unable to parse requirement",
		"/api/v1/namespaces/ns/services?fieldSelector=nonsense": "invalid selector",
	} {
		got := tc.get(t, path)
		if st := decodeStatus(t, got.body); got.code != 400 || st.Reason != metav1.StatusReasonBadRequest || !strings.Contains(st.Message, msg) {
			t.Errorf("%s: %d %s, want 400 containing %q", path, got.code, got.body, msg)
		}
	}
	for _, path := range []string{
		"/api/v1/namespaces/ns/services?fieldSelector=spec.bogus%3D1",
		"/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a,spec.bogus%3D1",
	} {
		if got := tc.get(t, path); !got.forwarded() {
			t.Errorf("%s: %d %s, want forwarded", path, got.code, got.body)
		}
	}

	tc.reviewer.result = access.Result{Verdict: access.Denied,
		Err: apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", nil)}
	got := tc.get(t, "/api/v1/namespaces/ns/services?fieldSelector=nonsense")
	if got.code != 403 {
		t.Errorf("denied caller with a bad selector: %d %s, want 403 first", got.code, got.body)
	}
	tc.reviewer.result = access.Result{Verdict: access.Forward, Reason: access.ReasonTokenRejected}
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() {
		t.Errorf("rejected token: %d, want forwarded", got.code)
	}
	calls := tc.reviewer.calls.Load()
	tc.get(t, "/api/v1/namespaces/ns/configmaps")
	if tc.reviewer.calls.Load() != calls {
		t.Errorf("an uncovered request was reviewed")
	}
}

// TestHandlerResourceVersion: RV=N waits (bounded) for the cache; a
// consistent read waits for the writes this agent forwarded.
func TestHandlerResourceVersion(t *testing.T) {
	tc := newHandlerCache(t)
	// The read-your-writes barrier of --cache-consistent-reads=local-writes.
	tc.cfg.ConsistentReads = ConsistentLocalWrites
	if got := tc.get(t, "/api/v1/namespaces/ns/services?resourceVersion=12&resourceVersionMatch=NotOlderThan"); !got.forwarded() {
		t.Errorf("RV ahead of the cache: %d, want forwarded after the wait", got.code)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		tc.services.store.UpdateResourceVersion("12")
	}()
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1?resourceVersion=12"); got.code != 200 {
		t.Errorf("RV reached during the wait: %d %s", got.code, got.body)
	}

	// A write forwarded for services returned RV 20.
	tc.ObserveWrite(forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PUT", `{"kind":"Service","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns","resourceVersion":"20"}}`))
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1"); !got.forwarded() {
		t.Errorf("consistent read before the cache saw the write: %d, want forwarded", got.code)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1?resourceVersion=0"); got.code != 200 {
		t.Errorf("RV=0 read does not wait for writes: %d", got.code)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dnode-a"); got.code != 200 {
		t.Errorf("another resource's consistent read: %d", got.code)
	}
	// A read already waited for RV 20 in vain: later reads do not wait
	// for it again while the cache is behind.
	start := time.Now()
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1"); !got.forwarded() || time.Since(start) >= 100*time.Millisecond {
		t.Errorf("consistent read behind an overdue barrier: %d after %v, want forwarded at once", got.code, time.Since(start))
	}
	// Another write (RV 21) is waited for; the cache reaches it meanwhile.
	tc.ObserveWrite(forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PUT", `{"kind":"Service","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns","resourceVersion":"21"}}`))
	go func() {
		time.Sleep(20 * time.Millisecond)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s1", ResourceVersion: "21", Labels: map[string]string{"v": "2"}}}
		_ = tc.services.store.Update(svc)
	}()
	got := tc.get(t, "/api/v1/namespaces/ns/services/s1")
	var svc corev1.Service
	if err := json.Unmarshal(got.body, &svc); got.code != 200 || err != nil || svc.ResourceVersion != "21" {
		t.Errorf("consistent read after the cache caught up: %d %s", got.code, got.body)
	}

	// An unhealthy watch sends consistent reads upstream.
	tc.services.watchState.Store(2 << 1)
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() {
		t.Errorf("consistent read with the watch down: %d, want forwarded", got.code)
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/services?resourceVersion=0"); got.code != 200 {
		t.Errorf("RV=0 read with the watch down: %d", got.code)
	}
}

func forwardedWrite(t *testing.T, path, method, body string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	info, err := handlerInfoFactory.NewRequestInfo(req)
	if err != nil {
		t.Fatal(err)
	}
	req = req.WithContext(request.WithRequestInfo(context.Background(), info))
	return &http.Response{StatusCode: 200, Request: req, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: -1}
}

// TestObserveWriteKeepsBody: reading a write's RV leaves the body intact for
// the client, in JSON and protobuf.
func TestObserveWriteKeepsBody(t *testing.T) {
	tc := newHandlerCache(t)
	body := `{"kind":"Service","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns","resourceVersion":"33"}}`
	resp := forwardedWrite(t, "/api/v1/namespaces/ns/services", "POST", body)
	tc.ObserveWrite(resp)
	got, _ := io.ReadAll(resp.Body)
	if string(got) != body {
		t.Errorf("body after observing: %q", got)
	}
	if rv, _, _ := tc.services.barrierState(time.Now(), time.Second); rv != 33 {
		t.Errorf("barrier %d, want 33", rv)
	}

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: "ns", ResourceVersion: "44"}}
	svc.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Service"))
	st := store.NewStore(nil, nil, nil)
	if err := st.Add(svc); err != nil {
		t.Fatal(err)
	}
	o, _, _ := st.Get("ns", "s1")
	b, err := tc.services.encoder.Object(store.MediaProtobuf, o)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_ = b.WriteAll(&buf)
	resp = forwardedWrite(t, "/api/v1/namespaces/ns/services/s1", "PATCH", buf.String())
	resp.Header.Set("Content-Type", runtime.ContentTypeProtobuf)
	tc.ObserveWrite(resp)
	if rv, _, _ := tc.services.barrierState(time.Now(), time.Second); rv != 44 {
		t.Errorf("barrier after a protobuf write %d, want 44", rv)
	}
}

// TestHandlerForwardConsistentReads: with ConsistentForward, reads
// with resourceVersion unset go upstream and are never reviewed; RV=0
// reads are still answered.
func TestHandlerForwardConsistentReads(t *testing.T) {
	tc := newHandlerCache(t)
	tc.cfg.ConsistentReads = ConsistentForward
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1"); !got.forwarded() || tc.reviewer.calls.Load() != 0 {
		t.Errorf("consistent read: %d (reviews %d), want forwarded unreviewed", got.code, tc.reviewer.calls.Load())
	}
	if got := tc.get(t, "/api/v1/namespaces/ns/services/s1?resourceVersion=0"); got.code != 200 {
		t.Errorf("RV=0 read: %d", got.code)
	}
}
