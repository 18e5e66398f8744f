package serving

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// TestDegradedFailFast: in degraded mode the requests that would be
// forwarded are answered at once, as kube-apiserver's absence makes them
// fail, never sent upstream.
func TestDegradedFailFast(t *testing.T) {
	sent := 0
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent++ }))
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	var active atomic.Bool
	active.Store(true)
	front := httptest.NewServer(apihttp.WithRequestInfo(failFastWhenDegraded(active.Load, a.handler)))
	defer front.Close()
	for _, tc := range []struct {
		name, method, path string
		wantCode           int
		wantReason         metav1.StatusReason
		wantRetryAfter     string
	}{
		// A consistent read gets kube-apiserver's request timeout.
		{"consistent list", http.MethodGet, "/api/v1/namespaces/ns/configmaps", http.StatusGatewayTimeout, metav1.StatusReasonTimeout, ""},
		{"consistent get", http.MethodGet, "/api/v1/namespaces/ns/configmaps/x", http.StatusGatewayTimeout, metav1.StatusReasonTimeout, ""},
		// Other reads, writes and everything else: 503, Retry-After.
		{"list at RV 0", http.MethodGet, "/api/v1/namespaces/ns/configmaps?resourceVersion=0", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "1"},
		{"create", http.MethodPost, "/api/v1/namespaces/ns/configmaps", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "1"},
		{"delete", http.MethodDelete, "/api/v1/namespaces/ns/configmaps/x", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "1"},
		{"discovery", http.MethodGet, "/apis", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "1"},
		// A watch: 429, which client-go resumes without relisting.
		{"watch", http.MethodGet, "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=5", http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, front.URL+tc.path, strings.NewReader(""))
			req.Header.Set("Accept", "application/json")
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if took := time.Since(start); took > time.Second {
				t.Errorf("answered after %s", took)
			}
			var st metav1.Status
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatalf("not a Status: %v", err)
			}
			if resp.StatusCode != tc.wantCode || st.Reason != tc.wantReason || int(st.Code) != tc.wantCode {
				t.Errorf("got %d %s (status code %d), want %d %s", resp.StatusCode, st.Reason, st.Code, tc.wantCode, tc.wantReason)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.wantRetryAfter)
			}
		})
	}
	if sent != 0 {
		t.Errorf("%d requests reached the upstream in degraded mode", sent)
	}
	// Out of degraded mode, requests are forwarded again.
	active.Store(false)
	resp, err := http.Get(front.URL + "/api/v1/namespaces/ns/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if sent != 1 {
		t.Errorf("%d requests forwarded after degraded mode ended, want 1", sent)
	}
}
