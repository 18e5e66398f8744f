package cache

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// serveRaw sends a GET through tc's handler and returns the recorder, so
// that headers and the undecoded body can be checked.
func (tc *handlerCache) serveRaw(t *testing.T, path string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer token")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	info, err := handlerInfoFactory.NewRequestInfo(req)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	tc.handler.ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body.Bytes())
	}
	return rec
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fillLargePods replaces the pods with n pods of about 1 KiB each, on
// node-a, at resourceVersion rv.
func fillLargePods(t *testing.T, tc *handlerCache, n int, rv string) {
	t.Helper()
	var items []any
	for i := range n {
		items = append(items, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%04d", i), ResourceVersion: fmt.Sprint(100 + i),
				Annotations: map[string]string{"note": strings.Repeat(fmt.Sprintf("%04d", i), 256)}},
			Spec: corev1.PodSpec{NodeName: "node-a"},
		})
	}
	if err := tc.pods.store.Replace(items, rv); err != nil {
		t.Fatal(err)
	}
}

// TestListCompression: lists over 128 KiB are gzipped for clients that
// accept gzip, as kube-apiserver does, with the same bytes once decoded;
// smaller lists and other clients get the plain body.
func TestListCompression(t *testing.T) {
	const podList = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0"
	tc := newHandlerCache(t)
	fillLargePods(t, tc, 200, "1000")
	for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
		t.Run(accept, func(t *testing.T) {
			plain := tc.serveRaw(t, podList, "Accept", accept)
			if ce := plain.Header().Get("Content-Encoding"); ce != "" {
				t.Fatalf("Content-Encoding %q without Accept-Encoding", ce)
			}
			if plain.Body.Len() <= gzipThreshold {
				t.Fatalf("list of %d bytes is too small for this test", plain.Body.Len())
			}
			for _, ae := range []string{"gzip", "deflate, gzip", "br,gzip ,zstd"} {
				got := tc.serveRaw(t, podList, "Accept", accept, "Accept-Encoding", ae)
				if ce, vary := got.Header().Get("Content-Encoding"), got.Header().Get("Vary"); ce != "gzip" || vary != "Accept-Encoding" {
					t.Errorf("Accept-Encoding %q: Content-Encoding %q, Vary %q; want gzip, Accept-Encoding", ae, ce, vary)
					continue
				}
				if got.Body.Len() >= plain.Body.Len()/2 {
					t.Errorf("Accept-Encoding %q: %d compressed bytes for %d plain", ae, got.Body.Len(), plain.Body.Len())
				}
				if !bytes.Equal(gunzip(t, got.Body.Bytes()), plain.Body.Bytes()) {
					t.Errorf("Accept-Encoding %q: decompressed body differs from the plain one", ae)
				}
			}
			// kube-apiserver compresses only for a bare gzip token.
			for _, ae := range []string{"deflate", "gzip;q=0", "x-gzip"} {
				if got := tc.serveRaw(t, podList, "Accept", accept, "Accept-Encoding", ae); got.Header().Get("Content-Encoding") != "" {
					t.Errorf("Accept-Encoding %q: compressed, want plain", ae)
				}
			}
		})
	}
	t.Run("small list", func(t *testing.T) {
		got := tc.serveRaw(t, "/api/v1/services?resourceVersion=0", "Accept-Encoding", "gzip")
		if ce := got.Header().Get("Content-Encoding"); ce != "" {
			t.Errorf("list of %d bytes: Content-Encoding %q, want none under %d bytes", got.Body.Len(), ce, gzipThreshold)
		}
	})
}

// TestCompressedListReuse: a compressed list is reused only while a list
// selects the very same objects at the same resourceVersion; any change
// gives a freshly compressed, current body.
func TestCompressedListReuse(t *testing.T) {
	const podList = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0"
	tc := newHandlerCache(t)
	fillLargePods(t, tc, 200, "1000")
	get := func() []byte {
		return tc.serveRaw(t, podList, "Accept-Encoding", "gzip").Body.Bytes()
	}
	entries := func() int {
		tc.pods.gzipped.mu.Lock()
		defer tc.pods.gzipped.mu.Unlock()
		return len(tc.pods.gzipped.entries)
	}

	first := get()
	if !bytes.Equal(get(), first) || entries() != 1 {
		t.Fatalf("a repeated list: %d kept bodies, want 1 reused", entries())
	}
	// Another selector for the same objects shares the body.
	if b := tc.serveRaw(t, "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0", "Accept-Encoding", "gzip").Body.Bytes(); !bytes.Equal(b, first) || entries() != 1 {
		t.Errorf("same objects through another selector: %d kept bodies, want the one reused", entries())
	}

	// A changed object is seen at once.
	changed := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p0007", ResourceVersion: "2000",
		Labels: map[string]string{"changed": "yes"}}, Spec: corev1.PodSpec{NodeName: "node-a"}}
	if err := tc.pods.store.Update(changed); err != nil {
		t.Fatal(err)
	}
	second := get()
	if bytes.Equal(second, first) || !bytes.Contains(gunzip(t, second), []byte(`"changed":"yes"`)) {
		t.Fatalf("after an update: the list does not show it")
	}
	if entries() != 1 {
		t.Errorf("after an update: %d kept bodies, want 1 (the old one dropped)", entries())
	}
	// A resourceVersion that moved without a change is another list
	// (its metadata differs).
	tc.pods.store.UpdateResourceVersion("3000")
	if b := gunzip(t, get()); !bytes.Contains(b, []byte(`"resourceVersion":"3000"`)) {
		t.Errorf("after a bookmark: list metadata is not at 3000")
	}
	// Each subset is its own list, and old bodies are dropped past the
	// bound.
	for i := range maxCompressedLists + 2 {
		path := fmt.Sprintf("/api/v1/pods?fieldSelector=spec.nodeName%%3Dnode-a,metadata.name!%%3Dp%04d&resourceVersion=0", i)
		if b := gunzip(t, tc.serveRaw(t, path, "Accept-Encoding", "gzip").Body.Bytes()); bytes.Contains(b, fmt.Appendf(nil, `"name":"p%04d"`, i)) {
			t.Errorf("%s: the list holds the pod it excludes", path)
		}
	}
	if n := entries(); n != maxCompressedLists {
		t.Errorf("%d kept bodies, want %d", n, maxCompressedLists)
	}
}

// TestCompressedListConcurrent: concurrent lists of the same objects share
// one compressed body, and all of them get it whole.
func TestCompressedListConcurrent(t *testing.T) {
	const podList = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0"
	tc := newHandlerCache(t)
	fillLargePods(t, tc, 200, "1000")
	want := tc.serveRaw(t, podList, "Accept", "application/vnd.kubernetes.protobuf").Body.Bytes()
	// Start from an empty set of kept bodies for the pods.
	tc.pods.gzipped.mu.Lock()
	tc.pods.gzipped.entries = nil
	tc.pods.gzipped.mu.Unlock()

	const n = 16
	bodies := make([][]byte, n)
	start := make(chan struct{})
	done := make(chan struct{})
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			<-start
			req := httptest.NewRequest(http.MethodGet, podList, nil)
			req.Header.Set("Authorization", "Bearer token")
			req.Header.Set("Accept", "application/vnd.kubernetes.protobuf")
			req.Header.Set("Accept-Encoding", "gzip")
			info, _ := handlerInfoFactory.NewRequestInfo(req)
			rec := httptest.NewRecorder()
			tc.handler.ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
			bodies[i] = rec.Body.Bytes()
		}()
	}
	close(start)
	for range n {
		<-done
	}
	for i, b := range bodies {
		if !bytes.Equal(gunzip(t, b), want) {
			t.Fatalf("request %d: decompressed body differs from the plain one", i)
		}
	}
	tc.pods.gzipped.mu.Lock()
	defer tc.pods.gzipped.mu.Unlock()
	if len(tc.pods.gzipped.entries) != 1 {
		t.Errorf("%d kept bodies after concurrent identical lists, want 1", len(tc.pods.gzipped.entries))
	}
}

// TestCompressedListOutdatedNotKept: a body compressed from a snapshot the
// resource has moved past (a change cleared the kept bodies meanwhile, or
// its resourceVersion is no longer the Store's) is answered but not kept,
// so it keeps no replaced objects alive.
func TestCompressedListOutdatedNotKept(t *testing.T) {
	tc := newHandlerCache(t)
	fillLargePods(t, tc, 200, "1000")
	res := tc.pods
	objs, rv := res.store.Snapshot(store.Predicate{})
	b, err := res.encoder.List(store.MediaJSON, objs, rv)
	if err != nil {
		t.Fatal(err)
	}
	current := func() uint64 { return rv }
	for _, tt := range []struct {
		name    string
		gen     uint64
		current func() uint64
	}{
		{"cleared since the snapshot", res.gzipped.generation() + 1, current},
		{"resourceVersion moved on", res.gzipped.generation(), func() uint64 { return rv + 1 }},
	} {
		gz, err := res.gzipped.compress(tt.gen, tt.current, store.MediaJSON, objs, rv, b)
		if err != nil || len(gz) == 0 {
			t.Fatalf("%s: %v, %d bytes", tt.name, err, len(gz))
		}
		if n := len(res.gzipped.entries); n != 0 {
			t.Errorf("%s: %d bodies kept, want 0", tt.name, n)
		}
	}
	if _, err := res.gzipped.compress(res.gzipped.generation(), current, store.MediaJSON, objs, rv, b); err != nil || len(res.gzipped.entries) != 1 {
		t.Errorf("current snapshot: %v, %d bodies kept, want 1", err, len(res.gzipped.entries))
	}
	// A change clears it.
	res.store.UpdateResourceVersion(fmt.Sprint(rv + 5))
	if n := len(res.gzipped.entries); n != 0 {
		t.Errorf("after a change: %d bodies kept, want 0", n)
	}
}
