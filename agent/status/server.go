package status

import (
	"context"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/internal/metricsserver"
)

// The metrics listener serves /metrics, the health paths and, with
// --profiling, /debug/pprof/ over HTTPS. With hostNetwork its port is
// reachable from the node's pods and, bound to the node's IP, from the
// cluster network, so every request is authenticated and authorized
// through kube-apiserver (agent/internal/metricsserver) except the health
// paths, which the kubelet probes anonymously.

// metricsHealthPaths answer anyone, anonymous callers included: the kubelet
// probes them without credentials. /statusz is not among them: like
// Kubernetes components' z-pages it needs a caller RBAC allows to get it
// (the ServiceAccount kube-apicache-status, or system:monitoring).
var metricsHealthPaths = []string{"/healthz", "/readyz", "/livez", "/intercepting"}

// TokenHeader carries a bearer token through kube-apiserver's pods proxy,
// which drops the Authorization header after authenticating its own
// caller. `kube-apicache status` sends a short-lived token of the
// ServiceAccount kube-apicache-status in it; the listener reviews it as
// any bearer token.
const TokenHeader = "X-Kube-Apicache-Token"

// Config is what the metrics listener is built from.
type Config struct {
	// NodeName goes into the Status and into a self-signed certificate.
	NodeName string
	// TLSCertFile and TLSKeyFile are the serving certificate, reloaded as
	// they change; empty means a self-signed certificate made at start.
	TLSCertFile, TLSKeyFile string
	// Profiling serves /debug/pprof/ to callers allowed to read it.
	Profiling bool
	// RESTConfig is the configuration of the agent's own client, which
	// sends the TokenReviews and SubjectAccessReviews. New calls it once.
	RESTConfig func() *rest.Config
}

// Checks are what the listener's paths and the Status report of the rest
// of the agent. Each func must be safe to call from any goroutine at any
// time, and quick: probes and scrapes call them.
type Checks struct {
	// Healthy answers /healthz and /livez, Ready /readyz and Intercepting
	// /intercepting: nil for "ok", else the reason for a 503.
	Healthy, Ready, Intercepting func() error
	// Note is what an operator should know even while all is well
	// (degraded mode, a blocked source), added to the ready and
	// intercepting answers; "" for nothing.
	Note func() string
	// Dataplane names the backend the redirect runs in, DataplaneReason
	// why it was chosen.
	Dataplane, DataplaneReason string
	// Upstreams are the kube-apiserver endpoints and their health.
	Upstreams func() []UpstreamStatus
	// LocalPods is where the agent learns this node's pod IPs from, added
	// to the ready and intercepting answers and to the Status; nil for
	// nothing.
	LocalPods func() LocalPods
}

// Server is the metrics listener's HTTP server and what it needs at
// run time.
type Server struct {
	cfg      Config
	checks   Checks
	gatherer prometheus.Gatherer
	listener *metricsserver.Server
}

// New builds the metrics listener's handler chain and loads its
// certificate files, if any. It serves the metrics in reg, and registers
// its own there.
func New(cfg Config, checks Checks, reg *prometheus.Registry) (*Server, error) {
	s := &Server{cfg: cfg, checks: checks, gatherer: reg}
	mux := handler(reg, checks.Healthy, checks.Ready, checks.Intercepting, checks.note, checks.dataplaneNote(), cfg.Profiling)
	mux.Handle(StatuszPath, s.statuszHandler())
	var err error
	s.listener, err = metricsserver.New(metricsserver.Config{
		Name:        cfg.NodeName,
		TLSCertFile: cfg.TLSCertFile,
		TLSKeyFile:  cfg.TLSKeyFile,
		OpenPaths:   metricsHealthPaths,
		Profiling:   cfg.Profiling,
		SecurePaths: []string{StatuszPath},
		TokenHeader: TokenHeader,
		RESTConfig:  cfg.RESTConfig(),
	}, mux, reg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Start serves on l until the returned server is closed or serving
// fails, which it reports on errs. ctx bounds the reloading of the
// certificate files; the caller closes the server (at the end of its
// shutdown, so that probes are answered until then).
func (s *Server) Start(ctx context.Context, l net.Listener, errs chan<- error) (*http.Server, error) {
	return s.listener.Start(ctx, l, errs)
}
