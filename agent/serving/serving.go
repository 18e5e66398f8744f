package serving

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"syscall"

	"golang.org/x/sys/unix"
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
func newServer(handler http.Handler, getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), limits Limits) *http.Server {
	limits = limits.WithDefaults()
	return &http.Server{
		Handler:     withRequestSeen(handler),
		ConnContext: withConn,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			NextProtos:     []string{"h2", "http/1.1"},
			GetCertificate: getCertificate,
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

// Listen binds addr. IP_FREEBIND lets the socket bind before the agent has
// added the address to the node, so a busy port is found out before anything
// on the node changes.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
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
