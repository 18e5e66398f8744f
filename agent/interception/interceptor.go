package interception

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// Interceptor is the redirect policy over netrules: which dataplane runs
// the redirect and its rules and sets, the liveness refresher, the
// self-check, the pod-path check, detect-local, the kill switch and the
// Service check, and the removal of what is left on the node. It decides
// whether the node's traffic to the Service VIPs reaches the agent; it
// knows nothing of HTTP serving or of the upstream endpoints beyond what
// Deps tells it.
type Interceptor struct {
	// Fixed at construction.
	cfg     *Config
	deps    Deps
	metrics *interceptionMetrics
	// probes are the self-check handshakes the listener has to report
	// (Probes).
	probes *Probes
	// planes holds one redirect per IP family among the Service VIPs, each
	// with its own listen address.
	planes  []*dataplane
	backend string
	// dataplane is the backend the redirect runs in, and why; others are
	// the same redirects in the other backend, removed if found.
	dataplane, dataplaneReason string
	others                     []*dataplane
	// syncNow asks the run loop for a sync before the next tick.
	syncNow chan struct{}
	// local is what detect-local and the pod-path check learn from the
	// API (detectlocal.go); pods is the identity it lists this node's pods
	// with, nil until runDetectLocal has built it (podssource.go).
	local *localPods
	pods  atomic.Pointer[podsSource]
	// podPath checks interception as pods get it (podpath.go); nil when
	// off. lastLapse is when (Unix nanoseconds) a liveness refresh last came
	// so late that the entry may have expired.
	podPath   *podPath
	lastLapse atomic.Int64
	// conntrack lists and deletes the flows the redirect left, at
	// shutdown (flows.go); nil where the kernel's is not available.
	conntrack netrules.Conntrack
	// syncSawUnhealthy is set by a sync that found the agent unhealthy, so
	// that the liveness loop asks for a sync as soon as it is healthy.
	syncSawUnhealthy atomic.Bool
	// disabled holds the kill switch's reason while interception is
	// turned off; service what the agent knows of the kubernetes Service,
	// against which it checks the configured VIPs and port (nil: not read
	// yet) (switches.go).
	disabled atomic.Pointer[string]
	service  atomic.Pointer[serviceCheck]
	// firstSync is closed once the first sync has decided whether to
	// intercept.
	firstSync     chan struct{}
	firstSyncOnce sync.Once
	now           func() time.Time

	// syncMu serializes the work on the node's netfilter rules and
	// addresses: syncs, the removal after a failed one, shutdown and
	// RemoveStale. It is held across exec'd iptables calls, which take
	// long on a node with a large nat table or a busy xtables lock. It
	// also protects the fields below.
	syncMu sync.Mutex
	// selfCheckErr is the last failed self-check; the redirect is not
	// installed again before retryAt. retryWait doubles with each failure.
	selfCheckErr  error
	retryAt       time.Time
	retryWait     time.Duration
	othersCheckAt time.Time

	// planeMu guards the liveness entries and each dataplane's active
	// flag. It is held only around netlink set operations, never across a
	// call to iptables, so the liveness refresher never waits for
	// netfilter: a slow sync cannot let the entries expire. A refresh
	// never runs between a failed check and the clearing it causes.
	// Lock order: syncMu before planeMu.
	planeMu sync.Mutex

	mu sync.Mutex // protects the fields below
	// notIntercepting is why the agent is not intercepting; nil while it
	// is.
	notIntercepting error
	// decided is set once the first sync has decided whether to
	// intercept; stopping once shutdown has begun. Between the two the
	// agent is ready: serving, or deliberately stepped aside.
	decided, stopping bool
	// lastSync is when the run loop last finished a sync; zero before the
	// first.
	lastSync time.Time
}

// Deps is what the Interceptor needs from the rest of the
// agent, each as narrow as one func.
type Deps struct {
	// Health returns nil while the agent can stand in for kube-apiserver:
	// its certificate is ready, an upstream endpoint is healthy (or the
	// agent is in degraded mode) and its cache has warmed up.
	Health func() error
	// RESTConfig is the agent's own client configuration, for the watches
	// of the kubernetes Service and the kill switch's ConfigMap;
	// LocalRESTConfig the one for the watches of this node's pods and
	// Node (detect-local, the pod-path check).
	RESTConfig, LocalRESTConfig func() *rest.Config
	// Upstream names the upstream endpoint requests go to, for logs.
	Upstream func() string
	// Ready and Intercepting are the gauges of Ready and Intercepting;
	// RuleSyncs counts syncs by outcome.
	Ready, Intercepting prometheus.Gauge
	RuleSyncs           *prometheus.CounterVec
	// Registry takes the interceptor's own metrics.
	Registry prometheus.Registerer
}

// New picks the dataplane and builds the redirects. It changes
// nothing on the node.
func New(cfg *Config, k Kernel, deps Deps) (*Interceptor, error) {
	ic := &Interceptor{
		cfg:             cfg,
		deps:            deps,
		backend:         k.Backend,
		syncNow:         make(chan struct{}, 1),
		probes:          NewProbes(),
		local:           newLocalPods(),
		firstSync:       make(chan struct{}),
		now:             time.Now,
		notIntercepting: errors.New("starting"),
		conntrack:       k.Conntrack,
	}
	if cfg.InterceptionDisabled {
		reason := "--interception=false (or interception.enabled: false in --config)"
		ic.disabled.Store(&reason)
	}
	if err := ic.buildDataplanes(k); err != nil {
		return nil, err
	}
	ic.metrics = newInterceptionMetrics(deps.Registry)
	deps.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_excluded_pods",
		Help: "This node's pods labelled " + ExcludePodLabel + "=true, whose traffic to the Service VIP goes to kube-proxy's path (in PodIPs detect-local mode; the other modes cannot leave one pod out). 0 while this node's pods are not followed.",
	}, func() float64 { return float64(ic.local.excludedCount()) }))
	deps.Registry.MustRegister(ic.switchCollector(), ic.serviceMismatchCollector())
	if cfg.PodPathCheckInterval > 0 && k.Conntrack != nil && !cfg.external() {
		ic.podPath = newPodPath(k.Conntrack, deps.Registry)
	}
	if ic.followsLocalPods() {
		setPodsSourceGauge(ic.metrics.localPodsSource, PodsSourceNone)
	}
	return ic, nil
}

// Run keeps the redirect in sync until ctx ends: on a timer, and whenever
// something it follows changed. Its first sync, like any later one, fails
// open: the agent stays up and ready (a node whose dataplane it cannot
// drive must not stop a rollout), reports why it does not intercept, and
// retries. The redirect stays in place when run returns: stop removes it.
func (ic *Interceptor) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { ic.watchService(ctx) })
	if ic.cfg.InterceptionConfigMap != "" {
		wg.Go(func() { ic.watchInterceptionConfigMap(ctx) })
	}
	if ic.followsLocal() {
		wg.Go(func() { ic.runDetectLocal(ctx) })
	}
	if ic.podPath != nil {
		ic.baselinePodPath()
	}
	ic.syncOrStepAside(ctx)
	wg.Go(func() { ic.runLiveness(ctx) })
	if ic.podPath != nil {
		wg.Go(func() { ic.runPodPath(ctx) })
	}
	ticker := time.NewTicker(ic.cfg.SyncPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-ic.syncNow:
		}
		ic.syncOrStepAside(ctx)
	}
}

// Dataplane names the backend the redirect runs in, and why it was
// chosen.
func (ic *Interceptor) Dataplane() (name, reason string) { return ic.dataplane, ic.dataplaneReason }

// Probes is the registry of self-check handshakes: the listener reports
// every ClientHello's server name to it (Probes.Observe).
func (ic *Interceptor) Probes() *Probes { return ic.probes }

// Decided is closed once the first sync has decided whether to intercept.
func (ic *Interceptor) Decided() <-chan struct{} { return ic.firstSync }

// Stop hands the VIP back to kube-proxy's path at shutdown, once run has
// returned: the liveness entries go first (new connections take
// kube-proxy's path at once), then the jumps, chain and set, in up to three
// attempts. It reports whether they are gone; the listen addresses stay
// for releaseAddresses, since established connections keep their NAT
// mapping to them.
func (ic *Interceptor) Stop(logger klog.Logger) (removed bool) {
	ic.setStopping()
	ic.setNotIntercepting(errors.New("shutting down"))
	// The liveness loop has stopped; planeMu is held throughout anyway,
	// since remove clears entries too.
	ic.syncMu.Lock()
	defer ic.syncMu.Unlock()
	ic.planeMu.Lock()
	defer ic.planeMu.Unlock()
	ic.clearEntries(logger)
	for i := 0; i < 3; i++ {
		var errs []error
		for _, d := range ic.planes {
			if err := d.remove(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			logger.Error(err, "Removing redirect rules", "attempt", i+1)
			time.Sleep(time.Second)
			continue
		}
		return true
	}
	return false
}

// ReleaseAddresses removes the listen addresses once the server has
// stopped, if stop removed the redirect (a redirect to a missing address
// would black-hole traffic) and no successor has installed its own
// meanwhile.
func (ic *Interceptor) ReleaseAddresses(logger klog.Logger, removed bool) {
	if !removed {
		logger.Info("Redirect rules could not be removed; leaving the listen address in place")
		return
	}
	for _, d := range ic.planes {
		if present, err := d.rules.present(); err != nil || present {
			logger.Info("A successor's redirect is in place; leaving the listen addresses to it")
			return
		}
	}
	for _, d := range ic.planes {
		if err := d.addr.Remove(); err != nil {
			logger.Error(err, "Removing listen address", "address", d.listen.Addr())
		}
	}
	if ic.cfg.external() {
		logger.Info("Stopped; the external redirect should have left this agent when it turned not ready")
		return
	}
	logger.Info("Stopped; the kubernetes Service goes straight to kube-apiserver again")
}

// setStopping marks the start of shutdown: the agent is no longer ready.
func (ic *Interceptor) setStopping() {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.stopping = true
	ic.deps.Ready.Set(0)
}

// Healthy returns nil unless the sync loop is stuck.
func (ic *Interceptor) Healthy() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.syncLoopStuck()
}

// VIPs lists the Service VIPs, by family.
func (ic *Interceptor) VIPs() []netip.Addr {
	if ic.cfg.external() {
		return ic.cfg.externalVIPs()
	}
	var out []netip.Addr
	for _, d := range ic.planes {
		out = append(out, d.vips...)
	}
	return out
}

// PodPathNote is the latest source sent back to kube-proxy's path because
// its traffic to the agent was dropped, for /intercepting; "" if none.
func (ic *Interceptor) PodPathNote() string { return ic.podPath.status(ic.now()) }

// Intercepting returns nil while the agent intercepts the Service VIP,
// else the reason it does not.
func (ic *Interceptor) Intercepting() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.notIntercepting
}

// Ready returns nil while the agent is ready in the Kubernetes sense: it
// has made its first decision and is not shutting down, and its sync loop
// is not stuck. That is, it intercepts, or it has deliberately stepped
// aside (an unhealthy upstream, a certificate not issued, a redirect that
// did not take effect, a dataplane it cannot drive) and pods reach
// kube-apiserver through kube-proxy meanwhile. (With the external
// dataplane readiness is the switch, so there it does mean intercepting:
// external.go.) Readiness must not mean
// "intercepting": one node where the agent rightly steps aside would
// otherwise stop a DaemonSet rollout across every healthy node. Whether it
// intercepts is reported apart (Intercepting, /intercepting, the
// kube_apicache_intercepting metric). A configuration the agent cannot
// stand behind is not a decision, though: until the kubernetes Service has
// been read and holds the configured VIPs and port (serviceErr), the agent
// is not ready, so that a wrong VIP stops a rollout at its first wave.
func (ic *Interceptor) Ready() error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	switch {
	case ic.stopping:
		return errors.New("shutting down")
	case !ic.decided:
		return fmt.Errorf("starting: %w", ic.notIntercepting)
	}
	if err := ic.serviceErr(); err != nil {
		return err
	}
	if err := ic.syncLoopStuck(); err != nil {
		return err
	}
	if ic.cfg.external() && ic.notIntercepting != nil {
		return fmt.Errorf("not serving as the redirect's backend: %w", ic.notIntercepting)
	}
	return nil
}

// syncLoopStuck says whether the run loop has not finished a sync for far
// longer than its period allows. ic.mu must be held.
func (ic *Interceptor) syncLoopStuck() error {
	if ic.lastSync.IsZero() || ic.stopping {
		return nil
	}
	if since := ic.now().Sub(ic.lastSync); since > ic.syncStuckAfter() {
		return fmt.Errorf("sync loop stuck: last sync finished %s ago", since.Round(time.Second))
	}
	return nil
}

// syncStuckAfter is how long without a finished sync means a stuck loop:
// three periods, plus two minutes for the xtables lock waits and
// self-checks a slow sync may make.
func (ic *Interceptor) syncStuckAfter() time.Duration {
	return 3*ic.cfg.SyncPeriod + 2*time.Minute
}

// syncDone records a finished sync of the run loop: from the first one on,
// the agent has decided whether to intercept.
func (ic *Interceptor) syncDone() {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.decided = true
	ic.firstSyncOnce.Do(func() { close(ic.firstSync) })
	ic.lastSync = ic.now()
	if ic.cfg.external() && ic.notIntercepting != nil {
		ic.deps.Ready.Set(0)
	} else {
		ic.deps.Ready.Set(1)
	}
}

func (ic *Interceptor) setNotIntercepting(err error) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.notIntercepting = err
	if err == nil {
		ic.deps.Intercepting.Set(1)
	} else {
		ic.deps.Intercepting.Set(0)
	}
}

// syncOrStepAside runs one sync of the run loop. When the kernel state
// cannot be made right, it fails open: a redirect the agent cannot vouch
// for (say, to an address it could not restore) must not stay.
func (ic *Interceptor) syncOrStepAside(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if err := ic.syncAndReport(ctx); err != nil {
		logger.Error(err, "Syncing redirect failed; handing the VIP back to kube-proxy until a sync succeeds")
		ic.syncMu.Lock()
		ic.clearEntriesLocked(logger)
		for _, d := range ic.planes {
			if err := d.rules.removeRules(); err != nil {
				logger.Error(err, "Removing redirect rules")
			}
		}
		ic.syncMu.Unlock()
	}
	ic.syncDone()
}

// syncAndReport runs one sync and keeps readiness and metrics in step with
// its outcome. It returns only errors of the kernel state (the caller fails
// open); an unhealthy agent or a failed self-check is a not-ready agent, not
// an error.
func (ic *Interceptor) syncAndReport(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ic.syncMu.Lock()
	defer ic.syncMu.Unlock()
	was := ic.Intercepting()
	wasReady := was == nil
	notReady, err := ic.sync(ctx)
	if err != nil {
		ic.setNotIntercepting(fmt.Errorf("sync failed: %w", err))
		return err
	}
	if notReady == nil {
		notReady = ic.podPath.bypassErr(ic.now())
	}
	ic.setNotIntercepting(notReady)
	switch {
	case notReady == nil && !wasReady && ic.cfg.external():
		logger.Info("Serving as the node-local backend of an external redirect of the kubernetes Service", "vips", ic.cfg.ServiceVIPs,
			"port", ic.cfg.ServicePort, "listen", ic.cfg.BindAddresses(), "upstream", ic.deps.Upstream(),
			"dataplane", ic.dataplane, "dataplaneReason", ic.dataplaneReason)
	case notReady == nil && !wasReady:
		logger.Info("Intercepting the kubernetes Service", "vips", ic.cfg.ServiceVIPs, "port", ic.cfg.ServicePort,
			"listen", ic.cfg.ListenAddresses(), "link", ic.planes[0].addr.Link(), "upstream", ic.deps.Upstream(),
			"dataplane", ic.dataplane, "dataplaneReason", ic.dataplaneReason, "iptablesBackend", ic.backend,
			"livenessTimeout", ic.cfg.LivenessTimeout, "podsSource", ic.LocalPods().Source)
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
// timer and whenever something changed. ic.syncMu must be held; ic.planeMu
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
func (ic *Interceptor) sync(ctx context.Context) (notReady, err error) {
	if ic.cfg.external() {
		return ic.syncExternal(ctx), nil
	}
	logger := klog.FromContext(ctx)
	start := ic.now()
	repaired := false
	defer func() {
		ic.metrics.syncDuration.Observe(ic.now().Sub(start).Seconds())
		switch {
		case err != nil:
			ic.deps.RuleSyncs.WithLabelValues("error").Inc()
		case repaired:
			ic.deps.RuleSyncs.WithLabelValues("repaired").Inc()
		default:
			ic.deps.RuleSyncs.WithLabelValues("unchanged").Inc()
		}
	}()
	added := make([]bool, len(ic.planes))
	for i, d := range ic.planes {
		if added[i], err = d.addr.Sync(); err != nil {
			return nil, err
		}
		repaired = repaired || added[i]
	}
	if err := ic.health(); err != nil {
		ic.syncSawUnhealthy.Store(true)
		ic.clearEntriesLocked(logger)
		return notInterceptingBecause(err), nil
	}
	ic.syncSawUnhealthy.Store(false)
	ic.removeOthers(logger)
	if ic.selfCheckErr != nil && ic.now().Before(ic.retryAt) {
		// The redirect did not take effect last time: stay out until the
		// retry is due, rather than redirect in vain on every sync.
		return ic.selfCheckErr, nil
	}
	var up []*dataplane
	var down []error
	for i, d := range ic.planes {
		// A family whose listener does not serve, or whose pod traffic
		// cannot be told apart yet (detect-local), is not intercepted.
		match, err := ic.localMatch(d.family)
		if herr := ic.listenerHealth(ctx, d); herr != nil {
			err = herr
		}
		if err != nil {
			ic.planeMu.Lock()
			cerr := d.clear()
			ic.planeMu.Unlock()
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
			// empty: only host traffic is intercepted meanwhile, which
			// LocalPods reports (HostNetworkOnly), with why they are not
			// listed.
			ips, _ := ic.local.podIPs()
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
				"elapsed", ic.now().Sub(start))
		}
		up = append(up, d)
	}
	ic.planeMu.Lock()
	for _, d := range up {
		if err = d.refresh(); err != nil {
			break
		}
	}
	ic.planeMu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, d := range up {
		for _, vip := range d.vips {
			if err := ic.selfCheck(ctx, vip, ic.cfg.ProbeTimeout()); err != nil {
				ic.metrics.selfChecks.WithLabelValues("failed").Inc()
				ic.clearEntriesLocked(logger)
				for _, d := range ic.planes {
					if rerr := d.rules.removeRules(); rerr != nil {
						return nil, errors.Join(err, rerr)
					}
				}
				ic.retryWait = min(max(2*ic.retryWait, ic.cfg.SyncPeriod), maxSelfCheckRetry)
				ic.retryAt = ic.now().Add(ic.retryWait)
				ic.selfCheckErr = fmt.Errorf("self-check failed, redirect removed, next attempt in %s: %w", ic.retryWait, err)
				return ic.selfCheckErr, nil
			}
			ic.metrics.selfChecks.WithLabelValues("ok").Inc()
		}
	}
	ic.planeMu.Lock()
	for _, d := range up {
		d.active = true
	}
	ic.planeMu.Unlock()
	ic.selfCheckErr, ic.retryWait = nil, 0
	if !repaired {
		logger.V(4).Info("Redirect in sync", "elapsed", ic.now().Sub(start))
	}
	if err := joinOneLine(down); err != nil {
		return fmt.Errorf("unhealthy: %w", err), nil
	}
	return nil, nil
}

// RemoveStale removes liveness sets, redirects and the address left on the
// node, by this process's failed start or by an earlier instance that
// died: with no agent serving, the VIP must go straight to kube-apiserver.
// It creates nothing, so on a clean node it changes nothing.
func (ic *Interceptor) RemoveStale() {
	logger := klog.Background()
	ic.syncMu.Lock()
	defer ic.syncMu.Unlock()
	ic.planeMu.Lock()
	defer ic.planeMu.Unlock()
	for _, d := range ic.planes {
		if err := d.remove(); err != nil {
			logger.Error(err, "Removing stale redirect rules")
			return // keep the addresses the remaining jumps point to
		}
	}
	for _, d := range ic.others {
		if present, err := d.rules.present(); err == nil && present {
			if err := d.remove(); err != nil {
				logger.Error(err, "Removing the other dataplane's stale redirect", "dataplane", otherDataplane(ic.dataplane))
				return
			}
		}
	}
	for _, d := range ic.planes {
		if err := d.addr.Remove(); err != nil {
			logger.Error(err, "Removing stale listen address", "address", d.listen.Addr())
		}
	}
}

// maxSelfCheckRetry bounds the wait between attempts to install a redirect
// that failed its self-check.
const maxSelfCheckRetry = 5 * time.Minute

// SkipSource sends src to kube-proxy's path for BypassDuration: the skip
// set of its family takes it. steerable is false where no skip set exists
// for that family (the pod-path check off).
func (ic *Interceptor) SkipSource(src netip.Addr) (steerable bool, err error) {
	for _, d := range ic.planes {
		if d.skip != nil && d.family == netrules.FamilyOf(src) {
			ic.planeMu.Lock()
			defer ic.planeMu.Unlock()
			return true, d.skip.Refresh([]netip.Addr{src})
		}
	}
	return false, nil
}
