package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

// degradedTestAgent is an agent with one upstream endpoint whose health the
// test sets, and a fake kube-proxy path.
type degradedTestAgent struct {
	*Agent
	ep       *endpoint
	now      time.Time
	proxyErr error // what the kube-proxy path probe returns
	probes   int
}

func newDegradedTestAgent(t *testing.T, ttl time.Duration) *degradedTestAgent {
	t.Helper()
	u, _ := url.Parse("https://10.0.0.1:6443")
	ep := newEndpoint(u)
	up := &upstreams{endpoints: []*endpoint{ep}}
	d := &degradedTestAgent{ep: ep, now: time.Unix(1_800_000_000, 0)}
	a := &Agent{cfg: &Config{Config: interception.Config{LivenessTimeout: time.Second}, UpstreamHealthPeriod: 2 * time.Second, DegradedDecisionTTL: ttl},
		up: up, metrics: newMetrics(), now: func() time.Time { return d.now }}
	a.degraded.ttl, a.degraded.after, a.degraded.probeTimeout = ttl, a.degradedAfter(), a.cfg.ProbeTimeout()
	a.degraded.requestSync = func() {}
	d.Agent = a
	d.setHealthy(true)
	return d
}

func (d *degradedTestAgent) setHealthy(ok bool) {
	d.up.mu.Lock()
	defer d.up.mu.Unlock()
	d.ep.healthy, d.ep.checked = ok, true
	d.ep.lastErr = nil
	if ok {
		d.ep.succeeded(d.now)
	} else {
		d.ep.lastErr = errors.New("connection refused")
	}
}

// step advances the clock by dt and runs one look of the degraded loop.
func (d *degradedTestAgent) step(t *testing.T, dt time.Duration) {
	t.Helper()
	d.now = d.now.Add(dt)
	d.stepDegraded(context.Background(), d.now, time.Second, func(context.Context) error {
		d.probes++
		return d.proxyErr
	})
}

// health is the agent's verdict on the upstream part of its health.
func (d *degradedTestAgent) health() error {
	if err := d.up.healthy(); err != nil {
		return d.degraded.covers(d.now, err)
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
			if !d.reviewsUnreachable() {
				t.Fatalf("deciding: a failed review is not answered from recent decisions")
			}
			if d.degradedNow() {
				t.Fatalf("degraded %s after the last answer, want only after %s", d.now.Sub(d.up.lastAnswer()), d.degraded.after)
			}
		}
		// once no endpoint answered for degradedAfter, it is degraded,
		d.step(t, d.degraded.after)
		since, ok := d.Degraded()
		if !ok {
			t.Fatalf("not degraded %s after the last answer", d.now.Sub(d.up.lastAnswer()))
		}
		if !since.Equal(d.now) {
			t.Errorf("degraded since %v, want %v", since, d.now)
		}
		if err := d.health(); err != nil {
			t.Errorf("degraded: health %v, want nil", err)
		}
		if !strings.Contains(d.degradedNote(), since.UTC().Format(time.RFC3339)) {
			t.Errorf("note %q does not say since when", d.degradedNote())
		}
		// it stays degraded, probing kube-proxy's path now and then,
		probes := d.probes
		for range 10 {
			d.step(t, 250*time.Millisecond)
		}
		if !d.degradedNow() || d.probes-probes > 3 {
			t.Errorf("after 2.5s: degraded %t, %d probes of kube-proxy's path", d.degradedNow(), d.probes-probes)
		}
		// and leaves degraded mode as soon as an endpoint answers.
		d.setHealthy(true)
		d.step(t, 250*time.Millisecond)
		if d.degradedNow() {
			t.Errorf("still degraded with a healthy endpoint")
		}
		if d.degradedNote() != "" {
			t.Errorf("note %q after recovery", d.degradedNote())
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
		if d.degradedNow() || d.reviewsUnreachable() {
			t.Fatalf("degraded while kube-apiserver answers through kube-proxy")
		}
		// If kube-proxy's path fails later, the outage is everyone's.
		d.proxyErr = refused
		for range 8 {
			d.step(t, 250*time.Millisecond)
		}
		if !d.degradedNow() {
			t.Fatalf("not degraded once kube-proxy's path failed too")
		}
		// And if it answers again, the agent steps aside again.
		d.proxyErr = nil
		for range 8 {
			d.step(t, 250*time.Millisecond)
		}
		if d.degradedNow() {
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
		d.now = d.now.Add(d.degraded.after + 2*d.degraded.probeTimeout)
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
		if d.degradedNow() || d.probes != 0 {
			t.Fatalf("disabled: degraded %t after %d probes", d.degradedNow(), d.probes)
		}
	})
}

// TestDegradedFailFast: in degraded mode the requests that would be
// forwarded are answered at once, as kube-apiserver's absence makes them
// fail, never sent upstream.
func TestDegradedFailFast(t *testing.T) {
	sent := 0
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent++ }))
	defer upstream.Close()
	a := newTestAgent(t, upstream)
	a.degraded.since.Store(time.Now().UnixNano())
	front := httptest.NewServer(a.handler)
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
	a.degraded.since.Store(0)
	resp, err := http.Get(front.URL + "/api/v1/namespaces/ns/configmaps")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if sent != 1 {
		t.Errorf("%d requests forwarded after degraded mode ended, want 1", sent)
	}
}

// TestProbeVIP: any HTTP answer over TLS counts as kube-apiserver
// answering on kube-proxy's path, whatever its status or certificate; no
// answer does not.
func TestProbeVIP(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	addr := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "https://"))
	a := &Agent{cfg: &Config{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.probeVIP(ctx, addr); err != nil {
		t.Errorf("a 403 from an untrusted certificate: %v, want nil (it answers)", err)
	}
	srv.Close()
	if err := a.probeVIP(ctx, addr); err == nil {
		t.Errorf("a closed port: nil, want an error")
	}
}
