package cache

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// TestDegradedWatchServed: while the cache's own watch is broken, a watch
// it could serve is forwarded (kube-apiserver answers it instead), unless
// the request is marked degraded: kube-apiserver is unreachable, so the
// cache serves it and its events resume with the cache's watch.
func TestDegradedWatchServed(t *testing.T) {
	path := "/api/v1/pods?watch=true&resourceVersion=80&fieldSelector=" + url.QueryEscape("spec.nodeName=node-a")
	for _, degradedMode := range []bool{false, true} {
		up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }}
		c, _ := testCache(t, up, wlPod("a", "80"))
		brokenWatch(c)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.WaitTimeout+300*time.Millisecond)
		if degradedMode {
			ctx = WithDegraded(ctx)
		}
		req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)
		req.Header.Set("Authorization", "Bearer token-a")
		info, _ := testInfoFactory.NewRequestInfo(req)
		rec := httptest.NewRecorder()
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
		cancel()
		forwarded := len(up.got()) > 0
		switch {
		case degradedMode && (forwarded || rec.Code != http.StatusOK):
			t.Errorf("degraded: status %d, forwarded %t; want served from the cache", rec.Code, forwarded)
		case !degradedMode && !forwarded:
			t.Errorf("not degraded: status %d, not forwarded; want forwarded while the cache's watch is broken", rec.Code)
		}
	}
}

// TestDegradedWatchTooOld: a watch from before the cache's event window is
// forwarded (kube-apiserver may still serve it), unless the request is
// marked degraded: kube-apiserver is unreachable, so the cache answers it
// as kube-apiserver's watch cache answers a resourceVersion its window has
// moved past, with one 410 Expired ERROR event, and its client relists.
func TestDegradedWatchTooOld(t *testing.T) {
	path := "/api/v1/pods?watch=true&resourceVersion=1&fieldSelector=" + url.QueryEscape("spec.nodeName=node-a")
	for _, degradedMode := range []bool{false, true} {
		up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }}
		c, _ := testCache(t, up, wlPod("a", "80"))
		ctx := context.Background()
		if degradedMode {
			ctx = WithDegraded(ctx)
		}
		req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)
		req.Header.Set("Authorization", "Bearer token-a")
		info, _ := testInfoFactory.NewRequestInfo(req)
		rec := httptest.NewRecorder()
		c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
		forwarded := len(up.got()) > 0
		var ev struct {
			Type   string
			Object metav1.Status
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &ev)
		switch {
		case degradedMode && (forwarded || rec.Code != http.StatusOK || ev.Type != "ERROR" || ev.Object.Reason != metav1.StatusReasonExpired):
			t.Errorf("degraded: status %d, forwarded %t, body %q; want one ERROR 410 Expired from the cache", rec.Code, forwarded, rec.Body)
		case !degradedMode && (!forwarded || rec.Code != http.StatusTeapot):
			t.Errorf("not degraded: status %d, forwarded %t; want forwarded", rec.Code, forwarded)
		}
	}
}
