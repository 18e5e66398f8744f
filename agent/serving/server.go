package serving

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/audit"
	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewriting"
	"github.com/kube-apicache/kube-apicache/agent/upstream"
	apicache "github.com/kube-apicache/kube-apicache/cache"
)

// Options is what the serving chain is built from.
type Options struct {
	// Limits bound what clients can make the agent hold.
	Limits Limits
	// Upstream is where forwarded requests go.
	Upstream *upstream.Set
	// Cache answers covered reads; nil: every request is forwarded.
	Cache *apicache.Cache
	// Audit records the requests the cache answers.
	Audit *audit.Auditor
	// Rewriting renames the requests of the callers rewrite profiles
	// select, and restores their answers; nil: nobody is rewritten.
	Rewriting *rewriting.Filter
	// Degraded reports whether the agent is in degraded mode: forwarded
	// requests then fail fast, and the cache recalls decisions.
	Degraded func() bool
	// SkipSource sends a client-certificate caller's source to
	// kube-proxy's path for BypassDuration (steerable false: it cannot);
	// IsNodeAddress tells a host-network caller, which cannot be steered.
	SkipSource     func(netip.Addr) (steerable bool, err error)
	IsNodeAddress  func(netip.Addr) bool
	BypassDuration time.Duration
	// Drain is cancelled when shutdown starts: open watches end so that
	// their clients reconnect, past the removed redirect.
	Drain context.Context
	// Registry takes the serving metrics.
	Registry prometheus.Registerer
}

// Server is the agent's serving side: the TLS listeners with their
// connection bounds, and the handler chain every request takes, built
// once: client certificates handed off, deadlines and long-running
// bounds, then the cache for covered reads of authorized callers, and the
// forwarder for everything else.
type Server struct {
	limits   Limits
	up       *upstream.Set
	cache    *apicache.Cache
	audit    *audit.Auditor
	rewrite  *rewriting.Filter
	degraded func() bool
	drain    context.Context
	metrics  *metrics
	// clientCerts hands client-certificate callers to kube-apiserver.
	clientCerts *clientCertificates
	handler     http.Handler
	// srv serves the listeners once Serve was called, conns bounds and
	// tracks their connections.
	srv   *http.Server
	conns *connLimiter
}

// New builds the handler chain of o. It starts nothing.
func New(o Options) *Server {
	s := &Server{
		limits:      o.Limits,
		up:          o.Upstream,
		cache:       o.Cache,
		audit:       o.Audit,
		rewrite:     o.Rewriting,
		degraded:    o.Degraded,
		drain:       o.Drain,
		metrics:     newMetrics(o.Registry),
		clientCerts: newClientCertificates(o),
	}
	s.handler = s.buildHandler()
	return s
}

// Handler is the request path, as Serve serves it.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves every listener in ls with TLS (getCertificate), under one
// set of connection bounds for them all, until Shutdown or Close; each
// listener's end is sent on errs.
func (s *Server) Serve(logger klog.Logger, ls []net.Listener, getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), errs chan<- error) {
	s.srv = newServer(s.handler, getCertificate, s.limits)
	s.srv.ErrorLog = apihttp.ServerErrorLog(logger)
	s.srv.ConnState = s.metrics.trackConn
	s.conns = newConnLimiter(s.limits, s.metrics, logger)
	for _, l := range ls {
		go func() { errs <- s.srv.Serve(tls.NewListener(s.conns.listener(l), s.srv.TLSConfig)) }()
	}
}

// Holds reports whether the server holds an open connection from the
// client address and port remote (hijacked ones included). False before
// Serve.
func (s *Server) Holds(remote netip.AddrPort) bool {
	return s.conns != nil && s.conns.holds(remote)
}

// Shutdown stops accepting, sends GOAWAY on HTTP/2 connections and waits
// for the requests in flight until ctx ends (http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes every connection at once.
func (s *Server) Close() error { return s.srv.Close() }

// buildHandler assembles the request path once, at start-up.
func (s *Server) buildHandler() http.Handler {
	readOnly, mutating := s.limits.WithDefaults().inFlightShares()
	var observe func(*http.Response)
	if s.cache != nil {
		observe = s.cache.ObserveWrite
	}
	// In degraded mode nothing is forwarded: each request fails fast
	// (failfast.go), before it takes an in-flight slot.
	forward := s.metrics.instrument("forward", failFastWhenDegraded(s.degraded,
		s.limitInFlight("forward", newForwarder(s.up, observe), readOnly, mutating)))
	if s.cache != nil {
		// Covered reads of authorized callers are answered from the cache;
		// everything else goes to forward unchanged.
		forward = s.cache.Handler(forward, s.cacheHit)
	}
	return s.front(forward)
}

// cacheHit wraps the handler of the reads the cache answers. Cached reads
// have an in-flight bound of their own, so a slow upstream holding
// forwarded reads cannot starve them.
func (s *Server) cacheHit(h http.Handler) http.Handler {
	readOnly, _ := s.limits.WithDefaults().inFlightShares()
	return s.metrics.instrument("cache", s.audit.Wrap(s.limitInFlight("cache", h, readOnly, noLimit)))
}

// front is what every request passes before h, which answers it from the
// cache or forwards it.
func (s *Server) front(h http.Handler) http.Handler {
	lim := s.limits.WithDefaults()
	// Every request, cached or forwarded, counts against the long-running
	// bounds if it is long-running, and gets deadlines for its body and
	// its answer if it is not. Long-running requests whose body
	// kube-apiserver ignores have it dropped.
	// The requests of callers a rewrite profile selects are renamed
	// within those deadlines (the rewriting reads the body), before the
	// cache or the forwarder sees them.
	h = withoutIgnoredBody(s.limitLongRunning(withBodyDeadline(s.withRequestTimeout(s.rewrite.Wrap(h), lim.RequestTimeout), lim.RequestBodyTimeout)))
	// Callers with a TLS client certificate are handed to kube-apiserver
	// before anything else sees their requests (clientcert.go).
	return s.clientCerts.wrap(s.audit.WithReceivedTimestamp(apihttp.WithRequestInfo(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := request.RequestInfoFrom(r.Context()); ok && info.Verb == "watch" {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(s.drain, cancel)
			defer stop()
			r = r.WithContext(ctx)
		}
		if s.degraded() {
			r = r.WithContext(apicache.WithDegraded(r.Context()))
		}
		h.ServeHTTP(w, r)
	}))))
}
