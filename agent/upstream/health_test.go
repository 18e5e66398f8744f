package upstream

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
)

// fakeClock is the time the health decisions of a test's Set see.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// withClock gives u a fake clock, the default timing and a kick channel.
func withClock(u *Set) *fakeClock {
	c := &fakeClock{now: time.Unix(1_000_000, 0)}
	u.now = c.Now
	u.period, u.window = DefaultHealthPeriod, successWindow
	u.kick = make(chan struct{}, 1)
	return c
}

func get(t *testing.T, u *Set, ep *testEndpoint, path string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ep.url.JoinPath(path).String(), nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestDue: which endpoints the health loop probes, and why.
func TestDue(t *testing.T) {
	period := DefaultHealthPeriod
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name       string
		ep         func(*endpoint)
		anyHealthy bool
		now        time.Duration // after t0
		want       probeReason
		due        bool
	}{{
		// A new endpoint is probed at once.
		name: "unchecked", ep: func(ep *endpoint) {}, now: 0, want: probeUnchecked, due: true,
	}, {
		// A request answered a minute ago proves it: no probe.
		name: "recent success", ep: func(ep *endpoint) { healthyAt(ep, t0) }, anyHealthy: true,
		now: time.Minute,
	}, {
		// Nothing for longer than the window and its jitter: probe.
		name: "no recent success", ep: func(ep *endpoint) { healthyAt(ep, t0); ep.jitter = 10 * time.Second },
		anyHealthy: true, now: successWindow + 10*time.Second, want: probeStale, due: true,
	}, {
		// Within the jitter: not yet.
		name: "within jitter", ep: func(ep *endpoint) { healthyAt(ep, t0); ep.jitter = 10 * time.Second },
		anyHealthy: true, now: successWindow + 9*time.Second,
	}, {
		// A 5xx answer after the last success: probe, once a period.
		name: "5xx since success", ep: func(ep *endpoint) {
			healthyAt(ep, t0)
			ep.lastTrouble.Store(t0.Add(time.Second).UnixNano())
		}, anyHealthy: true, now: 2 * time.Second, want: probeSuspect, due: true,
	}, {
		name: "5xx since success, probed within the period", ep: func(ep *endpoint) {
			healthyAt(ep, t0)
			ep.lastTrouble.Store(t0.Add(time.Second).UnixNano())
			ep.lastProbe = t0.Add(time.Second)
		}, anyHealthy: true, now: 2 * time.Second,
	}, {
		// A 5xx answer followed by a success: nothing to look into.
		name: "5xx then success", ep: func(ep *endpoint) {
			ep.lastTrouble.Store(t0.UnixNano())
			healthyAt(ep, t0.Add(time.Second))
		}, anyHealthy: true, now: 2 * time.Second,
	}, {
		// A request failed: probe at once.
		name: "reported failure", ep: func(ep *endpoint) { ep.checked, ep.probeNow, ep.lastProbe = true, true, t0 },
		anyHealthy: true, now: 0, want: probeFailing, due: true,
	}, {
		// Failed three probes while another endpoint serves: every 4 periods.
		name: "failing, backing off", ep: func(ep *endpoint) { ep.checked, ep.failures, ep.lastProbe = true, 3, t0 },
		anyHealthy: true, now: 3 * period,
	}, {
		name: "failing, backed off", ep: func(ep *endpoint) { ep.checked, ep.failures, ep.lastProbe = true, 3, t0 },
		anyHealthy: true, now: 4 * period, want: probeFailing, due: true,
	}, {
		// The back-off stops at failingProbeMax.
		name: "failing long", ep: func(ep *endpoint) { ep.checked, ep.failures, ep.lastProbe = true, 40, t0 },
		anyHealthy: true, now: failingProbeMax, want: probeFailing, due: true,
	}, {
		// With no healthy endpoint, every period: interception resumes soon.
		name: "failing, none healthy", ep: func(ep *endpoint) { ep.checked, ep.failures, ep.lastProbe = true, 5, t0 },
		now: period, want: probeFailing, due: true,
	}, {
		// Never two probes of one endpoint at once.
		name: "probing", ep: func(ep *endpoint) { ep.probing = true }, now: time.Hour,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			u := &Set{period: period, window: successWindow}
			ep := newEndpoint(&url.URL{Scheme: "https", Host: "10.0.0.1:6443"})
			tc.ep(ep)
			got, due := u.due(ep, t0.Add(tc.now), tc.anyHealthy)
			if due != tc.due || (due && got != tc.want) {
				t.Errorf("due = %v %s, want %v %s", due, probeReasonNames[got], tc.due, probeReasonNames[tc.want])
			}
		})
	}
}

func healthyAt(ep *endpoint, at time.Time) {
	ep.healthy, ep.checked = true, true
	ep.succeeded(at)
}

// TestIdleProbeRate: on an idle node with three apiservers, where only
// kube-apiserver's watch bookmarks (one a minute) reach the active
// endpoint, the agent probes under once a minute, and never the active
// endpoint once it is known.
func TestIdleProbeRate(t *testing.T) {
	eps := []*testEndpoint{newTestEndpoint(t, ok), newTestEndpoint(t, ok), newTestEndpoint(t, ok)}
	u := newTestUpstreams(eps...)
	clock := withClock(u)
	ctx := context.Background()
	timeout := ProbeTimeout(u.period)
	u.probeDue(ctx, timeout) // start-up: every endpoint once
	const minutes = 30
	for step := range minutes * 30 { // one look per 2s health period
		if step%30 == 0 {
			u.endpoints[u.active].succeeded(clock.Now()) // a bookmark
		}
		u.probeDue(ctx, timeout)
		clock.Step(u.period)
	}
	var total int32
	for _, e := range eps {
		total += e.probes.Load() - 1
	}
	t.Logf("/readyz probes in %d idle minutes beyond start-up: %d, %d, %d", minutes, eps[0].probes.Load()-1, eps[1].probes.Load()-1, eps[2].probes.Load()-1)
	if total > minutes {
		t.Errorf("%d probes in %d idle minutes, want at most one a minute", total, minutes)
	}
	if got := eps[u.active].probes.Load(); got != 1 {
		t.Errorf("the active endpoint, kept proven by its watches, was probed %d times", got)
	}
}

// TestTrafficSparesProbes: requests that get answers keep their endpoint
// Healthy without probes; answers of 500 and up do not, and have it probed
// within a period; once traffic stops, the endpoint is probed after the
// window.
func TestTrafficSparesProbes(t *testing.T) {
	var fail atomic.Bool
	e := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "etcd unavailable", http.StatusInternalServerError)
			return
		}
		ok(w, r)
	})
	u := newTestUpstreams(e)
	clock := withClock(u)
	ctx := context.Background()
	timeout := ProbeTimeout(u.period)
	u.probeDue(ctx, timeout)
	for range 200 { // over six minutes of traffic
		get(t, u, e, "/api/v1/pods")
		clock.Step(u.period)
		u.probeDue(ctx, timeout)
	}
	if got := e.probes.Load(); got != 1 {
		t.Errorf("%d probes of an endpoint that answered every request, want only the first", got)
	}
	fail.Store(true)
	get(t, u, e, "/api/v1/pods")
	clock.Step(u.period)
	u.probeDue(ctx, timeout)
	if got := e.probes.Load(); got != 2 {
		t.Errorf("after a 500 answer, %d probes, want one more", got)
	}
	fail.Store(false)
	clock.Step(successWindow + time.Duration(float64(successWindow)*windowJitter))
	u.probeDue(ctx, timeout)
	if got := e.probes.Load(); got != 3 {
		t.Errorf("after a window without traffic, %d probes, want one more", got)
	}
}

// TestSilentWatchProbed: an open watch that brings nothing does not keep
// its endpoint healthy: it is probed after the window, and the watch's
// events, when they come, count.
func TestSilentWatchProbed(t *testing.T) {
	events := make(chan string)
	e := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case ev := <-events:
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	})
	u := newTestUpstreams(e)
	clock := withClock(u)
	ctx := context.Background()
	timeout := ProbeTimeout(u.period)
	u.probeDue(ctx, timeout)
	req, _ := http.NewRequest(http.MethodGet, e.url.JoinPath("/api/v1/pods").String()+"?watch=true", nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	maxWindow := successWindow + time.Duration(float64(successWindow)*windowJitter)
	clock.Step(maxWindow)
	u.probeDue(ctx, timeout)
	if got := e.probes.Load(); got != 2 {
		t.Errorf("%d probes with a silent watch open for a window, want 2", got)
	}
	clock.Step(maxWindow - time.Second)
	events <- `{"type":"BOOKMARK"}` + "\n"
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	clock.Step(2 * time.Second)
	u.probeDue(ctx, timeout)
	if got := e.probes.Load(); got != 2 {
		t.Errorf("%d probes after a bookmark, want still 2", got)
	}
}

// TestBrokenStreamFailsOver: when the connection under an open stream
// breaks, the endpoint is marked unhealthy at once, requests move to the
// other endpoint, and a probe is asked for, which takes it back if it
// answers.
func TestBrokenStreamFailsOver(t *testing.T) {
	streaming := make(chan struct{}, 1)
	a := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "event\n")
		w.(http.Flusher).Flush()
		streaming <- struct{}{}
		<-r.Context().Done()
	})
	b := newTestEndpoint(t, ok)
	u := newTestUpstreams(a, b)
	withClock(u)
	ctx := context.Background()
	u.probeDue(ctx, time.Second)
	req, _ := http.NewRequest(http.MethodGet, a.url.JoinPath("/api/v1/pods").String()+"?watch=true", nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-streaming
	a.srv.CloseClientConnections()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("stream ended cleanly; want a broken one")
	}
	if got := u.Pick().Host; got != b.url.Host {
		t.Errorf("active = %s, want %s", got, b.url.Host)
	}
	if st := u.Status(); st[0].Healthy {
		t.Errorf("the endpoint of the broken stream is still healthy: %+v", st)
	}
	select {
	case <-u.kick:
	default:
		t.Error("no probe asked for")
	}
	u.probeDue(ctx, time.Second)
	if st := u.Status(); !st[0].Healthy {
		t.Errorf("the endpoint is not back after a passed probe: %+v", st)
	}
}

// TestClosedStreamIsNoFailure: a stream its own caller closes (an informer
// stopping its watch while a read is pending), or that ends cleanly, says
// nothing against its endpoint.
func TestClosedStreamIsNoFailure(t *testing.T) {
	e := newTestEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			ok(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	u := newTestUpstreams(e)
	withClock(u)
	u.probeDue(context.Background(), time.Second)
	get(t, u, e, "/api/v1/pods")
	req, _ := http.NewRequest(http.MethodGet, e.url.JoinPath("/api/v1/pods").String()+"?watch=true", nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error)
	go func() {
		_, err := io.ReadAll(resp.Body)
		read <- err
	}()
	time.Sleep(50 * time.Millisecond)
	resp.Body.Close()
	<-read
	if err := u.Healthy(); err != nil {
		t.Errorf("healthy() = %v after streams closed by their callers", err)
	}
	if got := u.stats.passiveFailures.Load(); got != 0 {
		t.Errorf("%d passive failures, want 0", got)
	}
}

// TestUnansweredPingFailsEndpoint: an apiserver that stops answering (its
// host gone, or the process hung) under an open, silent HTTP/2 watch is
// found by the transport's ping and marked unhealthy, without a probe.
func TestUnansweredPingFailsEndpoint(t *testing.T) {
	// A watch that sends its headers and then nothing.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	p := newFreezingProxy(t, srv.Listener.Addr().String())
	epURL := &url.URL{Scheme: "https", Host: p.addr}
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: 200 * time.Millisecond, PingTimeout: 200 * time.Millisecond}
	u := &Set{transport: tr, upgradeTransport: http1Only(tr), endpoints: []*endpoint{newEndpoint(epURL)}}
	withClock(u)
	u.mu.Lock()
	healthyAt(u.endpoints[0], u.clock())
	u.mu.Unlock()
	req, _ := http.NewRequest(http.MethodGet, epURL.JoinPath("/api/v1/pods").String()+"?watch=true", nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/%d, want 2", resp.ProtoMajor)
	}
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		read <- err
	}()
	// Pings answered: the silent watch stays open.
	time.Sleep(time.Second)
	if err := u.Healthy(); err != nil {
		t.Fatalf("healthy() = %v while pings are answered", err)
	}
	frozen := time.Now()
	p.freeze()
	select {
	case err := <-read:
		t.Logf("watch ended %v after the endpoint froze: %v", time.Since(frozen).Round(10*time.Millisecond), err)
	case <-time.After(10 * time.Second):
		t.Fatal("watch on a frozen endpoint still open")
	}
	if err := u.Healthy(); err == nil {
		t.Error("the frozen endpoint is still healthy")
	}
}

// freezingProxy relays TCP connections to a backend until frozen; then it
// stops relaying without closing anything, as a vanished host does.
type freezingProxy struct {
	addr   string
	frozen chan struct{}
	once   sync.Once
}

func newFreezingProxy(t *testing.T, backend string) *freezingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{addr: l.Addr().String(), frozen: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, b)
			mu.Unlock()
			go p.relay(b, c)
			go p.relay(c, b)
		}
	}()
	return p
}

func (p *freezingProxy) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			<-make(chan struct{}) // swallow everything from now on
		default:
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

// TestHealthMetrics: probes are counted by reason and result, failures of
// live traffic apart, and each endpoint's last success is reported.
func TestHealthMetrics(t *testing.T) {
	e := newTestEndpoint(t, ok)
	u := newTestUpstreams(e)
	withClock(u)
	u.probeDue(context.Background(), time.Second)
	u.reportFailure(klog.Background(), e.url.Host, io.ErrUnexpectedEOF)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(u.healthCollector())
	want := `
# HELP kube_apicache_upstream_passive_failures_total Requests to kube-apiserver endpoints whose connection failed or whose response broke off, each marking its endpoint unhealthy until a probe passes.
# TYPE kube_apicache_upstream_passive_failures_total counter
kube_apicache_upstream_passive_failures_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kube_apicache_upstream_passive_failures_total"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "kube_apicache_upstream_probes_total", "kube_apicache_upstream_endpoint_last_success_timestamp_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if want := int(numProbeReasons)*2 + 1; n != want {
		t.Errorf("%d samples, want %d", n, want)
	}
	if got := u.stats.probes[probeUnchecked][0].Load(); got != 1 {
		t.Errorf("unchecked/ok probes = %d, want 1", got)
	}
}

// TestStreamResetIsNoFailure: kube-apiserver resets a single HTTP/2 stream
// when a handler aborts, as it does when a pod whose response it proxies
// breaks it off, which any tenant with a pod can arrange. That must not
// mark the endpoint unhealthy (a tenant could otherwise make the agent
// fail over, or fail open, at will), nor even suspect: the reset is the
// endpoint's answer, and a loop of them must cost no probe.
func TestStreamResetIsNoFailure(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	epURL := &url.URL{Scheme: "https", Host: srv.Listener.Addr().String()}
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = true
	u := &Set{transport: tr, upgradeTransport: http1Only(tr), endpoints: []*endpoint{newEndpoint(epURL)}}
	withClock(u)
	u.mu.Lock()
	healthyAt(u.endpoints[0], u.clock())
	u.mu.Unlock()
	req, _ := http.NewRequest(http.MethodGet, epURL.JoinPath("/api/v1/namespaces/t/pods/p/proxy/").String(), nil)
	resp, err := u.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/%d, want 2", resp.ProtoMajor)
	}
	_, err = io.ReadAll(resp.Body)
	if err == nil || !isStreamReset(err) {
		t.Fatalf("reading the aborted response: %v, want a stream reset", err)
	}
	if err := u.Healthy(); err != nil {
		t.Errorf("healthy() = %v after one stream was reset", err)
	}
	if got := u.stats.passiveFailures.Load(); got != 0 {
		t.Errorf("%d passive failures, want 0", got)
	}
	if u.endpoints[0].lastTrouble.Load() != 0 {
		t.Error("the endpoint was made suspect by a reset it sent")
	}
}

// TestProxyResetsChangeNoHealth: a tenant with pods/proxy can have
// kube-apiserver reset a request's stream before any answer (its pod sends
// headers and closes). That is the endpoint answering, not failing: no
// endpoint may be marked unhealthy, the request is not sent to the other
// endpoints, and no /readyz probe follows. With every endpoint healthy
// throughout, reviews never fall back to degraded mode's recalled
// decisions (which need no healthy endpoint). The loop stands for a
// tenant's request loop against three apiservers with the health loop
// running.
func TestProxyResetsChangeNoHealth(t *testing.T) {
	var eps []*testEndpoint
	var resets atomic.Int32
	for range 3 {
		e := &testEndpoint{}
		e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/readyz" {
				e.probes.Add(1)
				return
			}
			e.hits.Add(1)
			resets.Add(1)
			panic(http.ErrAbortHandler) // before any header: RST_STREAM
		}))
		e.srv.EnableHTTP2 = true
		e.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		e.srv.StartTLS()
		t.Cleanup(e.srv.Close)
		e.url, _ = url.Parse(e.srv.URL)
		eps = append(eps, e)
	}
	u := newTestUpstreams(eps...)
	u.transport.ForceAttemptHTTP2 = true
	u.period, u.kick = 100*time.Millisecond, make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := u.WaitHealthy(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Every endpoint checked and healthy before the loop starts.
	if !u.checkAll(ctx, time.Second) && u.Healthy() != nil {
		t.Fatal(u.Healthy())
	}
	probesBefore := 0
	for _, e := range eps {
		probesBefore += int(e.probes.Load())
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); u.Run(ctx, u.period) }()

	const n = 2000
	start := time.Now()
	unhealthySeen := 0
	for i := range n {
		req, _ := http.NewRequest(http.MethodGet, u.Pick().JoinPath("/api/v1/namespaces/t/pods/p/proxy/").String(), nil)
		resp, err := u.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("request %d: an answer, want the stream reset", i)
		}
		if !isStreamReset(err) {
			t.Fatalf("request %d: %v, want a stream reset", i, err)
		}
		if u.Healthy() != nil {
			unhealthySeen++
		}
	}
	took := time.Since(start)
	// Let the health loop run a few more periods, as it would after a
	// tenant's loop.
	time.Sleep(5 * u.period)
	cancel()
	<-runDone
	probes := 0
	for _, e := range eps {
		probes += int(e.probes.Load())
	}
	t.Logf("%d proxied requests reset in %v (%d upstream requests): %d /readyz probes during and after them, %d passive failures, unhealthy after %d",
		n, took.Round(time.Millisecond), resets.Load(), probes-probesBefore, u.stats.passiveFailures.Load(), unhealthySeen)
	if got := int(resets.Load()); got != n {
		t.Errorf("%d requests reached the endpoints, want %d: a reset request must not be sent again", got, n)
	}
	if probes != probesBefore {
		t.Errorf("%d /readyz probes, want none: a stream reset is an answer", probes-probesBefore)
	}
	if unhealthySeen > 0 || u.stats.passiveFailures.Load() > 0 {
		t.Errorf("no healthy endpoint after %d of %d requests (%d passive failures)", unhealthySeen, n, u.stats.passiveFailures.Load())
	}
	for _, ep := range u.Status() {
		if !ep.Healthy {
			t.Errorf("endpoint %s unhealthy", ep.Host)
		}
	}
}
