package agent

import (
	"context"
	"crypto/tls"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-apicache/kube-apicache/agent/identity"
	"github.com/kube-apicache/kube-apicache/agent/interception"
)

// newCertSource picks the serving certificate source: files when
// --tls-cert-file is given, else a certificate requested through the CSR
// API with the agent's own credentials. Either way its state is exported as
// metrics.
func (a *Agent) newCertSource() (certSource, error) {
	cfg := a.cfg
	opts := identity.Options{
		NodeName:   cfg.NodeName,
		SANs:       identity.ServingSANs(cfg.ServiceVIPs, cfg.ListenIPs(), orDefault(cfg.ClusterDomain, DefaultClusterDomain)),
		CAFile:     orDefault(cfg.PodCAFile, DefaultPodCAFile),
		StateDir:   cfg.CertificateStateDir,
		SignerName: cfg.SignerName,
	}
	var src interface {
		certSource
		identity.Source
	}
	if cfg.TLSCertFile != "" {
		s, err := identity.NewFileSource(cfg.TLSCertFile, cfg.TLSKeyFile, opts)
		if err != nil {
			return nil, err
		}
		src = s
	} else {
		lifetime := cfg.CertificateLifetime
		if lifetime == 0 {
			lifetime = DefaultCertificateLifetime
		}
		// The client is built per request: restConfig follows the active
		// upstream and rereads the rotated token.
		s, err := identity.NewCSRSource(opts, lifetime, func() (kubernetes.Interface, error) {
			return kubernetes.NewForConfig(a.restConfig())
		})
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		src = s
	}
	for _, c := range identity.Metrics(src) {
		if err := a.metrics.registry.Register(c); err != nil {
			return nil, fmt.Errorf("registering certificate metrics: %w", err)
		}
	}
	return src, nil
}

// RenewCertificate asks for a new serving certificate now: a new key and
// CSR, or a reread of the certificate files. The current certificate is
// served until its successor is ready.
func (a *Agent) RenewCertificate() {
	if r, ok := a.cert.(interface{ Renew() }); ok {
		r.Renew()
	}
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// certSource supplies the serving certificate and says whether it may be
// used to stand in for kube-apiserver.
type certSource interface {
	// GetCertificate is a tls.Config GetCertificate: a rotated certificate
	// is served to new handshakes while established connections keep theirs.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Ready returns nil while the certificate is valid now and trusted by
	// the pods' CA bundle for every name and IP they dial; else the reason.
	Ready() error
	// Run keeps the certificate current until ctx ends.
	Run(ctx context.Context)
}

// The sources live in package identity: a certificate obtained through the
// CSR API, or one from files.
var (
	_ certSource = (*identity.CSRSource)(nil)
	_ certSource = (*identity.FileSource)(nil)
)

// probingCert wraps a certSource so that the listener records self-check
// handshakes.
type probingCert struct {
	certSource
	probes *interception.Probes
}

func (c probingCert) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.probes.Observe(hello.ServerName)
	return c.certSource.GetCertificate(hello)
}
