package serving

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestClientCertificates: a request without a client certificate goes on
// to the agent's handler; one from a pod with a client certificate puts
// the pod's address in the skip set and is told to reconnect and retry
// (429, Retry-After: 1, Connection: close), as kube-apiserver tells its
// clients to go elsewhere; one from the node itself, or with the pod-path
// check off, gets a 401 that says why; none reaches the handler.
func TestClientCertificates(t *testing.T) {
	reached := 0
	cc := newClientCertificates(Options{BypassDuration: 10 * time.Minute, Registry: prometheus.NewRegistry()})
	// The skip sets are the interceptor's (TestSkipSource there); here a
	// family with a skip set is one that records the sources.
	skipped := map[netip.Addr]bool{}
	steerable := true
	cc.skip = func(src netip.Addr) (bool, error) {
		if !steerable {
			return false, nil
		}
		skipped[src] = true
		return true, nil
	}
	node := netip.MustParseAddr("192.0.2.10")
	cc.isLocal = func(addr netip.Addr) bool { return addr == node }
	h := cc.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "jane"}}
	do := func(src string, withCert bool) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/default/pods", nil)
		r.RemoteAddr = src
		r.TLS = &tls.ConnectionState{}
		if withCert {
			r.TLS.PeerCertificates = []*x509.Certificate{cert}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	status := func(w *httptest.ResponseRecorder) metav1.Status {
		t.Helper()
		var st metav1.Status
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
			t.Fatalf("not a Status: %v: %s", err, w.Body)
		}
		return st
	}
	pod := netip.MustParseAddr("10.244.1.5")

	if do("10.244.1.5:40000", false); reached != 1 || skipped[pod] {
		t.Fatalf("no certificate: reached %d, skipped %v", reached, skipped[pod])
	}
	w := do("10.244.1.5:40001", true)
	if st := status(w); w.Code != http.StatusTooManyRequests || st.Reason != metav1.StatusReasonTooManyRequests ||
		w.Header().Get("Retry-After") != "1" || w.Header().Get("Connection") != "close" {
		t.Errorf("pod with a certificate: %d %v %s", w.Code, w.Header(), w.Body)
	}
	if !skipped[pod] {
		t.Errorf("the pod's address is not in the skip set: %v", skipped)
	}
	w = do("192.0.2.10:40002", true)
	if st := status(w); w.Code != http.StatusUnauthorized || st.Reason != metav1.StatusReasonUnauthorized || skipped[node] {
		t.Errorf("host-network caller with a certificate: %d %s, skipped %v", w.Code, w.Body, skipped[node])
	}
	// Without the skip set (the pod-path check off), nothing can be steered.
	steerable = false
	if w = do("10.244.1.6:40003", true); w.Code != http.StatusUnauthorized {
		t.Errorf("no skip set: %d %s, want 401", w.Code, w.Body)
	}
	if reached != 1 {
		t.Errorf("%d requests reached the handler, want only the one without a certificate", reached)
	}
	for outcome, want := range map[string]float64{"bypassed": 1, "refused": 2} {
		if got := testutil.ToFloat64(cc.handoffs.WithLabelValues(outcome)); got != want {
			t.Errorf("%s: %v, want %v", outcome, got, want)
		}
	}
}
