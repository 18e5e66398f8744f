package webhookproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/kube-apicache/kube-apicache/agent/internal/keypair"
)

// ServingCertificate is the certificate and key the proxy serves, from
// files that it rereads when they change (k8s.io/apiserver's dynamic
// serving content watches them): the webhook's own serving certificate,
// as kube-apiserver verifies it with the webhook configuration's
// caBundle.
type ServingCertificate struct {
	content *dynamiccertificates.DynamicCertKeyPairContent
	pair    *keypair.Cached
}

// NewServingCertificate loads the certificate chain and key files (PEM).
// It fails if they cannot be read or do not make a pair.
func NewServingCertificate(certFile, keyFile string) (*ServingCertificate, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("webhook-serving-cert", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the serving certificate: %w", err)
	}
	c := &ServingCertificate{content: content, pair: keypair.NewCached(content)}
	if _, err := c.current(); err != nil {
		return nil, err
	}
	return c, nil
}

// Run watches the files until ctx ends.
func (c *ServingCertificate) Run(ctx context.Context) { c.content.Run(ctx, 1) }

// GetCertificate is a tls.Config GetCertificate: new handshakes get the
// files' present content.
func (c *ServingCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.current()
}

// current returns the parsed pair of the files' present content.
func (c *ServingCertificate) current() (*tls.Certificate, error) {
	pair, err := c.pair.Get()
	if err != nil {
		return nil, fmt.Errorf("the serving certificate: %w", err)
	}
	return pair, nil
}

// BackendTLS is how the proxy verifies the webhook server it forwards to.
type BackendTLS struct {
	// CAFile is the CA bundle (PEM) that verifies the webhook server's
	// certificate, reread when it changes. Empty: the system's roots.
	CAFile string
	// ServerName is the name the webhook server's certificate must carry,
	// also sent as SNI. Empty: the backend URL's host. The webhook's own
	// serving certificate names its Service, not 127.0.0.1: a proxy beside
	// the webhook server in its pod dials the loopback address and checks
	// the Service's name.
	ServerName string
}

// Transport returns the transport of the calls to backend, verifying it
// as b says, and starts rereading b.CAFile until ctx ends. It fails on a
// CA bundle that cannot be read or holds no certificate.
func (b BackendTLS) Transport(ctx context.Context, backend *url.URL) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// The webhook server is local or in the cluster: the proxy environment
	// variables are not for it.
	t.Proxy = nil
	if backend.Scheme != "https" {
		return t, nil
	}
	name := b.ServerName
	if name == "" {
		name = backend.Hostname()
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if b.CAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("webhook-backend-ca", b.CAFile)
		if err != nil {
			return nil, fmt.Errorf("loading the backend CA bundle: %w", err)
		}
		// The chain and name are verified in VerifyConnection, against
		// the bundle as it is at each handshake, instead of against a
		// RootCAs pool fixed now.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyPeer(ca, name, cs) }
		go ca.Run(ctx, 1)
	}
	t.TLSClientConfig = cfg
	return t, nil
}

// caContent is the part of k8s.io/apiserver's CA bundle content that
// verifyPeer uses.
type caContent interface {
	VerifyOptions() (x509.VerifyOptions, bool)
}

// verifyPeer verifies the webhook server's certificate chain against the
// CA bundle's present content, for name and server authentication.
func verifyPeer(ca caContent, name string, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the webhook server presented no certificate")
	}
	opts, ok := ca.VerifyOptions()
	if !ok {
		return errors.New("no backend CA bundle loaded")
	}
	// The bundle's options are made for client certificates.
	opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	opts.DNSName = name
	opts.Intermediates = x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("verifying the webhook server's certificate: %w", err)
	}
	return nil
}
