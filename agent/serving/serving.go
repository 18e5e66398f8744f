package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-apicache/kube-apicache/agent/identity"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

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

// newServer returns the HTTPS server for handler, with kube-apiserver's
// secure-serving limits unless limits say otherwise: TLS 1.2 or later, ALPN
// h2 and http/1.1, 1 MiB of headers (431 above), a header read timeout
// against slowloris, an idle timeout, and bounded HTTP/2 streams, frames and
// windows. The server has no read or write timeout for whole requests,
// since watches are long-lived: requests that are not get theirs from the
// handler (withBodyDeadline, withRequestTimeout), and an HTTP/2
// connection nothing could be written to for the request timeout is
// closed. It must serve a connLimiter's listener, whose connections it
// tells when their first request arrived.
//
// What net/http itself already guarantees, pinned by tests rather than
// re-implemented: HTTP/2 rapid reset (a client that keeps opening and
// resetting streams) cannot run more handlers than MaxConcurrentStreams at
// once and gets its connection closed when it keeps going; a request with
// both Content-Length and Transfer-Encoding: chunked is read as chunked with
// the Content-Length dropped, and every body is re-framed by the forwarder,
// so an ambiguous length never reaches kube-apiserver; conflicting
// Content-Lengths get 400 and other transfer codings 501.
func newServer(handler http.Handler, cert certSource, limits Limits) *http.Server {
	limits = limits.withDefaults()
	return &http.Server{
		Handler:     withRequestSeen(handler),
		ConnContext: withConn,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
			GetCertificate: cert.GetCertificate,
			// Asked for, not verified: a caller that presents one is handed
			// to kube-apiserver, which authenticates it (clientcert.go).
			ClientAuth: tls.RequestClientCert,
		},
		ReadHeaderTimeout: limits.ReadHeaderTimeout,
		IdleTimeout:       limits.IdleTimeout,
		MaxHeaderBytes:    limits.MaxHeaderBytes,
		HTTP2:             limits.http2Config(),
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
