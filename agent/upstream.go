package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// upstreams holds the kube-apiserver endpoints and the one transport used to
// reach them. The transport carries no credentials of its own: no client
// certificate, no token. Every forwarded request authenticates with what the
// client sent.
type upstreams struct {
	// transport carries ordinary requests, over HTTP/2 where upstream
	// offers it. upgradeTransport speaks only HTTP/1.1: net/http treats
	// only WebSocket upgrades as HTTP/1-only and would send a SPDY upgrade
	// (exec, attach, port-forward) into a pooled HTTP/2 connection, where
	// upgrades do not exist.
	transport        *http.Transport
	upgradeTransport *http.Transport

	mu        sync.Mutex // protects the fields below
	endpoints []*url.URL
	active    int // index into endpoints
}

// newUpstreams builds the transport for cfg's upstreams. It fails on an
// unreadable or empty CA bundle.
func newUpstreams(cfg *Config) (*upstreams, error) {
	pem, err := os.ReadFile(cfg.UpstreamCAFile)
	if err != nil {
		return nil, fmt.Errorf("reading upstream CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("upstream CA bundle %s holds no PEM certificate", cfg.UpstreamCAFile)
	}
	dialer := &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control:   markSocket(cfg.SocketMark),
	}
	t := &http.Transport{
		// Never honour HTTP(S)_PROXY from the environment: endpoints are
		// dialled directly.
		Proxy:       nil,
		DialContext: dialer.DialContext,
		TLSClientConfig: &tls.Config{
			RootCAs:    pool,
			ServerName: cfg.UpstreamServerName,
			MinVersion: tls.VersionTLS12,
		},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		// Detect dead HTTP/2 connections (a vanished apiserver) the way
		// client-go does, instead of waiting for TCP to give up.
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
		},
	}
	return &upstreams{transport: t, upgradeTransport: http1Only(t), endpoints: cfg.Upstreams}, nil
}

// http1Only returns a copy of t that never negotiates HTTP/2 and keeps no
// idle connections: an upgraded connection is never pooled anyway.
func http1Only(t *http.Transport) *http.Transport {
	h1 := t.Clone()
	h1.ForceAttemptHTTP2 = false
	h1.HTTP2 = nil
	h1.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	h1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	h1.DisableKeepAlives = true
	return h1
}

// RoundTrip sends upgrade requests over HTTP/1.1 and all others over the
// shared transport.
func (u *upstreams) RoundTrip(req *http.Request) (*http.Response, error) {
	if isUpgrade(req) {
		return u.upgradeTransport.RoundTrip(req)
	}
	return u.transport.RoundTrip(req)
}

// markSocket returns a dialer Control that sets SO_MARK on every socket.
func markSocket(mark uint32) func(network, address string, c syscall.RawConn) error {
	if mark == 0 {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setting SO_MARK 0x%x on upstream socket: %w", mark, serr)
		}
		return nil
	}
}

// pick returns the endpoint that requests go to now.
func (u *upstreams) pick() *url.URL {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.endpoints[u.active]
}

// check probes one endpoint: the TLS handshake must verify and /readyz must
// answer. The probe is anonymous, so 401 and 403 (anonymous auth off, or
// /readyz not public) still prove a live, genuine apiserver.
func (u *upstreams) check(ctx context.Context, ep *url.URL) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.JoinPath("/readyz").String(), nil)
	if err != nil {
		return err
	}
	resp, err := u.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusUnauthorized, http.StatusForbidden:
		return nil
	}
	return fmt.Errorf("GET %s/readyz: %s", ep.Host, resp.Status)
}

// waitHealthy checks the endpoints until one answers or timeout passes, and
// makes the first healthy one active.
func (u *upstreams) waitHealthy(ctx context.Context, timeout time.Duration) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var errs []error
	for {
		errs = errs[:0]
		for i, ep := range u.endpoints {
			err := u.check(ctx, ep)
			if err == nil {
				u.mu.Lock()
				u.active = i
				u.mu.Unlock()
				logger.V(2).Info("Upstream healthy", "endpoint", ep.Host)
				return nil
			}
			logger.V(2).Info("Upstream not healthy yet", "endpoint", ep.Host, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", ep.Host, err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no upstream answered within %s: %w", timeout, errors.Join(errs...))
		case <-time.After(time.Second):
		}
	}
}
