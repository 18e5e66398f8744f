package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// servingCert supplies the TLS serving certificate from files, reloading them
// when they change (k8s.io/apiserver's dynamic serving content watches them).
// The parsed pair is cached until the file content changes.
type servingCert struct {
	content *dynamiccertificates.DynamicCertKeyPairContent

	mu      sync.Mutex // protects the fields below
	certPEM []byte
	pair    *tls.Certificate
}

// newServingCert loads and validates the certificate and key files.
func newServingCert(certFile, keyFile string) (*servingCert, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading serving certificate: %w", err)
	}
	s := &servingCert{content: content}
	pair, err := s.current()
	if err != nil {
		return nil, err
	}
	if now := time.Now(); now.After(pair.Leaf.NotAfter) || now.Before(pair.Leaf.NotBefore) {
		return nil, fmt.Errorf("serving certificate %s is not valid now (valid %s to %s)", certFile,
			pair.Leaf.NotBefore.Format(time.RFC3339), pair.Leaf.NotAfter.Format(time.RFC3339))
	}
	return s, nil
}

// current returns the parsed certificate for the files' present content.
func (s *servingCert) current() (*tls.Certificate, error) {
	certPEM, keyPEM := s.content.CurrentCertKeyContent()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pair != nil && bytes.Equal(certPEM, s.certPEM) {
		return s.pair, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing serving certificate: %w", err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing serving certificate: %w", err)
		}
	}
	s.certPEM, s.pair = certPEM, &pair
	return s.pair, nil
}

// run watches the files until ctx ends.
func (s *servingCert) run(ctx context.Context) {
	s.content.Run(ctx, 1)
}

// getCertificate is a tls.Config GetCertificate: a rotated certificate is
// served to new handshakes while established connections keep theirs.
func (s *servingCert) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.current()
}

// newServer returns the HTTPS server for handler. HTTP/2 and HTTP/1.1 are
// offered; there is no write timeout, since watches are long-lived.
func newServer(handler http.Handler, cert *servingCert) *http.Server {
	return &http.Server{
		Handler: handler,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
			GetCertificate: cert.getCertificate,
		},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    1 << 20,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: 1000,
		},
	}
}

// listen binds addr. IP_FREEBIND lets the socket bind before the agent has
// added the address to the node, so a busy port is found out before anything
// on the node changes.
func listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			}); err != nil {
				return err
			}
			return serr
		},
	}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return l, nil
}
