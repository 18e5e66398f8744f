package serving

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestForwardWatchEndsCleanlyOnUpstreamLoss checks that when the upstream of
// a relayed watch goes away, the client's HTTP/2 stream ends normally (as a
// direct client's does when kube-apiserver goes away) rather than being
// reset, which client-go would take for a failed watch and relist.
func TestForwardWatchEndsCleanlyOnUpstreamLoss(t *testing.T) {
	sent := make(chan struct{})
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"type":"ADDED","object":{}}`+"\n")
		w.(http.Flusher).Flush()
		close(sent)
		<-r.Context().Done()
	}))
	front := startH2Front(t, upstream)

	// Given a watch relayed over HTTP/2 with one event delivered...
	resp, err := front.Client().Get(front.URL + "/api/v1/namespaces/x/configmaps?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("client spoke HTTP/%d, want 2", resp.ProtoMajor)
	}
	<-sent
	// ...when the upstream connection is lost...
	upstream.CloseClientConnections()
	// ...then the client reads the event and a normal end of stream.
	done := make(chan struct{})
	var body []byte
	go func() {
		defer close(done)
		body, err = io.ReadAll(resp.Body)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("relayed watch still open after its upstream went away")
	}
	if err != nil {
		t.Errorf("relayed watch ended with %v, want a clean end", err)
	}
	if !strings.Contains(string(body), "ADDED") {
		t.Errorf("event lost: %q", body)
	}
}

// TestForwardCancellationPropagates checks that clients giving up (timeouts
// on short requests, cancelled watches) cancel the upstream requests too,
// and that nothing is left running afterwards.
func TestForwardCancellationPropagates(t *testing.T) {
	var cancelled atomic.Int32
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		// A slow upstream: nothing more until the caller gives up.
		select {
		case <-r.Context().Done():
			cancelled.Add(1)
		case <-time.After(time.Minute):
		}
	}))
	front := startH2Front(t, upstream)
	client := front.Client()

	// A first request opens the connections that stay pooled.
	warm, cancelWarm := context.WithTimeout(context.Background(), 200*time.Millisecond)
	req, _ := http.NewRequestWithContext(warm, http.MethodGet, front.URL+"/api/v1/pods", nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
	cancelWarm()
	waitFor(t, func() bool { return cancelled.Load() == 1 }, "the warm-up request to be cancelled upstream")
	baseline := settledGoroutines()

	const n = 50
	errs := make(chan error, 2*n)
	for i := range 2 * n {
		go func() {
			path := "/api/v1/pods"
			if i%2 == 1 {
				path += "?watch=true"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+path, nil)
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	for range 2 * n {
		if err := <-errs; err == nil {
			t.Errorf("a request to the stalled upstream completed")
		}
	}
	waitFor(t, func() bool { return cancelled.Load() == 1+2*n }, "every client's cancellation to reach upstream")
	after := settledGoroutines()
	t.Logf("%d requests cancelled by their clients, %d cancellations seen upstream; goroutines %d before, %d after", 2*n, cancelled.Load()-1, baseline, after)
	if after > baseline+2 {
		t.Errorf("goroutines grew from %d to %d", baseline, after)
	}
}

// settledGoroutines returns the goroutine count once it stops falling.
func settledGoroutines() int {
	last := runtime.NumGoroutine()
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == last {
			return n
		}
		last = n
	}
	return last
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForwardUnreachableUpstream checks the answers when no upstream can
// be reached: a watch gets 429 with Retry-After, which client-go's reflector
// retries from its resourceVersion (as it retries the "connection refused" a
// direct client would see) instead of relisting; other requests get 503.
func TestForwardUnreachableUpstream(t *testing.T) {
	upstream := httptest.NewTLSServer(http.NotFoundHandler())
	a := newTestAgent(t, upstream)
	upstream.Close()
	front := httptest.NewServer(a.handler)
	defer front.Close()
	for _, tc := range []struct {
		path       string
		code       int
		retryAfter string
	}{
		{"/api/v1/namespaces/x/configmaps?watch=true&resourceVersion=10", http.StatusTooManyRequests, "1"},
		{"/api/v1/namespaces/x/configmaps", http.StatusServiceUnavailable, ""},
	} {
		resp, err := http.Get(front.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || resp.Header.Get("Retry-After") != tc.retryAfter || !strings.Contains(string(body), `"kind":"Status"`) {
			t.Errorf("GET %s with upstream down: %d Retry-After=%q %s; want %d Retry-After=%q and a Status",
				tc.path, resp.StatusCode, resp.Header.Get("Retry-After"), body, tc.code, tc.retryAfter)
		}
	}
}

// startH2Front starts upstream (unstarted) and a test agent forwarding to
// it, both serving HTTP/2 over TLS, and returns the agent's server; both
// stop when the test ends.
func startH2Front(t *testing.T, upstream *httptest.Server) *httptest.Server {
	t.Helper()
	upstream.EnableHTTP2 = true
	upstream.StartTLS()
	t.Cleanup(upstream.Close)
	a := newTestAgent(t, upstream)
	front := httptest.NewUnstartedServer(a.handler)
	front.EnableHTTP2 = true
	front.StartTLS()
	t.Cleanup(front.Close)
	return front
}
