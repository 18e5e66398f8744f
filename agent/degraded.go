package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

// Degraded mode: when no kube-apiserver endpoint has answered the agent for
// a short while (degradedAfter) and kube-proxy's own path to the Service
// VIP fails too, handing the VIP back to kube-proxy would gain the pods
// nothing. The agent then keeps the redirect (while its listener and
// certificate are healthy) and:
//
//   - answers cached reads to callers kube-apiserver recently allowed the
//     same request (--degraded-decision-ttl; cache/access recall.go),
//     RV=0, not-older-than and watches served from the cache alike;
//   - answers consistent reads it would forward with kube-apiserver's
//     timeout status (504), and every other forwarded request with a fast
//     503 and Retry-After (watches: 429 and Retry-After, which client-go's
//     reflector retries from its resourceVersion instead of relisting).
//
// If kube-apiserver still answers through kube-proxy's path while the
// agent cannot reach it (a wrong CA, a partition between the agent and the
// endpoints), the pods are better off there: the agent steps aside, as it
// always did. It leaves degraded mode as soon as an endpoint is healthy.
//
// Until it knows which case it is in (at most degradedAfter plus one probe
// of kube-proxy's path after the last endpoint failed), the agent keeps
// the redirect: the pods would otherwise be sent to a path that fails too,
// and reads with a still valid 10 s decision would be lost meanwhile.
type degradedMode struct {
	// ttl is --degraded-decision-ttl; zero disables the mode.
	ttl time.Duration
	// after is how long no endpoint must have answered; probeTimeout
	// bounds one probe of kube-proxy's path.
	after, probeTimeout time.Duration
	// requestSync asks the interceptor for a sync (entering or leaving
	// the mode changes its health); vips lists the Service VIPs whose
	// kube-proxy path is probed.
	requestSync func()
	vips        func() []netip.Addr
	// since is when degraded mode began (Unix nanoseconds), 0 while the
	// agent is not degraded.
	since atomic.Int64
	// probes counts kube-proxy path probes by result (0: answered, 1:
	// failed).
	probes [2]atomic.Uint64

	mu sync.Mutex // protects the fields below
	// downSince is when no endpoint was first seen healthy (zero while
	// one is).
	downSince time.Time
	// probedAt is when kube-proxy's path was last probed (zero: not since
	// downSince); proxyErr is that probe's result, nil when kube-apiserver
	// answered there.
	probedAt time.Time
	proxyErr error
}

// kubeProxyProber checks kube-proxy's path to the Service VIP: nil when
// kube-apiserver answers there (probeKubeProxy; tests pass fakes).
type kubeProxyProber func(ctx context.Context) error

// degradedAfter is how long no upstream endpoint must have answered before
// degraded mode may start: two health periods, at least two seconds.
func (a *Agent) degradedAfter() time.Duration {
	return max(2*a.cfg.UpstreamHealthPeriod, 2*time.Second)
}

// Degraded returns when degraded mode began, and whether the agent is in
// it.
func (a *Agent) Degraded() (time.Time, bool) {
	ns := a.degraded.since.Load()
	return unixTime(ns), ns != 0
}

// degradedNow reports whether the agent is in degraded mode.
func (a *Agent) degradedNow() bool { return a.degraded.since.Load() != 0 }

// reviewsUnreachable reports whether a failed access review may be
// answered as in degraded mode (from a recent allow decision): no upstream
// endpoint is healthy and the agent is deciding whether to enter degraded
// mode. Deciding takes a few seconds in which the agent keeps the
// redirect; a read whose review failed meanwhile would fail with it. The
// review must have failed too: endpoint health alone never switches
// reviews off.
func (a *Agent) reviewsUnreachable() bool {
	if a.degradedNow() {
		return true
	}
	if a.degraded.ttl <= 0 {
		return false
	}
	err := a.up.healthy()
	return err != nil && a.degraded.covers(a.now(), err) == nil
}

// covers decides whether an agent without a healthy upstream endpoint (the
// health error err) keeps intercepting, and returns nil if it does, else
// the reason it does not. It does not block.
func (m *degradedMode) covers(now time.Time, err error) error {
	if m.ttl <= 0 {
		return err
	}
	if m.since.Load() != 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.downSince.IsZero() {
		m.downSince = now
	}
	switch {
	case !m.probedAt.IsZero() && m.proxyErr == nil:
		return interception.StepAside(fmt.Sprintf("%v; kube-apiserver answers through kube-proxy's path, so the pods are sent there", err))
	case now.Sub(m.downSince) < m.after+2*m.probeTimeout:
		// Deciding: is this an outage the pods suffer anyway?
		return nil
	}
	return err
}

// stepDegraded looks at the upstream endpoints once, at now, probing
// kube-proxy's path when that decides anything, and enters or leaves
// degraded mode. recheck is how often kube-proxy's path is probed again
// while no endpoint is healthy.
func (a *Agent) stepDegraded(ctx context.Context, now time.Time, recheck time.Duration, probe kubeProxyProber) {
	m := &a.degraded
	if m.ttl <= 0 {
		return
	}
	logger := klog.FromContext(ctx)
	if a.up.healthy() == nil {
		m.mu.Lock()
		m.downSince, m.probedAt, m.proxyErr = time.Time{}, time.Time{}, nil
		m.mu.Unlock()
		if since := m.since.Swap(0); since != 0 {
			logger.Info("Leaving degraded mode: an upstream endpoint answers", "degradedSince", unixTime(since).UTC(),
				"duration", now.Sub(unixTime(since)).Round(time.Millisecond), "upstream", a.up.pick().Host)
			a.degraded.requestSync()
		}
		return
	}
	m.mu.Lock()
	if m.downSince.IsZero() {
		m.downSince = now
	}
	due := m.probedAt.IsZero() || now.Sub(m.probedAt) >= recheck
	m.mu.Unlock()
	if !due {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, m.probeTimeout)
	err := probe(pctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	m.probes[b2i(err != nil)].Add(1)
	m.mu.Lock()
	m.probedAt, m.proxyErr = now, err
	m.mu.Unlock()
	quiet := now.Sub(a.up.lastAnswer())
	switch {
	case err == nil:
		if since := m.since.Swap(0); since != 0 {
			logger.Info("Leaving degraded mode: kube-apiserver answers through kube-proxy's path, not to the agent; handing the VIP back to kube-proxy",
				"degradedSince", unixTime(since).UTC(), "upstream", a.up.healthy())
		} else {
			logger.Info("kube-apiserver answers through kube-proxy's path, not to the agent; handing the VIP back to kube-proxy",
				"upstream", a.up.healthy())
		}
		a.degraded.requestSync()
	case m.since.Load() != 0:
		logger.V(2).Info("Still degraded: kube-proxy's path fails too", "err", err)
	case quiet >= m.after:
		m.since.Store(now.UnixNano())
		logger.Error(a.up.healthy(), "Entering degraded mode: no kube-apiserver endpoint answers, through the agent or kube-proxy's path; "+
			"answering cached reads to callers with a recent allow decision, failing everything else fast",
			"decisionTTL", m.ttl, "kubeProxyPath", err.Error(), "lastAnswer", quiet.Round(time.Millisecond))
		a.degraded.requestSync()
	default:
		// kube-proxy's path fails, but an endpoint answered too recently:
		// probe again at the next look.
		m.mu.Lock()
		m.probedAt = time.Time{}
		m.mu.Unlock()
	}
}

// runDegraded decides on degraded mode every liveness interval until ctx
// ends.
func (a *Agent) runDegraded(ctx context.Context) {
	if a.degraded.ttl <= 0 {
		return
	}
	t := time.NewTicker(a.cfg.LivenessInterval())
	defer t.Stop()
	recheck := max(a.cfg.UpstreamHealthPeriod, time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.stepDegraded(ctx, a.now(), recheck, a.probeKubeProxy)
	}
}

// probeKubeProxy checks whether kube-apiserver answers through kube-proxy's
// path: a connection to a Service VIP with the agent's socket mark, which
// its own chain lets through to kube-proxy's rules, as its upstream
// connections are. Any HTTP answer to GET /readyz over TLS counts,
// whatever its status and certificate: the question is whether the pods
// would reach kube-apiserver there, not whether the agent trusts it (a
// wrong --upstream-ca-file must not make the agent keep the pods). A
// connection that lands on an agent instead answers too, and so keeps the
// agent out of degraded mode: the safe side.
func (a *Agent) probeKubeProxy(ctx context.Context) error {
	var errs []error
	for _, vip := range a.degraded.vips() {
		err := a.probeVIP(ctx, netip.AddrPortFrom(vip, a.cfg.ServicePort))
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return errors.New("no Service VIP to probe")
	}
	return errors.Join(errs...)
}

// probeVIP sends GET /readyz to addr with the socket mark and returns nil
// on any HTTP answer.
func (a *Agent) probeVIP(ctx context.Context, addr netip.AddrPort) error {
	dialer := &net.Dialer{Control: markSocket(a.cfg.SocketMark)}
	t := &http.Transport{
		Proxy:       nil,
		DialContext: dialer.DialContext,
		TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // only whether something answers matters; nothing secret is sent
			MinVersion:         tls.VersionTLS12,
		},
		DisableKeepAlives: true,
	}
	defer t.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr.String()+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("kube-proxy's path to %s: %w", addr, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return nil
}

// degradedRetryAfter is the Retry-After of the fast failures of degraded
// mode, in seconds.
const degradedRetryAfter = 1

// failFastWhenDegraded answers, in degraded mode, the requests next would
// forward, without trying: consistent reads get kube-apiserver's timeout
// status (504, as its request timeout writes it), watches 429 with
// Retry-After (client-go resumes them from their resourceVersion, where
// 503 would make informers relist), everything else 503 with Retry-After.
// Outside degraded mode it is next.
func (a *Agent) failFastWhenDegraded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.degradedNow() {
			next.ServeHTTP(w, r)
			return
		}
		info, _ := request.RequestInfoFrom(r.Context())
		switch {
		case info != nil && info.IsResourceRequest && (info.Verb == "get" || info.Verb == "list") && isConsistentRead(r):
			writeStatus(w, r, apierrors.NewTimeoutError("request did not complete within the allotted timeout", 0))
		case info != nil && info.Verb == "watch":
			writeStatus(w, r, apierrors.NewTooManyRequests("kube-apiserver is unreachable (the node-local API proxy is in degraded mode); retry the watch", degradedRetryAfter))
		default:
			err := apierrors.NewServiceUnavailable("kube-apiserver is unreachable (the node-local API proxy is in degraded mode, serving only cached reads)")
			err.ErrStatus.Details = &metav1.StatusDetails{RetryAfterSeconds: degradedRetryAfter}
			writeStatus(w, r, err)
		}
	})
}

// isConsistentRead reports whether a get or list asks for the most recent
// data: no resourceVersion (and no continue token, which carries one).
func isConsistentRead(r *http.Request) bool {
	q := r.URL.Query()
	return q.Get("resourceVersion") == "" && q.Get("continue") == ""
}

// degradedNote tells /readyz and /intercepting that the agent is
// degraded, and since when; "" otherwise.
func (a *Agent) degradedNote() string {
	since, ok := a.Degraded()
	if !ok {
		return ""
	}
	return fmt.Sprintf("degraded since %s (%s): kube-apiserver unreachable, through the agent and kube-proxy's path; cached reads are answered to callers allowed within %s",
		since.UTC().Format(time.RFC3339), a.now().Sub(since).Round(time.Second), a.degraded.ttl)
}

var (
	degradedDesc = prometheus.NewDesc("kube_apicache_degraded",
		"1 while the agent is in degraded mode (kube-apiserver unreachable through the agent and through kube-proxy's path), else 0.",
		nil, nil)
	degradedSinceDesc = prometheus.NewDesc("kube_apicache_degraded_since_timestamp_seconds",
		"When the current degraded mode began (0: not degraded).",
		nil, nil)
	kubeProxyProbesDesc = prometheus.NewDesc("kube_apicache_kube_proxy_path_probes_total",
		"Probes of kube-proxy's path to the Service VIP (a socket-marked GET /readyz), made while no upstream endpoint is healthy, by result (answered, failed).",
		[]string{"result"}, nil)
)

// degradedCollector exports the degraded mode's state.
type degradedCollector struct{ m *degradedMode }

func (c degradedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- degradedDesc
	ch <- degradedSinceDesc
	ch <- kubeProxyProbesDesc
}

func (c degradedCollector) Collect(ch chan<- prometheus.Metric) {
	since := c.m.since.Load()
	ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, float64(b2i(since != 0)))
	ch <- prometheus.MustNewConstMetric(degradedSinceDesc, prometheus.GaugeValue, float64(since)/1e9)
	for i, result := range []string{"answered", "failed"} {
		ch <- prometheus.MustNewConstMetric(kubeProxyProbesDesc, prometheus.CounterValue, float64(c.m.probes[i].Load()), result)
	}
}

// lastAnswer is when any endpoint last answered (zero: none ever did).
func (u *upstreams) lastAnswer() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	var last int64
	for _, ep := range u.endpoints {
		last = max(last, ep.lastSuccess.Load())
	}
	return unixTime(last)
}
