package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/cache/store"
)

// fakeReviewer allows every request and records the verbs it reviewed.
type fakeReviewer struct {
	mu    sync.Mutex
	verbs []string
}

func (f *fakeReviewer) Review(_ *http.Request, info *request.RequestInfo) access.Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.verbs = append(f.verbs, info.Verb)
	return access.Result{Verdict: access.Allowed}
}

// fakeUpstream stands for the forwarder: it records the requests it gets
// and answers them with respond.
type fakeUpstream struct {
	mu       sync.Mutex
	requests []*http.Request
	respond  func(w http.ResponseWriter, r *http.Request)
}

func (f *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r)
	f.mu.Unlock()
	f.respond(w, r)
}

func (f *fakeUpstream) got() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.requests...)
}

var testInfoFactory = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

// testCache returns a Cache holding pods (scoped to node-a) at RV 100,
// served over TLS-less HTTP with up as the forwarder, and a client
// configuration for it.
func testCache(t *testing.T, up http.Handler, pods ...*corev1.Pod) (*Cache, *rest.Config) {
	t.Helper()
	c, err := New(Config{NodeName: "node-a", Resources: []ResourceSpec{{Resource: "pods"}}, RESTConfig: &rest.Config{},
		Reviewer: &fakeReviewer{}, WaitTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := testInformer(c.resources[0])
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	r.gvr, r.gvk, r.namespaced, r.builtin = gvr, gvr.GroupVersion().WithKind("Pod"), true, true
	r.fields = store.FieldLabelsFor(gvr.GroupResource(), true, true)
	r.encoder = store.NewEncoder(r.gvk, true)
	r.store = store.NewStore(store.AttrsFor(r.fields, true), r.prepare, nil)
	items := make([]any, 0, len(pods))
	for _, p := range pods {
		items = append(items, p.DeepCopy())
	}
	if err := r.store.Replace(items, "100"); err != nil {
		t.Fatal(err)
	}
	r.watchState.Store(1<<1 | 1)
	r.ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		info, err := testInfoFactory.NewRequestInfo(req)
		if err != nil {
			t.Error(err)
			return
		}
		req = req.WithContext(request.WithRequestInfo(req.Context(), info))
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return c, &rest.Config{Host: srv.URL, BearerToken: "token-a"}
}

func wlPod(name, rv string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: rv, Labels: map[string]string{"app": name},
			Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}
}

// writeWatch answers a watch with events, encoded as kube-apiserver does
// for the request's media type, then ends the stream.
func writeWatch(t *testing.T, w http.ResponseWriter, r *http.Request, events ...watch.Event) {
	ct := runtime.ContentTypeJSON
	if bytes.Contains([]byte(r.Header.Get("Accept")), []byte("protobuf")) {
		ct = runtime.ContentTypeProtobuf
	}
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), ct)
	if ct == runtime.ContentTypeProtobuf {
		w.Header().Set("Content-Type", ct+";stream=watch")
	} else {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(http.StatusOK)
	enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer)
	embedded := scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	for _, ev := range events {
		var buf bytes.Buffer
		if err := embedded.Encode(ev.Object, &buf); err != nil {
			t.Error(err)
			return
		}
		if err := enc.Encode(&metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: buf.Bytes()}}); err != nil {
			return
		}
	}
}

func watchListOptions(rv string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: "spec.nodeName=node-a", ResourceVersion: rv,
		SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true}
}

// collect reads events until the watch ends.
func collect(t *testing.T, w watch.Interface) []watch.Event {
	t.Helper()
	var out []watch.Event
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-timeout:
			w.Stop()
			t.Fatal("watch did not end")
		}
	}
}

func summarize(evs []watch.Event) []string {
	var out []string
	for _, ev := range evs {
		s := string(ev.Type)
		switch o := ev.Object.(type) {
		case *metav1.Status:
			s += " " + strconv.Itoa(int(o.Code)) + " " + string(o.Reason)
		default:
			if m, ok := o.(metav1.Object); ok {
				s += " " + m.GetName() + "@" + m.GetResourceVersion()
				if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					s += " initial-events-end"
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// TestWatchListFromCache: a client-go watch-list gets the cached objects
// as ADDED events, the initial-events-end bookmark at the cache's RV, and
// then the Store's events and a periodic bookmark, all from the cache:
// nothing goes upstream; in JSON and in protobuf.
func TestWatchListFromCache(t *testing.T) {
	fastBookmarks(t, 200*time.Millisecond)
	for _, ct := range []string{runtime.ContentTypeJSON, runtime.ContentTypeProtobuf} {
		t.Run(ct, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
			c, cfg := testCache(t, up, wlPod("b", "90"), wlPod("a", "80"))
			cfg.ContentType = ct
			client := kubernetes.NewForConfigOrDie(cfg)
			w, err := client.CoreV1().Pods("").Watch(context.Background(), watchListOptions(""))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			st := c.resources[0].current.Load().store
			got := summarize(next(t, w, 3))
			mustDo(t, st.Update(wlPod("b", "101")))
			st.UpdateResourceVersion("102")
			got = append(got, summarize(next(t, w, 2))...)
			want := []string{"ADDED a@80", "ADDED b@90", "BOOKMARK @100 initial-events-end", "MODIFIED b@101", "BOOKMARK @102"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLegacyWatchWithoutBookmarks: a legacy watch from "0" that asks for no
// bookmarks (sendInitialEvents is defaulted on) gets the ADDED events and
// the Store's events, and no BOOKMARK at all, as from kube-apiserver. With
// allowWatchBookmarks it gets the initial-events-end bookmark.
func TestLegacyWatchWithoutBookmarks(t *testing.T) {
	for _, bookmarks := range []bool{false, true} {
		t.Run(strconv.FormatBool(bookmarks), func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
			c, cfg := testCache(t, up, wlPod("a", "80"))
			client := kubernetes.NewForConfigOrDie(cfg)
			w, err := client.CoreV1().Pods("").Watch(context.Background(), metav1.ListOptions{
				FieldSelector: "spec.nodeName=node-a", ResourceVersion: "0", AllowWatchBookmarks: bookmarks})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			want := []string{"ADDED a@80", "MODIFIED a@101"}
			if bookmarks {
				want = []string{"ADDED a@80", "BOOKMARK @100 initial-events-end", "MODIFIED a@101"}
			}
			got := summarize(next(t, w, len(want)-1))
			mustDo(t, c.resources[0].current.Load().store.Update(wlPod("a", "101")))
			got = append(got, summarize(next(t, w, 1))...)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

type errForTest string

func (e errForTest) Error() string { return string(e) }

// TestWatchForwarded: the watches the cache does not answer go upstream
// unchanged: a watch-list from a resourceVersion the cache does not reach
// in time, a scope the cache does not hold, and the deprecated path form
// of a watch of one object.
func TestWatchForwarded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		path  string
		query url.Values
	}{
		{"resourceVersion too new", "/api/v1/pods", url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-a"},
			"sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}, "resourceVersion": {"500"}}},
		{"other node", "/api/v1/pods", url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-b"},
			"sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}},
		{"named object by path", "/api/v1/watch/namespaces/ns/pods/a", url.Values{"fieldSelector": {"spec.nodeName=node-a"},
			"sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }}
			_, cfg := testCache(t, up, wlPod("a", "80"))
			req, _ := http.NewRequest(http.MethodGet, cfg.Host+tc.path+"?"+tc.query.Encode(), nil)
			req.Header.Set("Authorization", "Bearer token-a")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusTeapot || len(up.got()) != 1 {
				t.Fatalf("status %d after %d upstream requests, want it forwarded", resp.StatusCode, len(up.got()))
			}
			if got := up.got()[0].URL.RawQuery; got != tc.query.Encode() {
				t.Errorf("forwarded query %q, want %q unchanged", got, tc.query.Encode())
			}
		})
	}
}

// TestWatchListEndsWithContext: a watch served from the cache ends when its
// request's context does (the agent drains, or the client leaves).
func TestWatchListEndsWithContext(t *testing.T) {
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, _ := testCache(t, up, wlPod("a", "80"))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/api/v1/pods?"+url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-a"},
		"sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}.Encode(), nil).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer token-a")
	info, _ := testInfoFactory.NewRequestInfo(req)
	req = req.WithContext(request.WithRequestInfo(req.Context(), info))
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(rec, req)
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch-list did not end with its context")
	}
	if n := bytes.Count(rec.Body.Bytes(), []byte("\n")); n != 2 {
		t.Errorf("got %d events before the end, want 2 (ADDED, BOOKMARK):\n%s", n, rec.Body.String())
	}
}

// TestWatchListSlowReader: a client that opens a protobuf watch-list over
// HTTP/2 and never reads its initial events has its stream ended once a
// write has waited initialEventsWriteTimeout, so the handler, and the
// snapshot it holds, does not stay behind.
func TestWatchListSlowReader(t *testing.T) {
	old := initialEventsWriteTimeout
	initialEventsWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { initialEventsWriteTimeout = old })

	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	big := strings.Repeat("x", 16<<10)
	var pods []*corev1.Pod
	for i := range 1000 {
		p := wlPod(fmt.Sprintf("p%04d", i), "50")
		p.Annotations["big"] = big
		pods = append(pods, p)
	}
	c, _ := testCache(t, up, pods...)
	done := make(chan struct{}, 1)
	srv := h2Server(t, c, up, done)

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/pods?"+url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=node-a"},
		"sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}.Encode(), nil)
	req.Header.Set("Authorization", "Bearer token-a")
	req.Header.Set("Accept", runtime.ContentTypeProtobuf)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Fatalf("got %s %d, want HTTP/2 200", resp.Proto, resp.StatusCode)
	}
	// 16 MiB of initial events, more than the client's 4 MiB stream
	// window: the handler blocks on a write the client never reads.
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch-list handler is still writing to a client that reads nothing")
	}
	if n, _ := io.Copy(io.Discard, resp.Body); n >= int64(len(pods)*len(big)) {
		t.Errorf("the client received all %d bytes, want the stream cut short", n)
	}
}

// TestMetadataFromCache: metadata-only get, list and watch-list are
// answered with kube-apiserver's shapes, read by client-go's metadata
// client; JSON lists match the serializer's encoding of the whole list.
func TestMetadataFromCache(t *testing.T) {
	up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL) }}
	c, cfg := testCache(t, up, wlPod("b", "90"), wlPod("a", "80"))
	mc := metadata.NewForConfigOrDie(cfg).Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	ctx := context.Background()

	got, err := mc.Namespace("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The metadata client's decoder drops kind and apiVersion; the JSON
	// check below sees them.
	want := &metav1.PartialObjectMetadata{ObjectMeta: wlPod("a", "80").ObjectMeta}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}
	list, err := mc.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a", LabelSelector: "app=b", ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "b" || list.ResourceVersion != "100" {
		t.Errorf("list = %+v, want b at 100", list)
	}
	w, err := mc.Watch(ctx, watchListOptions("0"))
	if err != nil {
		t.Fatal(err)
	}
	evs := next(t, w, 3)
	mustDo(t, c.resources[0].current.Load().store.Update(wlPod("b", "101")))
	evs = append(evs, next(t, w, 1)...)
	w.Stop()
	if diff := cmp.Diff([]string{"ADDED a@80", "ADDED b@90", "BOOKMARK @100 initial-events-end", "MODIFIED b@101"}, summarize(evs)); diff != "" {
		t.Errorf("watch-list (-want +got):\n%s", diff)
	}
	for _, ev := range evs {
		if _, ok := ev.Object.(*metav1.PartialObjectMetadata); !ok {
			t.Errorf("%s object is %T, want PartialObjectMetadata", ev.Type, ev.Object)
		}
	}

	// The JSON get is the serializer's encoding of the PartialObjectMetadata.
	req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/api/v1/namespaces/ns/pods/a", nil)
	req.Header.Set("Authorization", "Bearer token-a")
	req.Header.Set("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want.SetGroupVersionKind(store.MetadataGVK)
	if refBytes, _ := json.Marshal(want); !bytes.Equal(bytes.TrimSpace(raw), refBytes) || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("JSON get: %s %s, want %s", resp.Header.Get("Content-Type"), raw, refBytes)
	}

	// The JSON list is the serializer's encoding of the whole list.
	res := c.resources[0].current.Load()
	for _, n := range []int{0, 2} {
		objs, rv := res.store.Snapshot(store.Predicate{})
		objs = objs[:n]
		list, err := res.encoder.MetadataList(store.MediaJSON, objs, rv)
		if err != nil {
			t.Fatal(err)
		}
		b := list.Bytes()
		ref := &metav1.PartialObjectMetadataList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatUint(rv, 10)}}
		ref.SetGroupVersionKind(store.MetadataListGVK)
		for _, o := range objs {
			obj, err := o.Decoded()
			if err != nil {
				t.Fatal(err)
			}
			pm, _ := store.AsPartialObjectMetadata(obj)
			ref.Items = append(ref.Items, *pm)
		}
		refBytes, err := json.Marshal(ref)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.TrimSpace(b), refBytes) {
			t.Errorf("%d items: got\n%s\nwant\n%s", n, b, refBytes)
		}
	}
}

// TestNegotiateTransform: which Accept headers the cache answers, in
// which shape, and which it forwards.
func TestNegotiateTransform(t *testing.T) {
	const (
		metaJSON  = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		metaListP = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
		tableV1   = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
	)
	for _, tc := range []struct {
		accept     string
		builtin    bool
		verb       string
		wantMedia  store.MediaType
		wantAs     transform
		wantReason string
	}{
		{metaJSON, true, "get", store.MediaJSON, asMetadata, ""},
		{metaJSON, false, "watch", store.MediaJSON, asMetadata, ""},
		{metaJSON, true, "list", 0, 0, reasonTransform},
		{metaListP, false, "list", store.MediaProtobuf, asMetadata, ""},
		{metaListP, true, "get", 0, 0, reasonTransform},
		{tableV1, false, "list", store.MediaJSON, asTable, ""},
		{tableV1, true, "list", 0, 0, reasonTableBuiltin},
		{tableV1, false, "watch", 0, 0, reasonTransform},
		{"application/json;as=Table;v=v1beta1;g=meta.k8s.io", false, "get", 0, 0, reasonTransform},
		{"application/yaml;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", true, "get", 0, 0, reasonMediaType},
		{"application/json;as=Pod;g=;v=v1", true, "get", 0, 0, reasonMediaType},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Accept", tc.accept)
		m, as, reason := negotiateShape(r, tc.builtin, tc.verb)
		if m != tc.wantMedia || as != tc.wantAs || reason != tc.wantReason {
			t.Errorf("%s (builtin %v, %s) = %v, %v, %q; want %v, %v, %q", tc.accept, tc.builtin, tc.verb, m, as, reason, tc.wantMedia, tc.wantAs, tc.wantReason)
		}
	}
}
