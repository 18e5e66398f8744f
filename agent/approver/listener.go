package approver

import (
	"context"
	"net"
	"net/http"

	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/internal/metricsserver"
)

// listenerOpenPaths are the probes, which answer anyone: the kubelet
// probes them without credentials. /metrics needs a token RBAC allows to
// get it, as on the agents.
var listenerOpenPaths = []string{"/healthz", "/livez", "/readyz"}

// ListenerConfig is what the approver's metrics listener is built from.
type ListenerConfig struct {
	// Name goes into a self-signed certificate: the pod's name.
	Name string
	// TLSCertFile and TLSKeyFile are the serving certificate, reloaded as
	// they change; empty means a self-signed certificate made at start.
	TLSCertFile, TLSKeyFile string
	// RESTConfig is the approver's own client configuration, which sends
	// the TokenReviews and SubjectAccessReviews.
	RESTConfig *rest.Config
}

// Listener serves the approver's metrics and probes over HTTPS, as the
// agents serve theirs: /metrics to callers kube-apiserver authenticates
// (TokenReview) and RBAC allows to get it (SubjectAccessReview), cached and
// budgeted; /healthz, /livez and /readyz to anyone.
type Listener struct {
	srv *metricsserver.Server
}

// NewListener builds the listener of m's metrics and the probes healthz
// (/healthz and /livez) and readyz (/readyz); it registers its own metrics
// in m's registry.
func NewListener(cfg ListenerConfig, m *Metrics, healthz, readyz func(*http.Request) error) (*Listener, error) {
	srv, err := metricsserver.New(metricsserver.Config{
		Name:        cfg.Name,
		TLSCertFile: cfg.TLSCertFile,
		TLSKeyFile:  cfg.TLSKeyFile,
		OpenPaths:   listenerOpenPaths,
		RESTConfig:  cfg.RESTConfig,
	}, m.Handler(healthz, readyz), m.Registry)
	if err != nil {
		return nil, err
	}
	return &Listener{srv: srv}, nil
}

// Start serves on l until the returned server is closed or serving fails,
// which it reports on errs. ctx bounds the reloading of the certificate
// files; the caller closes the server.
func (l *Listener) Start(ctx context.Context, ln net.Listener, errs chan<- error) (*http.Server, error) {
	return l.srv.Start(ctx, ln, errs)
}

// Handler is the listener's handler chain, for tests that send it
// requests without TLS.
func (l *Listener) Handler() http.Handler { return l.srv.Handler() }
