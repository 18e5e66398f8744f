package degraded

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

// Degraded mode: when no kube-apiserver endpoint has answered the agent for
// a short while (two health periods) and kube-proxy's own path to the Service
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
// Until it knows which case it is in (at most two health periods plus one probe
// of kube-proxy's path after the last endpoint failed), the agent keeps
// the redirect: the pods would otherwise be sent to a path that fails too,
// and reads with a still valid 10 s decision would be lost meanwhile.
type Mode struct {
	// cfg is fixed at construction; up is the upstream set whose health
	// decides; now is the clock.
	cfg Config
	up  Upstream
	now func() time.Time
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

// Upstream is what degraded mode reads of the upstream set.
type Upstream interface {
	// Healthy returns nil while an endpoint is healthy, else why none is.
	Healthy() error
	// LastAnswer is when any endpoint last answered (zero: never).
	LastAnswer() time.Time
	// Pick is the endpoint requests go to, for logs.
	Pick() *url.URL
}

// Config is degraded mode's part of the agent's configuration.
type Config struct {
	// TTL is --degraded-decision-ttl; zero disables the mode.
	TTL time.Duration
	// HealthPeriod is the upstream health period: no endpoint answered for
	// two of them (at least two seconds) may start the mode.
	HealthPeriod time.Duration
	// Interval is how often the mode is decided (the liveness interval);
	// ProbeTimeout bounds one probe of kube-proxy's path.
	Interval, ProbeTimeout time.Duration
	// ServicePort and DialControl (which sets the socket mark the
	// redirect lets through) reach kube-proxy's path to the VIPs.
	ServicePort uint16
	DialControl func(network, address string, c syscall.RawConn) error
}

// New returns the mode, off until Run finds the outage. vips lists the
// Service VIPs whose kube-proxy path is probed; requestSync asks the
// interceptor for a sync when the mode changes (its health changes with
// it).
func New(cfg Config, up Upstream, vips func() []netip.Addr, requestSync func()) *Mode {
	return &Mode{
		cfg: cfg, up: up, now: time.Now, ttl: cfg.TTL,
		after:        max(2*cfg.HealthPeriod, 2*time.Second),
		probeTimeout: cfg.ProbeTimeout,
		vips:         vips, requestSync: requestSync,
	}
}

// kubeProxyProber checks kube-proxy's path to the Service VIP: nil when
// kube-apiserver answers there (probeKubeProxy; tests pass fakes).
type kubeProxyProber func(ctx context.Context) error

// Since returns when degraded mode began, and whether the agent is in
// it.
func (m *Mode) Since() (time.Time, bool) {
	ns := m.since.Load()
	return time.Unix(0, ns), ns != 0
}

// Active reports whether the agent is in degraded mode.
func (m *Mode) Active() bool { return m.since.Load() != 0 }

// ReviewsUnreachable reports whether a failed access review may be
// answered as in degraded mode (from a recent allow decision): no upstream
// endpoint is healthy and the agent is deciding whether to enter degraded
// mode. Deciding takes a few seconds in which the agent keeps the
// redirect; a read whose review failed meanwhile would fail with it. The
// review must have failed too: endpoint health alone never switches
// reviews off.
func (m *Mode) ReviewsUnreachable() bool {
	if m.Active() {
		return true
	}
	if m.ttl <= 0 {
		return false
	}
	err := m.up.Healthy()
	return err != nil && m.Covers(m.now(), err) == nil
}

// Covers decides whether an agent without a healthy upstream endpoint (the
// health error err) keeps intercepting, and returns nil if it does, else
// the reason it does not. It does not block.
func (m *Mode) Covers(now time.Time, err error) error {
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

// step looks at the upstream endpoints once, at now, probing
// kube-proxy's path when that decides anything, and enters or leaves
// degraded mode. recheck is how often kube-proxy's path is probed again
// while no endpoint is healthy.
func (m *Mode) step(ctx context.Context, now time.Time, recheck time.Duration, probe kubeProxyProber) {
	if m.ttl <= 0 {
		return
	}
	logger := klog.FromContext(ctx)
	if m.up.Healthy() == nil {
		m.mu.Lock()
		m.downSince, m.probedAt, m.proxyErr = time.Time{}, time.Time{}, nil
		m.mu.Unlock()
		if since := m.since.Swap(0); since != 0 {
			logger.Info("Leaving degraded mode: an upstream endpoint answers", "degradedSince", time.Unix(0, since).UTC(),
				"duration", now.Sub(time.Unix(0, since)).Round(time.Millisecond), "upstream", m.up.Pick().Host)
			m.requestSync()
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
	failed := 0
	if err != nil {
		failed = 1
	}
	m.probes[failed].Add(1)
	m.mu.Lock()
	m.probedAt, m.proxyErr = now, err
	m.mu.Unlock()
	quiet := now.Sub(m.up.LastAnswer())
	switch {
	case err == nil:
		if since := m.since.Swap(0); since != 0 {
			logger.Info("Leaving degraded mode: kube-apiserver answers through kube-proxy's path, not to the agent; handing the VIP back to kube-proxy",
				"degradedSince", time.Unix(0, since).UTC(), "upstream", m.up.Healthy())
		} else {
			logger.Info("kube-apiserver answers through kube-proxy's path, not to the agent; handing the VIP back to kube-proxy",
				"upstream", m.up.Healthy())
		}
		m.requestSync()
	case m.since.Load() != 0:
		logger.V(2).Info("Still degraded: kube-proxy's path fails too", "err", err)
	case quiet >= m.after:
		m.since.Store(now.UnixNano())
		logger.Error(m.up.Healthy(), "Entering degraded mode: no kube-apiserver endpoint answers, through the agent or kube-proxy's path; "+
			"answering cached reads to callers with a recent allow decision, failing everything else fast",
			"decisionTTL", m.ttl, "kubeProxyPath", err.Error(), "lastAnswer", quiet.Round(time.Millisecond))
		m.requestSync()
	default:
		// kube-proxy's path fails, but an endpoint answered too recently:
		// probe again at the next look.
		m.mu.Lock()
		m.probedAt = time.Time{}
		m.mu.Unlock()
	}
}

// Run decides on degraded mode every interval until ctx ends.
func (m *Mode) Run(ctx context.Context) {
	if m.ttl <= 0 {
		return
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	recheck := max(m.cfg.HealthPeriod, time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.step(ctx, m.now(), recheck, m.probeKubeProxy)
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
func (m *Mode) probeKubeProxy(ctx context.Context) error {
	var errs []error
	for _, vip := range m.vips() {
		err := m.probeVIP(ctx, netip.AddrPortFrom(vip, m.cfg.ServicePort))
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
func (m *Mode) probeVIP(ctx context.Context, addr netip.AddrPort) error {
	dialer := &net.Dialer{Control: m.cfg.DialControl}
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

// Note tells /readyz and /intercepting that the agent is degraded, and
// since when; "" otherwise.
func (m *Mode) Note() string {
	since, ok := m.Since()
	if !ok {
		return ""
	}
	return fmt.Sprintf("degraded since %s (%s): kube-apiserver unreachable, through the agent and kube-proxy's path; cached reads are answered to callers allowed within %s",
		since.UTC().Format(time.RFC3339), m.now().Sub(since).Round(time.Second), m.ttl)
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

// Collector exports the mode's state, read at scrape time.
func (m *Mode) Collector() prometheus.Collector { return degradedCollector{m} }

// degradedCollector is Collector.
type degradedCollector struct{ m *Mode }

func (c degradedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- degradedDesc
	ch <- degradedSinceDesc
	ch <- kubeProxyProbesDesc
}

func (c degradedCollector) Collect(ch chan<- prometheus.Metric) {
	since := c.m.since.Load()
	ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, b2f(since != 0))
	ch <- prometheus.MustNewConstMetric(degradedSinceDesc, prometheus.GaugeValue, float64(since)/1e9)
	for i, result := range []string{"answered", "failed"} {
		ch <- prometheus.MustNewConstMetric(kubeProxyProbesDesc, prometheus.CounterValue, float64(c.m.probes[i].Load()), result)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
