package upstream

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testEndpoint is an apiserver stand-in whose health can be switched off.
type testEndpoint struct {
	srv  *httptest.Server
	url  *url.URL
	sick atomic.Bool
	hits atomic.Int32
	// probes counts /readyz requests.
	probes atomic.Int32
}

func newTestEndpoint(t *testing.T, handler http.HandlerFunc) *testEndpoint {
	t.Helper()
	return newTestEndpointWithCert(t, nil, handler)
}

// newTestEndpointWithCert is newTestEndpoint serving cert; nil means
// httptest's own certificate.
func newTestEndpointWithCert(t *testing.T, cert *tls.Certificate, handler http.HandlerFunc) *testEndpoint {
	t.Helper()
	e := &testEndpoint{}
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			e.probes.Add(1)
			if e.sick.Load() {
				http.Error(w, "not ready", http.StatusInternalServerError)
			}
			return
		}
		e.hits.Add(1)
		handler(w, r)
	}))
	if cert != nil {
		e.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	e.srv.StartTLS()
	t.Cleanup(e.srv.Close)
	e.url, _ = url.Parse(e.srv.URL)
	return e
}

// newTestUpstreams returns Set over eps (httptest servers share one
// certificate, so one transport trusts them all).
func newTestUpstreams(eps ...*testEndpoint) *Set {
	t0 := eps[0].srv.Client().Transport.(*http.Transport).Clone()
	u := &Set{transport: t0, upgradeTransport: http1Only(t0)}
	for _, e := range eps {
		u.endpoints = append(u.endpoints, newEndpoint(e.url))
	}
	return u
}

func ok(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, "ok")
}

// TestRetryOnDeadEndpoint: requests sent to an endpoint that refuses
// connections are sent to a live one instead, reads and writes alike (the
// dead one never saw them), and the live one becomes active.
func TestRetryOnDeadEndpoint(t *testing.T) {
	var bodies atomic.Int32 // requests whose body arrived whole
	dead := newTestEndpoint(t, ok)
	live := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); r.Method == http.MethodGet || string(b) == `{"kind":"ConfigMap"}` {
			bodies.Add(1)
		}
		_, _ = io.WriteString(w, "ok")
	})
	dead.srv.Close()
	u := newTestUpstreams(dead, live)
	u.checkAll(context.Background(), time.Second) // live is known healthy
	u.mu.Lock()
	u.active = 0 // as if dead had been active until a moment ago
	u.mu.Unlock()
	for _, tc := range []struct {
		method string
		body   string
		// sized gives the body a known length, as a server request with
		// Content-Length has; without it the length is unknown (chunked).
		sized bool
	}{{http.MethodGet, "", false}, {http.MethodPost, `{"kind":"ConfigMap"}`, false}, {http.MethodPut, `{"kind":"ConfigMap"}`, true}} {
		var body io.Reader
		if tc.body != "" {
			body = io.NopCloser(strings.NewReader(tc.body)) // not replayable by net/http
		}
		req, _ := http.NewRequest(tc.method, dead.url.JoinPath("/api/v1/namespaces/x/configmaps").String(), body)
		if tc.sized {
			req.ContentLength = int64(len(tc.body))
		}
		resp, err := u.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.method, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "ok" {
			t.Errorf("%s: body %q", tc.method, b)
		}
	}
	if got := live.hits.Load(); got != 3 {
		t.Errorf("live endpoint got %d requests, want 3", got)
	}
	if got := bodies.Load(); got != 3 {
		t.Errorf("%d of 3 retried requests arrived with their body intact", got)
	}
	if got := u.Pick().Host; got != live.url.Host {
		t.Errorf("active = %s, want %s", got, live.url.Host)
	}
	if err := u.Healthy(); err != nil {
		t.Errorf("healthy() = %v", err)
	}
}

// TestNoRetryOfSentWrite: a write that reached an endpoint is never
// sent twice, even if it failed there.
func TestNoRetryOfSentWrite(t *testing.T) {
	var a, b *testEndpoint
	a = newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		// Drop the connection without an answer.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	b = newTestEndpoint(t, ok)
	a.srv.EnableHTTP2 = false
	u := newTestUpstreams(a, b)
	u.transport.ForceAttemptHTTP2 = false
	u.transport.TLSClientConfig.NextProtos = []string{"http/1.1"}
	u.checkAll(context.Background(), time.Second)
	req, _ := http.NewRequest(http.MethodPost, a.url.JoinPath("/api/v1/namespaces/x/configmaps").String(), io.NopCloser(strings.NewReader("{}")))
	if resp, err := u.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a write whose connection dropped succeeded: %s", resp.Status)
	}
	if got := b.hits.Load(); got != 0 {
		t.Errorf("write sent again to another endpoint (%d times)", got)
	}
}

// TestFailoverAndStreamEnd: when the active endpoint fails its health
// checks, new requests go to the other one, and a stream still open on the
// failed one is ended so its client reconnects.
func TestFailoverAndStreamEnd(t *testing.T) {
	streaming := make(chan struct{})
	a := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "event\n")
		w.(http.Flusher).Flush()
		close(streaming)
		<-r.Context().Done()
	})
	b := newTestEndpoint(t, ok)
	u := newTestUpstreams(a, b)
	changes := atomic.Int32{}
	u.OnChange = func() { changes.Add(1) }
	u.checkAll(context.Background(), time.Second)
	if got := u.Pick().Host; got != a.url.Host {
		t.Fatalf("active = %s, want the first healthy endpoint %s", got, a.url.Host)
	}
	req, _ := http.NewRequest(http.MethodGet, a.url.JoinPath("/api/v1/pods").String()+"?watch=true", nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-streaming
	line := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, line); err != nil {
		t.Fatal(err)
	}

	a.sick.Store(true)
	u.checkAll(context.Background(), time.Second)
	if got := u.Pick().Host; got != b.url.Host {
		t.Errorf("after one failed check active = %s, want %s", got, b.url.Host)
	}
	if changes.Load() == 0 {
		t.Error("failover did not call onChange")
	}
	u.checkAll(context.Background(), time.Second) // deadAfter = 2
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("stream on the dead endpoint still open")
	}
	a.sick.Store(false)
	u.checkAll(context.Background(), time.Second)
	if err := u.Healthy(); err != nil {
		t.Errorf("healthy() = %v", err)
	}
}

// TestSetEndpoints: the EndpointSlice list replaces the bootstrap list,
// keeping the active endpoint and known health, and has new endpoints
// probed at once; an empty list is ignored.
func TestSetEndpoints(t *testing.T) {
	a, b := newTestEndpoint(t, ok), newTestEndpoint(t, ok)
	u := newTestUpstreams(a)
	u.checkAll(context.Background(), time.Second)
	u.SetEndpoints(nil)
	if len(u.Status()) != 1 {
		t.Fatalf("an empty list emptied the endpoints: %v", u.Status())
	}
	u.kick = make(chan struct{}, 1)
	u.SetEndpoints([]*url.URL{b.url, a.url})
	select {
	case <-u.kick:
	default:
		t.Error("a new endpoint was not sent to the health loop for a probe")
	}
	st := u.Status()
	if len(st) != 2 || !st[1].Active || !st[1].Healthy || st[0].Healthy {
		t.Errorf("status = %+v, want a kept active and healthy, b new and unchecked", st)
	}
}

// TestTrackEveryRequest: each request in flight to an endpoint is tracked
// on its own, so that a dead endpoint's streams are all ended, and each is
// forgotten when it is done.
func TestTrackEveryRequest(t *testing.T) {
	e := newTestEndpoint(t, ok)
	u := newTestUpstreams(e)
	const n = 5
	var dones []func()
	cancelled := 0
	for range n {
		f := u.track(e.url.Host, func() { cancelled++ })
		dones = append(dones, f.end)
	}
	u.mu.Lock()
	held := len(u.endpoints[0].inflight)
	for _, c := range u.endpoints[0].inflight {
		c()
	}
	u.mu.Unlock()
	if held != n || cancelled != n {
		t.Errorf("%d requests in flight: %d tracked, %d cancelled; want all", n, held, cancelled)
	}
	for _, done := range dones {
		done()
	}
	if left := len(u.endpoints[0].inflight); left != 0 {
		t.Errorf("%d requests still tracked after all were done", left)
	}
}

// TestBufferedBodiesBounded: request bodies are buffered for a retry only
// within the byte budget; past it they are streamed, and the budget is
// given back when the round trip ends.
func TestBufferedBodiesBounded(t *testing.T) {
	var up *Set
	var held []int64
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held = append(held, up.bodies.used.Load())
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	tr := upstream.Client().Transport.(*http.Transport).Clone()
	up = NewWithTransport(tr, Config{Endpoints: []*url.URL{u}, MaxBufferedBodyBytes: 1500})
	send := func(n int) {
		req, _ := http.NewRequest(http.MethodPost, upstream.URL+"/api/v1/namespaces/a/configmaps", io.NopCloser(strings.NewReader(strings.Repeat("x", n))))
		req.ContentLength = int64(n)
		resp, err := up.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// 600 of 1500 bytes are held elsewhere: a 1000-byte body does not fit
	// and is streamed; once they are given back, it is buffered.
	if !up.bodies.reserve(600) {
		t.Fatal("reserving within the budget failed")
	}
	send(1000)
	up.bodies.release(600)
	send(1000)
	if diff := cmp.Diff([]int64{600, 1000}, held); diff != "" {
		t.Errorf("budget held while upstream read each body (-want +got):\n%s", diff)
	}
	if n := up.bodies.used.Load(); n != 0 {
		t.Errorf("%d bytes of the budget still held after the round trips", n)
	}
}
