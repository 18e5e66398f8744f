package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// Health of the upstream endpoints comes first from the traffic the agent
// sends anyway, and only then from probes.
//
//   - Every answer under 500, and every byte of such an answer's body (a
//     watch's events and bookmarks), is a success of its endpoint. The
//     agent's own informers, reviews and EndpointSlice watch go through the
//     same transport as forwarded requests, so an idle node still sees
//     kube-apiserver's watch bookmarks (about one a minute per watch).
//   - A connection that cannot be made, and a response body that breaks off
//     (neither a clean end nor the caller going away), is a failure: the
//     endpoint is marked unhealthy at once and probed straight away.
//   - Open HTTP/2 connections are pinged once they have been silent for a
//     health period, and closed when the ping is not answered within the
//     probe timeout (the transport's HTTP2Config). A dead or hung apiserver
//     therefore breaks every stream to it within about two health periods,
//     which is the failure above, however quiet its watches were. Pings are
//     HTTP/2 frames: kube-apiserver answers them without running a request
//     (no authentication, audit or admission).
//   - An endpoint is probed (GET /readyz) only when nothing proved it for
//     successWindow (plus jitter); when a 5xx answer came since its last
//     success (at most once a health period); while it fails (every health
//     period, backing off to failingProbeMax while another endpoint is
//     healthy); and, after a failover, when the new active endpoint's last
//     success is older than a period.
//
// An open watch alone never keeps an endpoint healthy: it must bring bytes
// within the window, or the endpoint is probed.

// successWindow is how long a success spares an endpoint its /readyz probe.
// Longer than kube-apiserver's bookmark interval (one minute), so that the
// agent's own watches keep the active endpoint proven on an idle node, and
// long enough that probing the standby endpoints of a three-apiserver
// control plane costs under one request a minute per node.
const successWindow = 2 * time.Minute

// windowJitter spreads the probes of agents that started together: the
// window of each endpoint is drawn again after each probe, up to this
// fraction longer.
const windowJitter = 0.25

// failingProbeMax bounds the back-off between probes of a failing endpoint
// while another endpoint is healthy. With none healthy, a failing endpoint
// is probed every health period, so interception resumes soon after an
// apiserver returns.
const failingProbeMax = 30 * time.Second

// probeReason says why an endpoint was probed, for metrics and logs.
type probeReason int

const (
	probeUnchecked probeReason = iota // never checked yet
	probeStale                        // no success within its window
	probeSuspect                      // a failure or a 5xx answer since its last success
	probeFailing                      // failed before; probed until it recovers
	probeFailover                     // became active with an old success
	numProbeReasons
	probeAll = numProbeReasons // checkAll (tests): counted, not exported
)

var probeReasonNames = [numProbeReasons + 1]string{"unchecked", "no-recent-success", "suspect", "failing", "failover", "all"}

// healthStats counts health evidence for metrics.
type healthStats struct {
	probes          [numProbeReasons + 1][2]atomic.Uint64 // [reason][0: ok, 1: failed]
	passiveFailures atomic.Uint64
}

// healthTiming returns the health period and success window, with defaults
// for a Set built without them (tests).
func (u *Set) healthTiming() (period, window time.Duration) {
	period, window = u.period, u.window
	if period <= 0 {
		period = DefaultHealthPeriod
	}
	if window <= 0 {
		window = successWindow
	}
	return period, window
}

// ProbeTimeout is how long one probe, and one HTTP/2 ping, may take.
func ProbeTimeout(period time.Duration) time.Duration {
	return min(max(period, time.Second), 5*time.Second)
}

func (u *Set) clock() time.Time {
	if u.now != nil {
		return u.now()
	}
	return time.Now()
}

// wake asks the health loop to look at the endpoints now.
func (u *Set) wake() {
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// succeeded records a success of ep at now. It takes no lock: it runs for
// every response and every read of a response body.
func (ep *endpoint) succeeded(now time.Time) {
	ep.lastSuccess.Store(now.UnixNano())
}

// observe records what a response with status code says about ep.
func (ep *endpoint) observe(code int, now time.Time) {
	if code >= http.StatusInternalServerError {
		ep.lastTrouble.Store(now.UnixNano())
		return
	}
	ep.succeeded(now)
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// due reports why ep needs a probe at now, if it does. anyHealthy tells
// whether some endpoint is healthy. u.mu must be held.
func (u *Set) due(ep *endpoint, now time.Time, anyHealthy bool) (probeReason, bool) {
	period, window := u.healthTiming()
	if ep.probing {
		return 0, false
	}
	if !ep.checked {
		return probeUnchecked, true
	}
	if !ep.healthy {
		interval := period
		if anyHealthy && ep.failures > 1 {
			interval = min(period<<min(ep.failures-1, 16), max(failingProbeMax, period))
		}
		if ep.probeNow || now.Sub(ep.lastProbe) >= interval {
			return probeFailing, true
		}
		return 0, false
	}
	if ep.probeNow {
		return probeFailover, true
	}
	last := ep.lastSuccess.Load()
	if now.Sub(unixTime(last)) >= window+ep.jitter {
		return probeStale, true
	}
	if ep.lastTrouble.Load() > last && now.Sub(ep.lastProbe) >= period {
		return probeSuspect, true
	}
	return 0, false
}

// Run probes the endpoints that need it, looking at once, then every
// health period (jittered) and whenever a failure is reported or an
// endpoint added, until ctx ends.
func (u *Set) Run(ctx context.Context, period time.Duration) {
	timeout := ProbeTimeout(period)
	u.probeDue(ctx, timeout)
	for {
		t := time.NewTimer(wait.Jitter(period, 0.2))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-u.kick:
			t.Stop()
		}
		u.probeDue(ctx, timeout)
	}
}

// probeDue probes every endpoint that needs it now, and reports whether
// anything changed.
func (u *Set) probeDue(ctx context.Context, timeout time.Duration) bool {
	now := u.clock()
	u.mu.Lock()
	anyHealthy := slices.ContainsFunc(u.endpoints, func(ep *endpoint) bool { return ep.healthy })
	var eps []*endpoint
	var reasons []probeReason
	for _, ep := range u.endpoints {
		if r, ok := u.due(ep, now, anyHealthy); ok {
			eps = append(eps, ep)
			reasons = append(reasons, r)
		}
	}
	u.mu.Unlock()
	if len(eps) == 0 {
		return false
	}
	return u.probe(ctx, eps, reasons, timeout)
}

// checkAll probes every endpoint now and records the results, as probeDue
// does. It reports whether anything changed.
func (u *Set) checkAll(ctx context.Context, timeout time.Duration) bool {
	u.mu.Lock()
	eps := slices.Clone(u.endpoints)
	u.mu.Unlock()
	reasons := make([]probeReason, len(eps))
	for i := range reasons {
		reasons[i] = probeAll
	}
	return u.probe(ctx, eps, reasons, timeout)
}

// probe checks eps concurrently and records the results: the active
// endpoint moves to a healthy one if it failed, and the streams of an
// endpoint that failed deadAfter probes in a row are ended. It reports
// whether anything changed.
func (u *Set) probe(ctx context.Context, eps []*endpoint, reasons []probeReason, timeout time.Duration) bool {
	_, window := u.healthTiming()
	started := u.clock()
	u.mu.Lock()
	for _, ep := range eps {
		ep.probing, ep.probeNow, ep.lastProbe = true, false, started
	}
	u.mu.Unlock()
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			errs[i] = u.check(cctx, ep.url)
		})
	}
	wg.Wait()
	now := u.clock()
	u.mu.Lock()
	for _, ep := range eps {
		ep.probing = false
	}
	if ctx.Err() != nil {
		u.mu.Unlock()
		return false
	}
	logger := klog.FromContext(ctx)
	changed := false
	var cancels []context.CancelFunc
	for i, ep := range eps {
		ok := errs[i] == nil
		u.stats.probes[reasons[i]][b2i(!ok)].Add(1)
		if u.find(ep.url.Host) != ep {
			continue // removed meanwhile
		}
		logger.V(4).Info("Probed upstream endpoint", "endpoint", ep.url.Host, "reason", probeReasonNames[reasons[i]], "err", errs[i])
		if ok != ep.healthy || !ep.checked {
			changed = true
			if ok {
				logger.Info("Upstream endpoint healthy", "endpoint", ep.url.Host)
			} else {
				logger.Info("Upstream endpoint unhealthy", "endpoint", ep.url.Host, "err", errs[i])
			}
		}
		ep.healthy, ep.checked, ep.lastErr = ok, true, errs[i]
		ep.jitter = wait.Jitter(window, windowJitter) - window
		if ok {
			ep.succeeded(now)
			ep.failures = 0
			continue
		}
		ep.failures++
		if ep.failures == deadAfter {
			for _, c := range ep.inflight {
				cancels = append(cancels, c)
			}
		}
	}
	if u.failoverLocked(logger, now) {
		changed = true
	}
	u.mu.Unlock()
	if len(cancels) > 0 {
		logger.Info("Ending requests in flight to a dead upstream endpoint", "count", len(cancels))
	}
	for _, c := range cancels {
		c()
	}
	if changed && u.OnChange != nil {
		u.OnChange()
	}
	return changed
}

// failoverLocked makes a healthy endpoint active if the active one is not,
// and reports whether it did. The new active endpoint is probed at once if
// its last success is older than a health period: its health may be as
// old as the success window. u.mu must be held.
func (u *Set) failoverLocked(logger klog.Logger, now time.Time) bool {
	cur := u.endpoints[u.active]
	if cur.healthy {
		return false
	}
	for i, ep := range u.endpoints {
		if !ep.healthy {
			continue
		}
		logger.Info("Failing over to another upstream endpoint", "from", cur.url.Host, "to", ep.url.Host)
		u.active = i
		if period, _ := u.healthTiming(); now.Sub(unixTime(ep.lastSuccess.Load())) > period {
			ep.probeNow = true
			u.wake()
		}
		return true
	}
	return false
}

// reportFailure marks host unhealthy after a request to it failed, so new
// requests go elsewhere, and has the health loop probe it at once: a
// Healthy endpoint is back after one probe.
func (u *Set) reportFailure(logger klog.Logger, host string, err error) {
	u.stats.passiveFailures.Add(1)
	u.mu.Lock()
	ep := u.find(host)
	changed := ep != nil && ep.healthy
	if ep != nil {
		ep.healthy, ep.checked, ep.lastErr = false, true, err
		ep.probeNow = true
		if changed {
			logger.Info("Upstream endpoint unhealthy: a request to it failed", "endpoint", host, "err", err)
			u.failoverLocked(logger, u.clock())
		}
	}
	u.mu.Unlock()
	if ep != nil {
		u.wake()
	}
	if changed && u.OnChange != nil {
		u.OnChange()
	}
}

// check probes one endpoint: the TLS handshake must verify and /readyz must
// answer. The probe is anonymous, so 401 and 403 (anonymous auth off, or
// /readyz not public) still prove a live, genuine apiserver.
func (u *Set) check(ctx context.Context, ep *url.URL) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.JoinPath("/readyz").String(), nil)
	if err != nil {
		return err
	}
	resp, err := u.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusUnauthorized, http.StatusForbidden:
		return nil
	}
	return fmt.Errorf("GET %s/readyz: %s", ep.Host, resp.Status)
}

// WaitHealthy checks the endpoints until one answers or timeout passes, and
// makes the first healthy one active.
func (u *Set) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var errs []error
	for {
		errs = errs[:0]
		u.mu.Lock()
		eps := slices.Clone(u.endpoints)
		u.mu.Unlock()
		for i, ep := range eps {
			err := u.check(ctx, ep.url)
			u.stats.probes[probeUnchecked][b2i(err != nil)].Add(1)
			u.mu.Lock()
			ep.healthy, ep.checked, ep.lastErr = err == nil, true, err
			if err == nil {
				ep.succeeded(u.clock())
				u.active = i
			}
			u.mu.Unlock()
			if err == nil {
				logger.V(2).Info("Upstream healthy", "endpoint", ep.url.Host)
				return nil
			}
			logger.V(2).Info("Upstream not healthy yet", "endpoint", ep.url.Host, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", ep.url.Host, err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no upstream answered within %s: %w", timeout, errors.Join(errs...))
		case <-time.After(time.Second):
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// observedBody is a response body from ep. Each read that brings bytes of
// an answer under 500 is a success of ep; a read that fails while neither
// the caller nor the agent ended the request, and the body was not closed,
// is a failure of ep (the connection broke, or its ping went unanswered).
type observedBody struct {
	io.ReadCloser
	up   *Set
	ep   *endpoint
	ctx  context.Context // the request's, ended by the caller or the agent
	good bool            // the status was under 500
	// closed is set before the body is closed: a read that fails because
	// its own caller closed the body is no failure of the endpoint.
	closed   atomic.Bool
	once     sync.Once
	reported atomic.Bool
	// flight is the request, ended when the body is closed.
	flight *inflightReq
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.good {
		b.ep.succeeded(b.up.clock())
	}
	if err != nil && err != io.EOF && b.ctx.Err() == nil && !b.closed.Load() && b.reported.CompareAndSwap(false, true) {
		switch {
		case IsPeerReset(err):
			// The endpoint reset this one stream: kube-apiserver does so
			// when a handler aborts (a pod's proxied or streamed response
			// broken off by the pod, which any tenant can arrange), while
			// the connection and every other request on it are fine. The
			// reset is the endpoint's own answer: it says nothing of its
			// health, and a tenant's loop of them costs no probe.
		case isStreamReset(err):
			// A stream error the client side raised (flow control, a
			// protocol violation): the endpoint is suspect, probed within
			// a period unless something it answers meanwhile proves it.
			b.ep.lastTrouble.Store(b.up.clock().UnixNano())
			b.up.wake()
		default:
			b.up.reportFailure(klog.FromContext(b.ctx), b.ep.url.Host, fmt.Errorf("response body broke off: %w", err))
		}
	}
	return n, err
}

// isStreamReset reports whether err ended one HTTP/2 stream rather than
// its connection. net/http's HTTP/2 client does not export its stream
// error type; its message is "stream error: stream ID N; CODE...".
func isStreamReset(err error) bool {
	return strings.HasPrefix(err.Error(), "stream error: ")
}

// IsPeerReset reports whether err is a stream reset the endpoint sent
// (RST_STREAM): net/http's HTTP/2 client ends those messages with
// "received from peer", and its own stream errors without.
func IsPeerReset(err error) bool {
	return err != nil && isStreamReset(err) && strings.HasSuffix(err.Error(), "; received from peer")
}

func (b *observedBody) Close() error {
	b.closed.Store(true)
	err := b.ReadCloser.Close()
	b.once.Do(b.flight.end)
	return err
}

// healthCollector reports the health evidence of the upstream endpoints.
type healthCollector struct{ up *Set }

var (
	upstreamProbesDesc = prometheus.NewDesc("kube_apicache_upstream_probes_total",
		"Active /readyz probes of kube-apiserver endpoints, by why the endpoint was probed (unchecked, no-recent-success, suspect, failing, failover) and result (ok, failed).",
		[]string{"reason", "result"}, nil)
	upstreamPassiveFailuresDesc = prometheus.NewDesc("kube_apicache_upstream_passive_failures_total",
		"Requests to kube-apiserver endpoints whose connection failed or whose response broke off, each marking its endpoint unhealthy until a probe passes.",
		nil, nil)
	upstreamLastSuccessDesc = prometheus.NewDesc("kube_apicache_upstream_endpoint_last_success_timestamp_seconds",
		"When the endpoint last answered: a response under 500, bytes of one (watch events and bookmarks included), or a passed probe (0: never).",
		[]string{"endpoint"}, nil)
)

// healthCollector returns the collector of the health metrics.
func (u *Set) healthCollector() prometheus.Collector { return &healthCollector{up: u} }

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upstreamProbesDesc
	ch <- upstreamPassiveFailuresDesc
	ch <- upstreamLastSuccessDesc
}

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	st := &c.up.stats
	for r := range numProbeReasons {
		for i, result := range []string{"ok", "failed"} {
			ch <- prometheus.MustNewConstMetric(upstreamProbesDesc, prometheus.CounterValue, float64(st.probes[r][i].Load()), probeReasonNames[r], result)
		}
	}
	ch <- prometheus.MustNewConstMetric(upstreamPassiveFailuresDesc, prometheus.CounterValue, float64(st.passiveFailures.Load()))
	c.up.mu.Lock()
	type sample struct {
		host string
		last int64
	}
	samples := make([]sample, len(c.up.endpoints))
	for i, ep := range c.up.endpoints {
		samples[i] = sample{ep.url.Host, ep.lastSuccess.Load()}
	}
	c.up.mu.Unlock()
	for _, s := range samples {
		ch <- prometheus.MustNewConstMetric(upstreamLastSuccessDesc, prometheus.GaugeValue, float64(s.last)/1e9, s.host)
	}
}
