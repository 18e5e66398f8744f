package serving

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-apicache/kube-apicache/agent/upstream"
)

// newTestAgent returns an agent whose upstream is the given test server.
func newTestAgent(t *testing.T, upstream *httptest.Server) *Server {
	t.Helper()
	return newTestAgentWithUpstreams(t, newTestUpstream(upstream, 0))
}

// newTestUpstream returns an upstream set over srv that buffers up to
// buffered bytes of request bodies for a retry.
func newTestUpstream(srv *httptest.Server, buffered int) *upstream.Set {
	u, _ := url.Parse(srv.URL)
	return upstream.NewWithTransport(srv.Client().Transport.(*http.Transport).Clone(), upstream.Config{Endpoints: []*url.URL{u}, MaxBufferedBodyBytes: buffered})
}

// newTestAgentWithUpstreams returns an agent that forwards to up.
func newTestAgentWithUpstreams(t *testing.T, up *upstream.Set) *Server {
	t.Helper()
	drain, startDrain := context.WithCancel(context.Background())
	t.Cleanup(startDrain)
	return New(Options{Upstream: up, Degraded: func() bool { return false }, Drain: drain, Registry: prometheus.NewRegistry(),
		SkipSource: func(netip.Addr) (bool, error) { return false, nil }, IsNodeAddress: func(netip.Addr) bool { return false }})
}

// TestForwardHeaders checks what reaches the upstream: the client's
// credentials untouched, no X-Remote-* identity headers, the client's
// address in X-Forwarded-For.
func TestForwardHeaders(t *testing.T) {
	var got http.Header
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.WriteHeader(http.StatusOK)
	}))
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	front := httptest.NewServer(a.handler)
	defer front.Close()

	req, _ := http.NewRequest(http.MethodGet, front.URL+"/api/v1/namespaces/x/pods", nil)
	req.Header.Set("Authorization", "Bearer pod-token")
	req.Header.Set("X-Remote-User", "system:admin")
	req.Header.Set("X-Remote-Group", "system:masters")
	req.Header.Set("Impersonate-User", "someone")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got.Get("Authorization") != "Bearer pod-token" {
		t.Errorf("Authorization = %q, want the client's", got.Get("Authorization"))
	}
	if got.Get("X-Remote-User") != "" || got.Get("X-Remote-Group") != "" {
		t.Errorf("X-Remote-* headers reached upstream: %v", got)
	}
	if got.Get("Impersonate-User") != "someone" {
		t.Errorf("Impersonate-User = %q; it must pass so upstream authorizes it", got.Get("Impersonate-User"))
	}
	if !strings.HasPrefix(got.Get("X-Forwarded-For"), "127.0.0.1") {
		t.Errorf("X-Forwarded-For = %q, want the client address", got.Get("X-Forwarded-For"))
	}
}

// TestForwardWatchEndsWithClient checks that a relayed watch streams each
// event at once and ends, and is counted, when its client goes away.
func TestForwardWatchEndsWithClient(t *testing.T) {
	upstreamDone := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"type":"ADDED","object":{}}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	front := httptest.NewUnstartedServer(a.handler)
	front.EnableHTTP2 = true
	front.StartTLS()
	defer front.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/api/v1/namespaces/x/configmaps?watch=true", nil)
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("client spoke HTTP/%d, want 2", resp.ProtoMajor)
	}
	buf := make([]byte, 100)
	n, err := resp.Body.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "ADDED") {
		t.Fatalf("first event not streamed: %q %v", buf[:n], err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamDone:
	case <-time.After(5 * time.Second):
		t.Fatal("upstream watch still open after the client went away")
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(a.metrics.requests.WithLabelValues("watch", "configmaps", "forward", "200")) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("watch not counted: %s", dumpRequests(t, a))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dumpRequests(t *testing.T, a *Server) string {
	t.Helper()
	mfs, err := a.metrics.reg.(prometheus.Gatherer).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if mf.GetName() == "kube_apicache_requests_total" {
			for _, m := range mf.GetMetric() {
				b.WriteString(m.String() + "\n")
			}
		}
	}
	return b.String()
}

// TestForwardSPDYUpgradeUsesHTTP1 checks that a SPDY upgrade reaches an
// HTTP/2-capable upstream over HTTP/1.1 even after ordinary requests have
// opened an HTTP/2 connection to it, and that a refused upgrade is relayed
// with Connection: close.
func TestForwardSPDYUpgradeUsesHTTP1(t *testing.T) {
	var protos []string
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos = append(protos, r.Proto)
		if r.Header.Get("Upgrade") != "" {
			http.Error(w, "kubelet unreachable", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	upstream.EnableHTTP2 = true
	upstream.StartTLS()
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	a.up.Transport().ForceAttemptHTTP2 = true
	front := httptest.NewServer(a.handler)
	defer front.Close()

	resp, err := http.Get(front.URL + "/api/v1/namespaces/x/pods")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/api/v1/namespaces/x/pods/p/exec", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "SPDY/3.1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "kubelet unreachable") {
		t.Errorf("upgrade answer = %d %q, want upstream's 500", resp.StatusCode, body)
	}
	if !resp.Close {
		t.Errorf("failed upgrade did not close the client connection")
	}
	if len(protos) != 2 || protos[0] != "HTTP/2.0" || protos[1] != "HTTP/1.1" {
		t.Errorf("upstream saw protocols %v, want [HTTP/2.0 HTTP/1.1]", protos)
	}
}
