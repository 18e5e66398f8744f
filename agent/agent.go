// Package agent is the node-local API proxy: it serves TLS on a local
// address, redirects the kubernetes Service VIP to it, and relays requests to
// kube-apiserver with the caller's own credentials.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/audit"
	apicache "github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/cache/access"
)

// Agent runs the proxy and owns its node state (address, liveness sets,
// chains, jumps).
type Agent struct {
	// Fixed at construction.
	cfg          *Config
	cert         certSource
	up           *upstreams
	metrics      *metrics
	interception *interceptionMetrics
	// planes holds one redirect per IP family among the Service VIPs, each
	// with its own listen address.
	planes  []*dataplane
	backend string
	// dataplane is the backend the redirect runs in, and why; others are
	// the same redirects in the other backend, removed if found.
	dataplane, dataplaneReason string
	others                     []*dataplane
	othersCheckAt              time.Time
	probes                     *probes
	handler                    http.Handler
	// metricsServer serves MetricsBindAddress; nil when it is empty.
	metricsServer *metricsServer
	// cache answers covered reads; nil when no resource is cached.
	cache *apicache.Cache
	// audit records the requests the cache answers; off unless configured.
	audit *audit.Auditor
	// syncNow asks the run loop for a sync before the next tick.
	syncNow chan struct{}
	// local is what detect-local and the pod-path check learn from the
	// API (detectlocal.go).
	local *localPods
	// podPath checks interception as pods get it (podpath.go); nil when
	// off. lastLapse is when (Unix nanoseconds) a liveness refresh last came
	// so late that the entry may have expired.
	podPath   *podPath
	lastLapse atomic.Int64
	// syncSawUnhealthy is set by a sync that found the agent unhealthy, so
	// that the liveness loop asks for a sync as soon as it is healthy.
	syncSawUnhealthy atomic.Bool
	// started is when Run began and logger its logger; warmedUp is set
	// once the pinned resources have synced or the warm-up has timed out
	// (warmup); pinnedUnsynced lists the pinned resources not synced yet,
	// nil without a cache.
	started        time.Time
	logger         klog.Logger
	warmedUp       atomic.Bool
	pinnedUnsynced func() []string
	// disabled holds the kill switch's reason while interception is
	// turned off; service what the agent knows of the kubernetes Service,
	// against which it checks the configured VIPs and port (nil: not read
	// yet) (switches.go).
	disabled atomic.Pointer[string]
	service  atomic.Pointer[serviceCheck]
	// drain is cancelled when shutdown starts, which ends open watches so
	// their clients reconnect, now past the removed redirect.
	drain      context.Context
	startDrain context.CancelFunc
	now        func() time.Time

	// syncMu serializes the work on the node's netfilter rules and
	// addresses: syncs, the removal after a failed one, shutdown and
	// removeStale. It is held across exec'd iptables calls, which take
	// long on a node with a large nat table or a busy xtables lock. It
	// also protects the fields below.
	syncMu sync.Mutex
	// selfCheckErr is the last failed self-check; the redirect is not
	// installed again before retryAt. retryWait doubles with each failure.
	selfCheckErr error
	retryAt      time.Time
	retryWait    time.Duration

	// planeMu guards the liveness entries and each dataplane's active
	// flag. It is held only around netlink set operations, never across a
	// call to iptables, so the liveness refresher never waits for
	// netfilter: a slow sync cannot let the entries expire. A refresh
	// never runs between a failed check and the clearing it causes.
	// Lock order: syncMu before planeMu.
	planeMu sync.Mutex

	// clientCerts hands client-certificate callers to kube-apiserver.
	clientCerts *clientCertificates

	// degraded is the state of degraded mode (degraded.go).
	degraded degradedMode

	mu sync.Mutex // protects the fields below
	// notIntercepting is why the agent is not intercepting; nil while it
	// is.
	notIntercepting error
	// decided is set once the first sync has decided whether to
	// intercept; stopping once shutdown has begun. Between the two the
	// agent is ready: serving, or deliberately stepped aside.
	decided, stopping bool
	// lastSync is when the run loop last finished a sync.
	lastSync time.Time
}

// New checks cfg and loads what the agent needs from disk. It changes
// nothing on the node, except that on failure it removes what a dead
// predecessor left (see removeStale). k holds the kernel interfaces for
// rules, sets and the listen address.
func New(cfg *Config, k Kernel) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	drain, startDrain := context.WithCancel(context.Background())
	a := &Agent{
		cfg:             cfg,
		metrics:         newMetrics(),
		backend:         k.Backend,
		probes:          newProbes(),
		syncNow:         make(chan struct{}, 1),
		local:           newLocalPods(),
		drain:           drain,
		startDrain:      startDrain,
		now:             time.Now,
		notIntercepting: errors.New("starting"),
	}
	a.degraded.ttl, a.degraded.after, a.degraded.probeTimeout = cfg.DegradedDecisionTTL, a.degradedAfter(), a.probeTimeout()
	a.metrics.registry.MustRegister(buildInfo(), a.switchCollector(), a.serviceMismatchCollector(), degradedCollector{&a.degraded})
	if cfg.InterceptionDisabled {
		reason := "--interception=false (or interception.enabled: false in --config)"
		a.disabled.Store(&reason)
	}
	var err error
	if a.audit, err = audit.New(cfg.Audit, longRunning); err != nil {
		return nil, err
	}
	if err := a.buildDataplanes(k); err != nil {
		return nil, err
	}
	if a.cert, err = a.newCertSource(); err != nil {
		a.removeStale()
		return nil, err
	}
	if a.up, err = newUpstreams(cfg); err != nil {
		a.removeStale()
		return nil, err
	}
	a.up.onChange = a.requestSync
	a.interception = newInterceptionMetrics(a.metrics.registry, a.up)
	a.metrics.registry.MustRegister(a.up.healthCollector())
	if cfg.PodPathCheckInterval > 0 && k.Conntrack != nil {
		a.podPath = newPodPath(k.Conntrack, a.metrics.registry)
	}
	if err := a.newCache(); err != nil {
		a.removeStale()
		return nil, err
	}
	if cfg.MetricsBindAddress != "" {
		if a.metricsServer, err = a.newMetricsServer(); err != nil {
			a.removeStale()
			return nil, err
		}
	}
	a.handler = a.buildHandler()
	return a, nil
}

// buildHandler assembles the request path once, at start-up.
func (a *Agent) buildHandler() http.Handler {
	readOnly, mutating := a.cfg.Limits.withDefaults().inFlightShares()
	var observe func(*http.Response)
	if a.cache != nil {
		observe = a.cache.ObserveWrite
	}
	// In degraded mode nothing is forwarded: each request fails fast
	// (degraded.go), before it takes an in-flight slot.
	forward := a.metrics.instrument("forward", a.failFastWhenDegraded(
		a.limitInFlight("forward", newForwarder(a.up, observe), readOnly, mutating)))
	if a.cache != nil {
		// Covered reads of authorized callers are answered from the cache;
		// everything else goes to forward unchanged.
		forward = a.cache.Handler(forward, a.cacheHit)
	}
	return a.front(forward)
}

// cacheHit wraps the handler of the reads the cache answers. Cached reads
// have an in-flight bound of their own, so a slow upstream holding
// forwarded reads cannot starve them.
func (a *Agent) cacheHit(h http.Handler) http.Handler {
	readOnly, _ := a.cfg.Limits.withDefaults().inFlightShares()
	return a.metrics.instrument("cache", a.audit.Wrap(a.limitInFlight("cache", h, readOnly, noLimit)))
}

// front is what every request passes before h, which answers it from the
// cache or forwards it.
func (a *Agent) front(h http.Handler) http.Handler {
	lim := a.cfg.Limits.withDefaults()
	// Every request, cached or forwarded, counts against the long-running
	// bounds if it is long-running, and gets deadlines for its body and
	// its answer if it is not. Long-running requests whose body
	// kube-apiserver ignores have it dropped.
	h = withoutIgnoredBody(a.limitLongRunning(withBodyDeadline(a.withRequestTimeout(h, lim.RequestTimeout), lim.RequestBodyTimeout)))
	// Callers with a TLS client certificate are handed to kube-apiserver
	// before anything else sees their requests (clientcert.go).
	if a.clientCerts == nil {
		a.clientCerts = newClientCertificates(a)
	}
	return a.clientCerts.wrap(a.audit.WithReceivedTimestamp(withRequestInfo(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := request.RequestInfoFrom(r.Context()); ok && info.Verb == "watch" {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(a.drain, cancel)
			defer stop()
			r = r.WithContext(ctx)
		}
		if a.degradedNow() {
			r = r.WithContext(apicache.WithDegraded(r.Context()))
		}
		h.ServeHTTP(w, r)
	}))))
}

// Intercepting returns nil while the agent intercepts the Service VIP,
// else the reason it does not.
func (a *Agent) Intercepting() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.notIntercepting
}

// Ready returns nil while the agent is ready in the Kubernetes sense: it
// has made its first decision and is not shutting down, and its sync loop
// is not stuck. That is, it intercepts, or it has deliberately stepped
// aside (an unhealthy upstream, a certificate not issued, a redirect that
// did not take effect, a dataplane it cannot drive) and pods reach
// kube-apiserver through kube-proxy meanwhile. Readiness must not mean
// "intercepting": one node where the agent rightly steps aside would
// otherwise stop a DaemonSet rollout across every healthy node. Whether it
// intercepts is reported apart (Intercepting, /intercepting, the
// kube_apicache_intercepting metric). A configuration the agent cannot
// stand behind is not a decision, though: until the kubernetes Service has
// been read and holds the configured VIPs and port (serviceErr), the agent
// is not ready, so that a wrong VIP stops a rollout at its first wave.
func (a *Agent) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.stopping:
		return errors.New("shutting down")
	case !a.decided:
		return fmt.Errorf("starting: %w", a.notIntercepting)
	}
	if err := a.serviceErr(); err != nil {
		return err
	}
	return a.syncLoopStuck()
}

// interceptionNote adds to /intercepting and /readyz what an operator
// should know even while the agent intercepts: that it is in degraded
// mode and since when, and the latest source sent back to kube-proxy's
// path because its traffic to the agent was dropped.
func (a *Agent) interceptionNote() string {
	var notes []string
	if s := a.degradedNote(); s != "" {
		notes = append(notes, s)
	}
	if s := a.podPath.status(a.now()); s != "" {
		notes = append(notes, "latest blocked source: "+s)
	}
	return strings.Join(notes, "; ")
}

// Healthy returns nil unless the sync loop is stuck: the kubelet restarts
// a container whose /healthz fails, and the kernel's liveness timeout has
// handed the VIP back to kube-proxy long before.
func (a *Agent) Healthy() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.syncLoopStuck()
}

// syncLoopStuck says whether the run loop has not finished a sync for far
// longer than its period allows. a.mu must be held.
func (a *Agent) syncLoopStuck() error {
	if a.lastSync.IsZero() || a.stopping {
		return nil
	}
	if since := a.now().Sub(a.lastSync); since > a.syncStuckAfter() {
		return fmt.Errorf("sync loop stuck: last sync finished %s ago", since.Round(time.Second))
	}
	return nil
}

// syncStuckAfter is how long without a finished sync means a stuck loop:
// three periods, plus two minutes for the xtables lock waits and
// self-checks a slow sync may make.
func (a *Agent) syncStuckAfter() time.Duration {
	return 3*a.cfg.SyncPeriod + 2*time.Minute
}

// syncDone records a finished sync of the run loop: from the first one on,
// the agent has decided whether to intercept.
func (a *Agent) syncDone() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.decided = true
	a.lastSync = a.now()
	a.metrics.ready.Set(1)
}

// setStopping marks the start of shutdown: the agent is no longer ready.
func (a *Agent) setStopping() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopping = true
	a.metrics.ready.Set(0)
}

func (a *Agent) setNotIntercepting(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notIntercepting = err
	if err == nil {
		a.metrics.intercepting.Set(1)
	} else {
		a.metrics.intercepting.Set(0)
	}
}

// Run starts the agent and blocks until ctx ends, then shuts down
// gracefully. Start-up runs in an order that leaves the node untouched on
// any failure: bind the listener, check the upstream, serve, and only once
// the listener answers, the certificate is ready and an upstream is healthy
// add the address, the liveness set and the redirect, and check that the
// redirect really lands here. An error returned before interception started
// means nothing of this process is left on the node.
func (a *Agent) Run(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	a.started, a.logger = a.now(), logger
	shutDown := false
	defer func() {
		if err != nil && !shutDown {
			a.removeStale()
		}
	}()
	logger.Info("Using dataplane", "dataplane", a.dataplane, "reason", a.dataplaneReason)
	// The audit backend outlives the server: it stops (delivering what
	// it holds) only after shutdown has drained the requests.
	if err := a.audit.Start(logger); err != nil {
		return err
	}
	defer a.audit.Shutdown()
	// One listener per family, on the address that family's VIPs are
	// redirected to.
	var ls []net.Listener
	for _, d := range a.planes {
		l, err := listen(ctx, d.listen.String())
		if err != nil {
			return err
		}
		defer l.Close()
		ls = append(ls, l)
	}
	var ml net.Listener
	if a.cfg.MetricsBindAddress != "" {
		if ml, err = net.Listen("tcp", a.cfg.MetricsBindAddress); err != nil {
			return fmt.Errorf("listening for metrics on %s: %w", a.cfg.MetricsBindAddress, err)
		}
		defer ml.Close()
	}
	if err := a.up.waitHealthy(ctx, a.cfg.UpstreamCheckTimeout); err != nil {
		if ctx.Err() != nil {
			logger.Info("Stopped before intercepting")
			return nil
		}
		return err
	}

	certCtx, stopCert := context.WithCancel(ctx)
	defer stopCert()
	go a.cert.Run(certCtx)

	serveErr := make(chan error, len(ls)+1)
	if ml != nil {
		msrv, err := a.metricsServer.run(certCtx, ml, a.cfg.NodeName, serveErr)
		if err != nil {
			return err
		}
		defer msrv.Close()
	}
	srv := newServer(a.handler, probingCert{certSource: a.cert, probes: a.probes}, a.cfg.Limits)
	srv.ErrorLog = newServerErrorLog(logger)
	srv.ConnState = a.metrics.trackConn
	// One set of connection bounds for the node, across the listeners.
	conns := newConnLimiter(a.cfg.Limits, a.metrics, logger)
	for _, l := range ls {
		go func() { serveErr <- srv.Serve(tls.NewListener(conns.listener(l), srv.TLSConfig)) }()
	}

	// The background loops stop before shutdown touches the dataplanes.
	loops, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopLoops(); wg.Wait() }()
	wg.Go(func() { a.up.run(loops, a.cfg.UpstreamHealthPeriod) })
	wg.Go(func() { a.watchEndpoints(loops) })
	wg.Go(func() { a.watchService(loops) })
	if a.cfg.InterceptionConfigMap != "" {
		wg.Go(func() { a.watchInterceptionConfigMap(loops) })
	}
	if a.followsLocal() {
		wg.Go(func() { a.runDetectLocal(loops) })
	}
	if a.cache != nil {
		wg.Go(func() { a.cache.Run(loops) })
	}

	if a.podPath != nil {
		a.baselinePodPath()
	}
	// A first sync that fails steps aside like any later one: the agent
	// stays up and ready (a node whose dataplane it cannot drive must not
	// stop a rollout), reports why it does not intercept, and retries.
	a.syncOrStepAside(ctx)
	wg.Go(func() { a.runLiveness(loops) })
	wg.Go(func() { a.runDegraded(loops) })
	if a.podPath != nil {
		wg.Go(func() { a.runPodPath(loops) })
	}

	ticker := time.NewTicker(a.cfg.SyncPeriod)
	defer ticker.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-serveErr:
			runErr = fmt.Errorf("serving: %w", err)
			break loop
		case <-ticker.C:
		case <-a.syncNow:
		}
		a.syncOrStepAside(ctx)
	}
	stopLoops()
	wg.Wait()
	shutDown = true
	a.shutdown(logger, srv)
	return runErr
}

// syncOrStepAside runs one sync of the run loop. When the kernel state
// cannot be made right, it fails open: a redirect the agent cannot vouch
// for (say, to an address it could not restore) must not stay.
func (a *Agent) syncOrStepAside(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if err := a.syncAndReport(ctx); err != nil {
		logger.Error(err, "Syncing redirect failed; handing the VIP back to kube-proxy until a sync succeeds")
		a.syncMu.Lock()
		a.clearEntriesLocked(logger)
		for _, d := range a.planes {
			if err := d.rules.removeRules(); err != nil {
				logger.Error(err, "Removing redirect rules")
			}
		}
		a.syncMu.Unlock()
	}
	a.syncDone()
}

// syncAndReport runs one sync and keeps readiness and metrics in step with
// its outcome. It returns only errors of the kernel state (the caller fails
// open); an unhealthy agent or a failed self-check is a not-ready agent, not
// an error.
func (a *Agent) syncAndReport(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	was := a.Intercepting()
	wasReady := was == nil
	notReady, err := a.sync(ctx)
	if err != nil {
		a.setNotIntercepting(fmt.Errorf("sync failed: %w", err))
		return err
	}
	if notReady == nil {
		notReady = a.podPath.bypassErr(a.now())
	}
	a.setNotIntercepting(notReady)
	switch {
	case notReady == nil && !wasReady:
		logger.Info("Intercepting the kubernetes Service", "vips", a.cfg.ServiceVIPs, "port", a.cfg.ServicePort,
			"listen", a.cfg.ListenAddresses(), "link", a.planes[0].addr.Link(), "upstream", a.up.pick().Host,
			"dataplane", a.dataplane, "dataplaneReason", a.dataplaneReason, "iptablesBackend", a.backend,
			"livenessTimeout", a.cfg.LivenessTimeout)
	case notReady != nil && wasReady:
		if _, aside := errors.AsType[stepAside](notReady); aside {
			logger.Info("Not intercepting; the kubernetes Service goes to kube-proxy's path", "reason", notReady.Error())
		} else {
			logger.Error(notReady, "Not intercepting; the kubernetes Service goes to kube-proxy's path")
		}
	case notReady != nil && notReady.Error() != was.Error():
		logger.Info("Not intercepting", "reason", notReady.Error())
	case notReady != nil:
		logger.V(2).Info("Still not intercepting", "reason", notReady.Error())
	}
	return nil
}

// sync is the one idempotent reconciliation of the node state, run on a
// timer and whenever something changed. a.syncMu must be held; a.planeMu
// is taken only around changes of liveness entries.
//
//  1. The listen address of each family (a redirect to a missing address
//     would black-hole traffic; the address alone attracts nothing).
//  2. Health: certificate, upstream. Unhealthy: the liveness entries go,
//     the rest stays, and the agent reports why (notReady).
//  3. Per family whose listener completes a handshake and whose
//     detect-local match is known: the sets, chain (iptables or ip6tables)
//     and jumps ahead of kube-proxy's, and this node's pod IPs in PodIPs
//     mode. A family that fails either loses its entries and is reported
//     in notReady; the other family is still intercepted.
//  4. Refresh the entries, then check that an unmarked connection to each
//     VIP lands here. If not, the redirect is removed again, notReady says
//     why, and the next attempt waits (the sync period, doubling up to
//     five minutes).
//
// err reports kernel state that could not be made right.
func (a *Agent) sync(ctx context.Context) (notReady, err error) {
	logger := klog.FromContext(ctx)
	start := a.now()
	repaired := false
	defer func() {
		a.interception.syncDuration.Observe(a.now().Sub(start).Seconds())
		switch {
		case err != nil:
			a.metrics.ruleSyncs.WithLabelValues("error").Inc()
		case repaired:
			a.metrics.ruleSyncs.WithLabelValues("repaired").Inc()
		default:
			a.metrics.ruleSyncs.WithLabelValues("unchanged").Inc()
		}
	}()
	added := make([]bool, len(a.planes))
	for i, d := range a.planes {
		if added[i], err = d.addr.Sync(); err != nil {
			return nil, err
		}
		repaired = repaired || added[i]
	}
	if err := a.health(); err != nil {
		a.syncSawUnhealthy.Store(true)
		a.clearEntriesLocked(logger)
		return notInterceptingBecause(err), nil
	}
	a.syncSawUnhealthy.Store(false)
	a.removeOthers(logger)
	if a.selfCheckErr != nil && a.now().Before(a.retryAt) {
		// The redirect did not take effect last time: stay out until the
		// retry is due, rather than redirect in vain on every sync.
		return a.selfCheckErr, nil
	}
	var up []*dataplane
	var down []error
	for i, d := range a.planes {
		// A family whose listener does not serve, or whose pod traffic
		// cannot be told apart yet (detect-local), is not intercepted.
		match, err := a.localMatch(d.family)
		if herr := a.listenerHealth(ctx, d); herr != nil {
			err = herr
		}
		if err != nil {
			a.planeMu.Lock()
			cerr := d.clear()
			a.planeMu.Unlock()
			if cerr != nil {
				return nil, cerr
			}
			down = append(down, err)
			continue
		}
		d.setLocal(match)
		setCreated, res, err := d.sync()
		if err != nil {
			return nil, err
		}
		if d.podsSet != nil {
			// Until the first list of the node's pods arrives the set is
			// empty: only host traffic is intercepted meanwhile.
			ips, _ := a.local.podIPs()
			changed, err := d.syncLocalPods(ips)
			if err != nil {
				return nil, err
			}
			repaired = repaired || changed
		}
		if setCreated || res.Changed() {
			repaired = true
			logger.V(2).Info("Synced redirect", "family", d.family.String(), "addressAdded", added[i], "setCreated", setCreated,
				"chainCreated", res.ChainCreated, "rulesRewritten", res.RulesRewritten, "jumpsFixed", res.JumpsFixed,
				"elapsed", a.now().Sub(start))
		}
		up = append(up, d)
	}
	a.planeMu.Lock()
	for _, d := range up {
		if err = d.refresh(); err != nil {
			break
		}
	}
	a.planeMu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, d := range up {
		for _, vip := range d.vips {
			if err := a.selfCheck(ctx, vip, a.probeTimeout()); err != nil {
				a.interception.selfChecks.WithLabelValues("failed").Inc()
				a.clearEntriesLocked(logger)
				for _, d := range a.planes {
					if rerr := d.rules.removeRules(); rerr != nil {
						return nil, errors.Join(err, rerr)
					}
				}
				a.retryWait = min(max(2*a.retryWait, a.cfg.SyncPeriod), maxSelfCheckRetry)
				a.retryAt = a.now().Add(a.retryWait)
				a.selfCheckErr = fmt.Errorf("self-check failed, redirect removed, next attempt in %s: %w", a.retryWait, err)
				return a.selfCheckErr, nil
			}
			a.interception.selfChecks.WithLabelValues("ok").Inc()
		}
	}
	a.planeMu.Lock()
	for _, d := range up {
		d.active = true
	}
	a.planeMu.Unlock()
	a.selfCheckErr, a.retryWait = nil, 0
	if !repaired {
		logger.V(4).Info("Redirect in sync", "elapsed", a.now().Sub(start))
	}
	if err := joinOneLine(down); err != nil {
		return fmt.Errorf("unhealthy: %w", err), nil
	}
	return nil, nil
}

// listenerLinger is how long the listener keeps accepting after the
// redirect is gone, at shutdown.
const listenerLinger = 500 * time.Millisecond

// maxSelfCheckRetry bounds the wait between attempts to install a redirect
// that failed its self-check.
const maxSelfCheckRetry = 5 * time.Minute

// shutdown hands the VIP back to kube-proxy's path, then lets in-flight
// requests finish within the grace period. The liveness entries go first
// (new connections take kube-proxy's path at once), then the jumps, chain
// and set. Established connections keep their NAT mapping, so the address
// stays until the server has stopped; it stays for good if the jumps could
// not be removed (a redirect to a missing address would black-hole
// traffic), or if a successor has installed its redirect meanwhile.
func (a *Agent) shutdown(logger klog.Logger, srv *http.Server) {
	a.setStopping()
	a.setNotIntercepting(errors.New("shutting down"))
	// The liveness loop has stopped; planeMu is held throughout anyway,
	// since remove clears entries too.
	a.syncMu.Lock()
	a.planeMu.Lock()
	a.clearEntries(logger)
	removed := false
	for i := 0; i < 3 && !removed; i++ {
		var errs []error
		for _, d := range a.planes {
			if err := d.remove(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			logger.Error(err, "Removing redirect rules", "attempt", i+1)
			time.Sleep(time.Second)
			continue
		}
		removed = true
	}
	a.planeMu.Unlock()
	a.syncMu.Unlock()
	// Connections redirected just before the entries went may still sit
	// in the listener's accept queue, their clients waiting for the TLS
	// handshake: closing the listener now would reset them. They are
	// accepted (and served) for a moment first; new ones already take
	// kube-proxy's path.
	time.Sleep(listenerLinger)
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownGracePeriod)
	defer cancel()
	done := make(chan error, 1)
	// Shutdown first sends GOAWAY on HTTP/2 connections, so clients open
	// their next request on a new connection (now past the removed
	// redirect); then open watches are ended to make their clients
	// reconnect the same way.
	go func() { done <- srv.Shutdown(ctx) }()
	time.Sleep(100 * time.Millisecond)
	a.startDrain()
	if err := <-done; err != nil {
		logger.Info("Grace period over; closing remaining connections", "gracePeriod", a.cfg.ShutdownGracePeriod)
		_ = srv.Close()
	}
	if !removed {
		logger.Info("Redirect rules could not be removed; leaving the listen address in place")
		return
	}
	for _, d := range a.planes {
		if present, err := d.rules.present(); err != nil || present {
			logger.Info("A successor's redirect is in place; leaving the listen addresses to it")
			return
		}
	}
	for _, d := range a.planes {
		if err := d.addr.Remove(); err != nil {
			logger.Error(err, "Removing listen address", "address", d.listen.Addr())
		}
	}
	logger.Info("Stopped; the kubernetes Service goes straight to kube-apiserver again")
}

// removeStale removes liveness sets, redirects and the address left on the
// node, by this process's failed start or by an earlier instance that
// died: with no agent serving, the VIP must go straight to kube-apiserver.
// It creates nothing, so on a clean node it changes nothing.
func (a *Agent) removeStale() {
	logger := klog.Background()
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	a.planeMu.Lock()
	defer a.planeMu.Unlock()
	for _, d := range a.planes {
		if err := d.remove(); err != nil {
			logger.Error(err, "Removing stale redirect rules")
			return // keep the addresses the remaining jumps point to
		}
	}
	for _, d := range a.others {
		if present, err := d.rules.present(); err == nil && present {
			if err := d.remove(); err != nil {
				logger.Error(err, "Removing the other dataplane's stale redirect", "dataplane", otherDataplane(a.dataplane))
				return
			}
		}
	}
	for _, d := range a.planes {
		if err := d.addr.Remove(); err != nil {
			logger.Error(err, "Removing stale listen address", "address", d.listen.Addr())
		}
	}
}

// newCache builds the node-local cache and the reviewer that guards it,
// both with the agent's own client configuration (with CacheAsNode, the
// cache watches this node's pods and Node as the node). It does nothing
// when no resource is to be cached.
func (a *Agent) newCache() error {
	if len(a.cfg.CacheResources) == 0 {
		return nil
	}
	reviewer, err := access.New(a.restConfig(), access.Options{
		Gate:        a.cfg.Limits.gate(),
		DegradedTTL: a.cfg.DegradedDecisionTTL,
		Degraded:    a.degradedNow,
		Unreachable: a.reviewsUnreachable,
	})
	if err != nil {
		return fmt.Errorf("access reviews: %w", err)
	}
	if err := reviewer.Metrics().Register(a.metrics.registry); err != nil {
		return fmt.Errorf("registering review metrics: %w", err)
	}
	a.cache, err = apicache.New(apicache.Config{
		NodeName:             a.cfg.NodeName,
		Resources:            a.cfg.CacheResources,
		RESTConfig:           a.restConfig(),
		Reviewer:             reviewer,
		WaitTimeout:          a.cfg.CacheWaitTimeout,
		ConsistentReads:      a.cfg.CacheConsistentReads,
		ProbeMaxObjects:      a.cfg.CacheProbeMaxObjects,
		ProbeBudget:          a.cfg.Limits.probeBudget(),
		AsNode:               a.cfg.CacheAsNode,
		OnDemand:             true,
		Pinned:               a.cfg.CachePinnedResources,
		IdleTimeout:          a.cfg.CacheIdleTimeout,
		HistoryEvents:        a.cfg.CacheHistoryEvents,
		HistoryBytes:         a.cfg.CacheHistoryBytes,
		MaxInFlightPerSource: a.cfg.Limits.withDefaults().MaxCacheRequestsPerSource,
		Registerer:           a.metrics.registry,
	})
	if err != nil {
		return err
	}
	a.pinnedUnsynced = a.cache.PinnedUnsynced
	return nil
}
