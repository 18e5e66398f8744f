package degraded

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

// fakeUpstream is an upstream set whose health the test sets.
type fakeUpstream struct {
	err  error
	last time.Time
}

func (f *fakeUpstream) Healthy() error        { return f.err }
func (f *fakeUpstream) LastAnswer() time.Time { return f.last }
func (f *fakeUpstream) Pick() *url.URL {
	u, _ := url.Parse("https://10.0.0.1:6443")
	return u
}

// degradedTestAgent is degraded mode over one upstream endpoint whose
// health the test sets, with a fake kube-proxy path and clock.
type degradedTestAgent struct {
	*Mode
	up       *fakeUpstream
	now      time.Time
	proxyErr error // what the kube-proxy path probe returns
	probes   int
}

func newDegradedTestAgent(t *testing.T, ttl time.Duration) *degradedTestAgent {
	t.Helper()
	d := &degradedTestAgent{up: &fakeUpstream{}, now: time.Unix(1_800_000_000, 0)}
	// A two-second health period and a one-second liveness timeout, as
	// the agent derives them.
	d.Mode = New(Config{TTL: ttl, HealthPeriod: 2 * time.Second, Interval: 250 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond},
		d.up, func() []netip.Addr { return nil }, func() {})
	d.Mode.now = func() time.Time { return d.now }
	d.setHealthy(true)
	return d
}

func (d *degradedTestAgent) setHealthy(ok bool) {
	if ok {
		d.up.err, d.up.last = nil, d.now
		return
	}
	d.up.err = errors.New("no healthy upstream endpoint: connection refused")
}

// step advances the clock by dt and runs one look of the degraded loop.
func (d *degradedTestAgent) step(t *testing.T, dt time.Duration) {
	t.Helper()
	d.now = d.now.Add(dt)
	d.Mode.step(context.Background(), d.now, time.Second, func(context.Context) error {
		d.probes++
		return d.proxyErr
	})
}

// health is the agent's verdict on the upstream part of its health.
func (d *degradedTestAgent) health() error {
	if err := d.up.Healthy(); err != nil {
		return d.Covers(d.now, err)
	}
	return nil
}

// TestDegradedModeDecision: the agent enters degraded mode only when no
// endpoint answered for a short while and kube-proxy's path fails too,
// keeps the redirect while it decides, steps aside when kube-apiserver
// answers through kube-proxy, and leaves degraded mode when an endpoint
// answers again.
func TestDegradedModeDecision(t *testing.T) {
	refused := errors.New("connection refused")
	t.Run("outage of every apiserver", func(t *testing.T) {
		d := newDegradedTestAgent(t, 5*time.Minute)
		// Given every endpoint down and kube-proxy's path failing,
		d.proxyErr = refused
		d.setHealthy(false)
		// while it decides, the agent keeps intercepting, and answers
		// a review that fails from recent decisions;
		for range 3 {
			d.step(t, 500*time.Millisecond)
			if err := d.health(); err != nil {
				t.Fatalf("deciding: health %v, want nil (keep the redirect)", err)
			}
			if !d.ReviewsUnreachable() {
				t.Fatalf("deciding: a failed review is not answered from recent decisions")
			}
			if d.Active() {
				t.Fatalf("degraded %s after the last answer, want only after %s", d.now.Sub(d.up.LastAnswer()), d.Mode.after)
			}
		}
		// once no endpoint answered for degradedAfter, it is degraded,
		d.step(t, d.Mode.after)
		since, ok := d.Since()
		if !ok {
			t.Fatalf("not degraded %s after the last answer", d.now.Sub(d.up.LastAnswer()))
		}
		if !since.Equal(d.now) {
			t.Errorf("degraded since %v, want %v", since, d.now)
		}
		if err := d.health(); err != nil {
			t.Errorf("degraded: health %v, want nil", err)
		}
		if !strings.Contains(d.Note(), since.UTC().Format(time.RFC3339)) {
			t.Errorf("note %q does not say since when", d.Note())
		}
		// it stays degraded, probing kube-proxy's path now and then,
		probes := d.probes
		for range 10 {
			d.step(t, 250*time.Millisecond)
		}
		if !d.Active() || d.probes-probes > 3 {
			t.Errorf("after 2.5s: degraded %t, %d probes of kube-proxy's path", d.Active(), d.probes-probes)
		}
		// and leaves degraded mode as soon as an endpoint answers.
		d.setHealthy(true)
		d.step(t, 250*time.Millisecond)
		if d.Active() {
			t.Errorf("still degraded with a healthy endpoint")
		}
		if d.Note() != "" {
			t.Errorf("note %q after recovery", d.Note())
		}
	})
	t.Run("kube-apiserver answers through kube-proxy", func(t *testing.T) {
		d := newDegradedTestAgent(t, 5*time.Minute)
		// Given the agent cannot reach an endpoint (a wrong CA, a
		// partition) while kube-proxy's path answers,
		d.proxyErr = nil
		d.setHealthy(false)
		d.step(t, 250*time.Millisecond)
		// then it steps aside at once, and never becomes degraded.
		err := d.health()
		if aside := interception.IsStepAside(err); !aside || !strings.Contains(err.Error(), "kube-proxy's path") {
			t.Fatalf("health %v, want a step-aside naming kube-proxy's path", err)
		}
		for range 40 {
			d.step(t, 250*time.Millisecond)
		}
		if d.Active() || d.ReviewsUnreachable() {
			t.Fatalf("degraded while kube-apiserver answers through kube-proxy")
		}
		// If kube-proxy's path fails later, the outage is everyone's.
		d.proxyErr = refused
		for range 8 {
			d.step(t, 250*time.Millisecond)
		}
		if !d.Active() {
			t.Fatalf("not degraded once kube-proxy's path failed too")
		}
		// And if it answers again, the agent steps aside again.
		d.proxyErr = nil
		for range 8 {
			d.step(t, 250*time.Millisecond)
		}
		if d.Active() {
			t.Fatalf("still degraded while kube-proxy's path answers")
		}
		if !interception.IsStepAside(d.health()) {
			t.Errorf("health %v, want a step-aside", d.health())
		}
	})
	t.Run("kube-proxy path hangs", func(t *testing.T) {
		// Given probes that never get an answer, the decision window
		// still ends: after it the agent is degraded (the probes failed)
		// or, if the loop could not decide, steps aside as before.
		d := newDegradedTestAgent(t, 5*time.Minute)
		d.setHealthy(false)
		if err := d.health(); err != nil {
			t.Fatalf("deciding: %v", err)
		}
		d.now = d.now.Add(d.Mode.after + 2*d.Mode.probeTimeout)
		if err := d.health(); err == nil {
			t.Fatalf("undecided past the window: health nil, want the upstream error")
		}
	})
	t.Run("disabled", func(t *testing.T) {
		d := newDegradedTestAgent(t, 0)
		d.proxyErr = refused
		d.setHealthy(false)
		if err := d.health(); err == nil {
			t.Fatalf("with --degraded-decision-ttl=0: health nil, want the upstream error at once")
		}
		for range 40 {
			d.step(t, 250*time.Millisecond)
		}
		if d.Active() || d.probes != 0 {
			t.Fatalf("disabled: degraded %t after %d probes", d.Active(), d.probes)
		}
	})
}

// TestProbeVIP: any HTTP answer over TLS counts as kube-apiserver
// answering on kube-proxy's path, whatever its status or certificate; no
// answer does not.
func TestProbeVIP(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	addr := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "https://"))
	m := New(Config{}, &fakeUpstream{}, nil, func() {})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.probeVIP(ctx, addr); err != nil {
		t.Errorf("a 403 from an untrusted certificate: %v, want nil (it answers)", err)
	}
	srv.Close()
	if err := m.probeVIP(ctx, addr); err == nil {
		t.Errorf("a closed port: nil, want an error")
	}
}
