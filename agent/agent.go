// Package agent is the node-local API proxy: it serves TLS on a local
// address, redirects the kubernetes Service VIP to it, answers covered
// reads from its cache and relays everything else to kube-apiserver with
// the caller's own credentials.
//
// The package itself only composes the parts that do this (interception,
// upstream, degraded, serving, status, and the cache) and runs them: what
// is built from what (New), the start order (Run), readiness and the
// shutdown order. It must not grow a job of its own: a new mode is a new
// part, wired here.
package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/audit"
	"github.com/kube-apicache/kube-apicache/agent/degraded"
	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewriting"
	"github.com/kube-apicache/kube-apicache/agent/serving"
	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/agent/upstream"
	apicache "github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/netrules"
)

// Agent composes the agent's parts and runs them in order: the
// interceptor (the redirect and its policy, package interception), the
// upstream endpoints and their health (package upstream), the
// serving handler chain, the cache and the metrics server. It owns their
// start order, readiness and shutdown, and nothing else.
type Agent struct {
	// Fixed at construction.
	cfg     *Config
	cert    certSource
	up      *upstream.Set
	metrics *metrics
	icpt    *interception.Interceptor
	serving *serving.Server
	// status serves MetricsBindAddress; nil when it is empty.
	status *status.Server
	// cache answers covered reads; nil when no resource is cached.
	cache *apicache.Cache
	// audit records the requests the cache answers; off unless configured.
	audit *audit.Auditor
	// reviewer reviews callers for the cache and the rewriting; nil when
	// neither is on.
	reviewer *access.Delegating
	// rewriting renames the requests of the callers rewrite profiles
	// select; rewriteProfiles are its profiles, nil when it is off.
	rewriting       *rewriting.Filter
	rewriteProfiles *rewriting.Profiles
	// warm is the warm-up of the pinned resources (warmup).
	warm warmup
	// drain is cancelled when shutdown starts, which ends open watches so
	// their clients reconnect, now past the removed redirect.
	drain      context.Context
	startDrain context.CancelFunc
	now        func() time.Time

	// degraded is degraded mode (package degraded).
	degraded *degraded.Mode
}

// warmup is the state of the warm-up before the first interception: it
// waits for the pinned resources to sync, within CacheWarmupTimeout of
// the start.
type warmup struct {
	// started is when Run began and logger its logger; done is set once
	// the pinned resources have synced or the warm-up has timed out;
	// pinnedUnsynced lists the pinned resources not synced yet, nil
	// without a cache.
	started        time.Time
	logger         klog.Logger
	done           atomic.Bool
	pinnedUnsynced func() []string
}

// New checks cfg and loads what the agent needs from disk. It changes
// nothing on the node, except that on failure it removes what a dead
// predecessor left (the interceptor's RemoveStale). k holds the kernel
// interfaces for rules, sets and the listen address.
func New(cfg *Config, k interception.Kernel) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	drain, startDrain := context.WithCancel(context.Background())
	a := &Agent{
		cfg:        cfg,
		metrics:    newMetrics(),
		drain:      drain,
		startDrain: startDrain,
		now:        time.Now,
	}
	a.metrics.registry.MustRegister(status.BuildInfo())
	var err error
	if a.audit, err = audit.New(cfg.Audit, apihttp.LongRunning); err != nil {
		return nil, err
	}
	if a.icpt, err = interception.New(&cfg.Config, k, a.interceptorDeps()); err != nil {
		return nil, err
	}
	if a.cert, err = a.newCertSource(); err != nil {
		a.icpt.RemoveStale()
		return nil, err
	}
	lim := cfg.Limits.WithDefaults()
	if a.up, err = upstream.New(upstream.Config{
		Endpoints:            cfg.Upstreams,
		CAFile:               cfg.UpstreamCAFile,
		ServerName:           cfg.UpstreamServerName,
		DialControl:          netrules.MarkSocket(cfg.SocketMark),
		HealthPeriod:         cfg.UpstreamHealthPeriod,
		MaxStreamBuffer:      lim.HTTP2MaxUpstreamStreamBuffer,
		MaxBufferedBodyBytes: lim.MaxBufferedBodyBytes,
	}); err != nil {
		a.icpt.RemoveStale()
		return nil, err
	}
	a.up.OnChange = a.icpt.RequestSync
	a.degraded = degraded.New(degraded.Config{
		TTL:          cfg.DegradedDecisionTTL,
		HealthPeriod: cfg.UpstreamHealthPeriod,
		Interval:     cfg.LivenessInterval(),
		ProbeTimeout: cfg.ProbeTimeout(),
		ServicePort:  cfg.ServicePort,
		DialControl:  netrules.MarkSocket(cfg.SocketMark),
	}, a.up, a.icpt.VIPs, a.icpt.RequestSync)
	a.metrics.registry.MustRegister(a.degraded.Collector())
	a.metrics.registry.MustRegister(a.up.Collectors()...)
	if err := a.newCache(); err != nil {
		a.icpt.RemoveStale()
		return nil, err
	}
	if err := a.newRewriting(); err != nil {
		a.icpt.RemoveStale()
		return nil, err
	}
	if cfg.MetricsBindAddress != "" {
		if a.status, err = a.newStatusServer(); err != nil {
			a.icpt.RemoveStale()
			return nil, err
		}
	}
	a.serving = serving.New(serving.Options{
		Limits:         cfg.Limits,
		Upstream:       a.up,
		Cache:          a.cache,
		Rewriting:      a.rewriting,
		Audit:          a.audit,
		Degraded:       a.degraded.Active,
		SkipSource:     a.icpt.SkipSource,
		IsNodeAddress:  isNodeAddress,
		BypassDuration: cfg.BypassDuration,
		Drain:          a.drain,
		Registry:       a.metrics.registry,
	})
	return a, nil
}

// interceptorDeps is what the interceptor needs of the rest of the agent.
func (a *Agent) interceptorDeps() interception.Deps {
	return interception.Deps{
		Health:          a.standInHealth,
		RESTConfig:      a.restConfig,
		LocalRESTConfig: a.localRESTConfig,
		Upstream:        func() string { return a.up.Pick().Host },
		Ready:           a.metrics.ready,
		Intercepting:    a.metrics.intercepting,
		RuleSyncs:       a.metrics.ruleSyncs,
		Registry:        a.metrics.registry,
	}
}

// newStatusServer builds the metrics and status listener, which reports
// on the agent through the interceptor's checks and the upstream set.
func (a *Agent) newStatusServer() (*status.Server, error) {
	dataplane, reason := a.icpt.Dataplane()
	return status.New(status.Config{
		NodeName:    a.cfg.NodeName,
		TLSCertFile: a.cfg.MetricsTLSCertFile,
		TLSKeyFile:  a.cfg.MetricsTLSKeyFile,
		Profiling:   a.cfg.Profiling,
		RESTConfig:  a.restConfig,
	}, status.Checks{
		Healthy:         a.Healthy,
		Ready:           a.Ready,
		Intercepting:    a.Intercepting,
		Note:            a.interceptionNote,
		Dataplane:       dataplane,
		DataplaneReason: reason,
		Upstreams:       a.upstreamStatus,
		LocalPods:       a.localPods,
	}, a.metrics.registry)
}

// localPods is where the interceptor learns this node's pod IPs from, as
// the Status shows it.
func (a *Agent) localPods() status.LocalPods {
	lp := a.icpt.LocalPods()
	return status.LocalPods{Source: lp.Source, Reason: lp.Reason, HostNetworkOnly: lp.HostNetworkOnly}
}

// upstreamStatus is the upstream endpoints as the Status shows them.
func (a *Agent) upstreamStatus() []status.UpstreamStatus {
	var ups []status.UpstreamStatus
	for _, ep := range a.up.Status() {
		ups = append(ups, status.UpstreamStatus{Endpoint: ep.Host, Healthy: ep.Healthy, Active: ep.Active})
	}
	return ups
}

// Intercepting returns nil while the agent intercepts the Service VIP,
// else the reason it does not.
func (a *Agent) Intercepting() error { return a.icpt.Intercepting() }

// Ready returns nil while the agent is ready in the Kubernetes sense
// (interceptor.Ready).
func (a *Agent) Ready() error { return a.icpt.Ready() }

// SetInterception turns interception on or off while the agent runs: the
// kill switch (interceptor.SetInterception).
func (a *Agent) SetInterception(enabled bool, reason string) { a.icpt.SetInterception(enabled, reason) }

// standInHealth returns nil while the agent can stand in for
// kube-apiserver: its certificate is ready and an upstream endpoint is
// healthy, or it is in degraded mode (or deciding whether to enter it),
// and its cache has warmed up. Otherwise it says why not.
func (a *Agent) standInHealth() error {
	if err := a.cert.Ready(); err != nil {
		return fmt.Errorf("serving certificate not ready: %w", err)
	}
	if err := a.up.Healthy(); err != nil {
		// Unless this is an outage the pods suffer anyway (package degraded).
		if err := a.degraded.Covers(a.now(), err); err != nil {
			return err
		}
	}
	return a.warm.wait(a.cfg, a.now())
}

// warmup returns nil once the pinned resources have synced, or once
// CacheWarmupTimeout has passed since the run began, whichever is first;
// from then on it always does. Until then the agent does not intercept:
// an agent whose memory limit is too low for the cluster is killed while
// it lists, and a crash loop of such agents must not take the node's
// traffic on every restart.
func (w *warmup) wait(cfg *Config, now time.Time) error {
	if w.done.Load() || w.pinnedUnsynced == nil {
		return nil
	}
	pending := w.pinnedUnsynced()
	logger := w.logger
	switch {
	case len(pending) == 0:
		logger.Info("Pinned resources synced", "elapsed", now.Sub(w.started).Round(time.Millisecond))
	case !now.Before(w.started.Add(cfg.CacheWarmupTimeout)):
		logger.Info("Intercepting before the pinned resources synced; their reads are forwarded until they do",
			"timeout", cfg.CacheWarmupTimeout, "unsynced", pending)
	default:
		return fmt.Errorf("waiting up to %s after start-up for the pinned resources to sync: %s",
			cfg.CacheWarmupTimeout, strings.Join(pending, ", "))
	}
	w.done.Store(true)
	return nil
}

// interceptionNote adds to /intercepting and /readyz what an operator
// should know even while the agent intercepts: that it is in degraded
// mode and since when, and the latest source sent back to kube-proxy's
// path because its traffic to the agent was dropped.
func (a *Agent) interceptionNote() string {
	var notes []string
	if s := a.degraded.Note(); s != "" {
		notes = append(notes, s)
	}
	if s := a.icpt.PodPathNote(); s != "" {
		notes = append(notes, "latest blocked source: "+s)
	}
	return strings.Join(notes, "; ")
}

// Healthy returns nil unless the sync loop is stuck: the kubelet restarts
// a container whose /healthz fails, and the kernel's liveness timeout has
// handed the VIP back to kube-proxy long before.
func (a *Agent) Healthy() error { return a.icpt.Healthy() }

// Run starts the agent and blocks until ctx ends, then shuts down
// gracefully. Start-up runs in an order that leaves the node untouched on
// any failure: bind the listener, check the upstream, serve, and only once
// the listener answers, the certificate is ready and an upstream is healthy
// add the address, the liveness set and the redirect, and check that the
// redirect really lands here. An error returned before interception started
// means nothing of this process is left on the node.
func (a *Agent) Run(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	a.warm.started, a.warm.logger = a.now(), logger
	shutDown := false
	defer func() {
		if err != nil && !shutDown {
			a.icpt.RemoveStale()
		}
	}()
	dataplane, reason := a.icpt.Dataplane()
	logger.Info("Using dataplane", "dataplane", dataplane, "reason", reason)
	// The audit backend outlives the server: it stops (delivering what
	// it holds) only after shutdown has drained the requests.
	if err := a.audit.Start(logger); err != nil {
		return err
	}
	defer a.audit.Shutdown()
	// One listener per family, on the address that family's VIPs are
	// redirected to (with the external dataplane, on every address of the
	// agent's network namespace: BindAddresses).
	var ls []net.Listener
	for _, ap := range a.cfg.BindAddresses() {
		l, err := serving.Listen(ctx, ap.String())
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
	if err := a.up.WaitHealthy(ctx, a.cfg.UpstreamCheckTimeout); err != nil {
		if ctx.Err() != nil {
			logger.Info("Stopped before intercepting")
			return nil
		}
		return err
	}
	if err := a.checkRewriteProfiles(ctx); err != nil {
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
		msrv, err := a.status.Start(certCtx, ml, serveErr)
		if err != nil {
			return err
		}
		defer msrv.Close()
	}
	a.serving.Serve(logger, ls, probingCert{certSource: a.cert, probes: a.icpt.Probes()}.GetCertificate, serveErr)

	// The background loops stop before shutdown touches the dataplanes.
	loops, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopLoops(); wg.Wait() }()
	wg.Go(func() { a.up.Run(loops, a.cfg.UpstreamHealthPeriod) })
	wg.Go(func() { a.up.WatchEndpoints(loops, a.restConfig()) })
	if a.cache != nil {
		wg.Go(func() { a.cache.Run(loops) })
	}
	wg.Go(func() { a.icpt.Run(loops) })
	// Degraded mode is decided once the first sync has decided whether to
	// intercept.
	wg.Go(func() {
		select {
		case <-a.icpt.Decided():
			a.degraded.Run(loops)
		case <-loops.Done():
		}
	})

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serving: %w", err)
	}
	stopLoops()
	wg.Wait()
	shutDown = true
	a.shutdown(logger)
	return runErr
}

// listenerLinger is how long the listener keeps accepting after the
// redirect is gone, at shutdown; forgetFlowsPeriod how often, while the
// server drains, the flows of the connections that ended are deleted.
const (
	listenerLinger    = 500 * time.Millisecond
	forgetFlowsPeriod = 250 * time.Millisecond
)

// shutdown hands the VIP back to kube-proxy's path, then lets in-flight
// requests finish within the grace period. The liveness entries go first
// (new connections take kube-proxy's path at once), then the jumps, chain
// and set. Established connections keep their NAT mapping, so the address
// stays until the server has stopped; it stays for good if the jumps could
// not be removed (a redirect to a missing address would black-hole
// traffic), or if a successor has installed its redirect meanwhile.
//
// With the external dataplane there is no redirect of the agent's own to
// remove: Stop turns the agent not ready, and it keeps serving for
// ExternalDrainDelay, while the kubelet's probe and the redirect's owner
// take it out of the redirect, before the same graceful close.
func (a *Agent) shutdown(logger klog.Logger) {
	start := a.now()
	removed := a.icpt.Stop(logger)
	if removed && !a.cfg.External() {
		logger.Info("Redirect removed; new connections to the Service VIPs take kube-proxy's path", "elapsed", a.now().Sub(start))
	}
	if a.cfg.External() {
		logger.Info("Not ready; serving until the external redirect has left this agent", "delay", a.cfg.ExternalDrainDelay)
		time.Sleep(a.cfg.ExternalDrainDelay)
	}
	// Connections redirected just before the entries went may still sit
	// in the listener's accept queue, their clients waiting for the TLS
	// handshake: closing the listener now would reset them. They are
	// accepted (and served) for a moment first; new ones already take
	// kube-proxy's path, except those from a client port whose earlier
	// connection's flow conntrack still keeps: those flows go before the
	// listener closes (interception/flows.go), but for the open
	// connections', which go as they end.
	time.Sleep(listenerLinger)
	if removed {
		a.icpt.ForgetFlows(logger, a.serving.Holds)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownGracePeriod)
	defer cancel()
	done := make(chan error, 1)
	// Shutdown first sends GOAWAY on HTTP/2 connections, so clients open
	// their next request on a new connection (now past the removed
	// redirect); then open watches are ended to make their clients
	// reconnect the same way.
	go func() { done <- a.serving.Shutdown(ctx) }()
	time.Sleep(100 * time.Millisecond)
	a.startDrain()
	// The listener is closed now, and the connections that end while the
	// server drains leave flows a reused port would take over: they go
	// as they end.
	tick := time.NewTicker(forgetFlowsPeriod)
	var err error
drain:
	for {
		select {
		case err = <-done:
			break drain
		case <-tick.C:
			if removed {
				a.icpt.ForgetFlows(logger, a.serving.Holds)
			}
		}
	}
	tick.Stop()
	if err != nil {
		logger.Info("Grace period over; closing remaining connections", "gracePeriod", a.cfg.ShutdownGracePeriod)
		_ = a.serving.Close()
	}
	if removed {
		a.icpt.ForgetFlows(logger, nil)
	}
	a.icpt.ReleaseAddresses(logger, removed)
}

// accessReviewer returns the agent's reviewer of callers' tokens and
// access, made on first use: the cache and the rewriting share it, and
// with it its decision caches and its gate.
func (a *Agent) accessReviewer() (*access.Delegating, error) {
	if a.reviewer != nil {
		return a.reviewer, nil
	}
	reviewer, err := access.New(a.restConfig(), access.Options{
		Gate:        a.cfg.Limits.GateOptions(),
		DegradedTTL: a.cfg.DegradedDecisionTTL,
		Degraded:    a.degraded.Active,
		Unreachable: a.degraded.ReviewsUnreachable,
	})
	if err != nil {
		return nil, fmt.Errorf("access reviews: %w", err)
	}
	if err := reviewer.Metrics().Register(a.metrics.registry); err != nil {
		return nil, fmt.Errorf("registering review metrics: %w", err)
	}
	a.reviewer = reviewer
	return reviewer, nil
}

// newCache builds the node-local cache and the reviewer that guards it,
// both with the agent's own client configuration (with CacheAsNode, the
// cache watches this node's pods and Node as the node). It does nothing
// when no resource is to be cached.
func (a *Agent) newCache() error {
	if len(a.cfg.CacheResources) == 0 {
		return nil
	}
	reviewer, err := a.accessReviewer()
	if err != nil {
		return err
	}
	a.cache, err = apicache.New(apicache.Config{
		NodeName:             a.cfg.NodeName,
		Resources:            a.cfg.CacheResources,
		RESTConfig:           a.restConfig(),
		Reviewer:             reviewer,
		WaitTimeout:          a.cfg.CacheWaitTimeout,
		ConsistentReads:      a.cfg.CacheConsistentReads,
		ProbeMaxObjects:      a.cfg.CacheProbeMaxObjects,
		ProbeBudget:          a.cfg.Limits.ProbeBudget(),
		AsNode:               a.cfg.CacheAsNode,
		OnDemand:             true,
		Pinned:               a.cfg.CachePinnedResources,
		IdleTimeout:          a.cfg.CacheIdleTimeout,
		HistoryEvents:        a.cfg.CacheHistoryEvents,
		HistoryBytes:         a.cfg.CacheHistoryBytes,
		MaxInFlightPerSource: a.cfg.Limits.WithDefaults().MaxCacheRequestsPerSource,
		Registerer:           a.metrics.registry,
	})
	if err != nil {
		return err
	}
	a.warm.pinnedUnsynced = a.cache.PinnedUnsynced
	return nil
}
