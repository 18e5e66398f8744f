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
	"sync"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// Agent runs the proxy and owns its node state (address, chain, jumps).
type Agent struct {
	// Fixed at construction.
	cfg     *Config
	cert    *servingCert
	up      *upstreams
	metrics *metrics
	chain   *netrules.ChainSyncer
	addr    *netrules.LocalAddress
	handler http.Handler
	// drain is cancelled when shutdown starts, which ends open watches so
	// their clients reconnect, now past the removed redirect.
	drain      context.Context
	startDrain context.CancelFunc
	now        func() time.Time

	mu sync.Mutex // protects the field below
	// notReady is why the agent is not intercepting; nil while it is.
	notReady error
}

// New checks cfg and loads what the agent needs from disk. It changes
// nothing on the node. ipt and nl are the kernel interfaces to manage rules
// and the listen address with.
func New(cfg *Config, ipt netrules.IPTables, nl netrules.Netlink) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	drain, startDrain := context.WithCancel(context.Background())
	a := &Agent{
		cfg:        cfg,
		metrics:    newMetrics(),
		chain:      netrules.NewChainSyncer(ipt, redirectChain(cfg)),
		addr:       netrules.NewLocalAddress(nl, cfg.ListenLink, cfg.ListenAddress.Addr()),
		drain:      drain,
		startDrain: startDrain,
		now:        time.Now,
		notReady:   errors.New("starting"),
	}
	var err error
	if a.cert, err = newServingCert(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
		a.removeStale()
		return nil, err
	}
	if a.up, err = newUpstreams(cfg); err != nil {
		a.removeStale()
		return nil, err
	}
	a.handler = a.buildHandler()
	return a, nil
}

// buildHandler assembles the request path once, at start-up.
func (a *Agent) buildHandler() http.Handler {
	forward := a.metrics.instrument("forward", newForwarder(a.up))
	return withRequestInfo(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := request.RequestInfoFrom(r.Context()); ok && info.Verb == "watch" {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(a.drain, cancel)
			defer stop()
			r = r.WithContext(ctx)
		}
		forward.ServeHTTP(w, r)
	}))
}

// Ready returns nil while the agent intercepts, else the reason it does not.
func (a *Agent) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.notReady
}

func (a *Agent) setNotReady(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notReady = err
	if err == nil {
		a.metrics.ready.Set(1)
	} else {
		a.metrics.ready.Set(0)
	}
}

// Run starts the agent and blocks until ctx ends, then shuts down
// gracefully. Start-up runs in an order that leaves the node untouched on
// any failure: bind the listener, check the upstream, and only then add the
// address and the redirect. An error returned before interception started
// means nothing was changed on the node.
func (a *Agent) Run(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	defer func() {
		if err != nil {
			a.removeStale()
		}
	}()
	l, err := listen(ctx, a.cfg.ListenAddress.String())
	if err != nil {
		return err
	}
	defer l.Close()
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
	go a.cert.run(certCtx)

	srv := newServer(a.handler, a.cert)
	srv.ErrorLog = newServerErrorLog(logger)
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(tls.NewListener(l, srv.TLSConfig)) }()
	if ml != nil {
		msrv := &http.Server{Handler: a.metrics.handler(a.Ready), ReadHeaderTimeout: 10 * time.Second}
		go func() { serveErr <- msrv.Serve(ml) }()
		defer msrv.Close()
	}

	if err := a.sync(ctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("installing redirect: %w", err)
	}
	a.setNotReady(nil)
	logger.Info("Intercepting the kubernetes Service", "vips", a.cfg.ServiceVIPs, "port", a.cfg.ServicePort,
		"listen", a.cfg.ListenAddress, "link", a.addr.Link(), "upstream", a.up.pick().Host)

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
			if err := a.sync(ctx); err != nil {
				// Fail open: a redirect the agent cannot vouch for (say, to
				// an address it could not restore) must not stay.
				logger.Error(err, "Syncing redirect failed; handing the VIP back to kube-proxy until a sync succeeds")
				a.setNotReady(fmt.Errorf("sync failed: %w", err))
				if err := a.chain.Remove(); err != nil {
					logger.Error(err, "Removing redirect rules")
				}
			} else if a.Ready() != nil {
				logger.Info("Redirect restored")
				a.setNotReady(nil)
			}
		}
	}
	a.shutdown(logger, srv)
	return runErr
}

// sync reconciles the listen address and the redirect chain. The address
// comes first: a redirect to an address that is not there would black-hole
// traffic.
func (a *Agent) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	start := a.now()
	added, err := a.addr.Sync()
	if err != nil {
		a.metrics.ruleSyncs.WithLabelValues("error").Inc()
		return err
	}
	res, err := a.chain.Sync()
	if err != nil {
		a.metrics.ruleSyncs.WithLabelValues("error").Inc()
		return err
	}
	if added || res.Changed() {
		a.metrics.ruleSyncs.WithLabelValues("repaired").Inc()
		logger.V(2).Info("Synced redirect", "addressAdded", added, "chainCreated", res.ChainCreated,
			"rulesRewritten", res.RulesRewritten, "jumpsFixed", res.JumpsFixed, "elapsed", a.now().Sub(start))
	} else {
		a.metrics.ruleSyncs.WithLabelValues("unchanged").Inc()
		logger.V(4).Info("Redirect in sync", "elapsed", a.now().Sub(start))
	}
	return nil
}

// shutdown hands the VIP back to kube-proxy's path, then lets in-flight
// requests finish within the grace period. New connections stop arriving as
// soon as the jumps are gone; established ones keep their NAT mapping, so
// the address stays until the server has stopped, and stays for good if the
// jumps could not be removed (a redirect to a missing address would
// black-hole traffic).
func (a *Agent) shutdown(logger klog.Logger, srv *http.Server) {
	a.setNotReady(errors.New("shutting down"))
	removed := false
	for i := 0; i < 3 && !removed; i++ {
		if err := a.chain.Remove(); err != nil {
			logger.Error(err, "Removing redirect rules", "attempt", i+1)
			time.Sleep(time.Second)
			continue
		}
		removed = true
	}
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
	if err := a.addr.Remove(); err != nil {
		logger.Error(err, "Removing listen address")
	}
	logger.Info("Stopped; the kubernetes Service goes straight to kube-apiserver again")
}

// removeStale removes a redirect and address left on the node, by this
// process's failed start or by an earlier instance that died: with no agent
// serving, the VIP must go straight to kube-apiserver. It creates nothing,
// so on a clean node it changes nothing.
func (a *Agent) removeStale() {
	logger := klog.Background()
	if err := a.chain.Remove(); err != nil {
		logger.Error(err, "Removing stale redirect rules")
		return // keep the address the remaining jumps point to
	}
	if err := a.addr.Remove(); err != nil {
		logger.Error(err, "Removing stale listen address")
	}
}
