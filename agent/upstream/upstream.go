package upstream

import (
	"bytes"
	"cmp"
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/identity"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// Set holds the kube-apiserver endpoints, their health, and the one
// transport used to reach them. The transport carries no credentials of its
// own: no client certificate, no token. Every forwarded request
// authenticates with what the client sent.
//
// Endpoints start as the --upstream flag and then follow the
// default/kubernetes EndpointSlices (setEndpoints). Their health comes from
// the requests sent to them and, where those prove nothing recent, from
// probes (health.go); requests go to the active endpoint, which moves to a
// Healthy one when it fails. Reads that fail before an answer came, and any
// request that could not even connect, are retried on another endpoint.
type Set struct {
	// bodies bounds the request bodies buffered for a retry, all requests
	// together. A body that does not fit is streamed, and its request is
	// not retried once its body has been read from.
	bodies byteBudget
	// transport carries ordinary requests, over HTTP/2 where upstream
	// offers it. upgradeTransport speaks only HTTP/1.1: net/http treats
	// only WebSocket upgrades as HTTP/1-only and would send a SPDY upgrade
	// (exec, attach, port-forward) into a pooled HTTP/2 connection, where
	// upgrades do not exist.
	transport        *http.Transport
	upgradeTransport *http.Transport
	// OnChange, if set, is called (without locks held) after the active
	// endpoint or an endpoint's health changed.
	OnChange func()
	// period is the health period and window the success window (zero:
	// the defaults); now, if set, replaces time.Now in health decisions.
	period, window time.Duration
	now            func() time.Time
	// kick wakes the health loop (run) early; nil in tests without one.
	kick  chan struct{}
	stats healthStats

	mu        sync.Mutex // protects the fields below
	endpoints []*endpoint
	active    int // index into endpoints
}

// endpoint is one kube-apiserver and its health.
type endpoint struct {
	url *url.URL
	// lastSuccess is when the endpoint last answered (a response under
	// 500, bytes of one, or a passed probe), and lastTrouble when it last
	// answered 5xx or a request to it failed after it was sent, both in
	// Unix nanoseconds; atomic, as every request sets them.
	lastSuccess, lastTrouble atomic.Int64
	// Fields below are protected by Set.mu.
	healthy  bool
	checked  bool // health was checked at least once
	failures int  // consecutive failed probes
	lastErr  error
	// lastProbe is when the last probe started; jitter lengthens the
	// success window until the next probe; probeNow asks for a probe at
	// the next look; probing is set while a probe runs.
	lastProbe time.Time
	jitter    time.Duration
	probeNow  bool
	probing   bool
	// inflight cancels the requests in flight to this endpoint, so that
	// streams on a dead endpoint end and their clients reconnect.
	inflight map[*inflightReq]context.CancelFunc
}

// inflightReq is one request in flight to ep, which cancel ends, and its
// key in ep.inflight. It must not be of size zero: Go may give every
// allocation of a zero-size type the same address, and the map would then
// hold one request however many are in flight.
type inflightReq struct {
	up     *Set
	ep     *endpoint
	cancel context.CancelFunc
}

// deadAfter is how many consecutive failed probes make an endpoint dead:
// its open streams are ended. One failure already moves new requests away.
const deadAfter = 2

// New builds the transport for cfg's Set, which verifies
// every endpoint as upstreamTLSConfig says. It fails on an unreadable or
// empty CA bundle.
func New(cfg Config) (*Set, error) {
	tlsConfig, err := upstreamTLSConfig(cfg)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control:   cfg.DialControl,
	}
	t := &http.Transport{
		// Never honour HTTP(S)_PROXY from the environment: endpoints are
		// dialled directly.
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsConfig,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		// Detect a dead or hung apiserver on a connection that went
		// silent: ping it after a health period without a frame and close
		// it when the ping is not answered within a probe's timeout. The
		// streams on it then fail, which marks the endpoint unhealthy
		// (observedBody), as fast as the /readyz probe every health
		// period used to; a ping is an HTTP/2 frame, not a request.
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: max(cfg.HealthPeriod, time.Second),
			PingTimeout:     ProbeTimeout(cfg.HealthPeriod),
			// What an answer its client does not read holds here.
			MaxReceiveBufferPerStream: cfg.MaxStreamBuffer,
		},
	}
	u := &Set{
		transport:        t,
		upgradeTransport: http1Only(t),
		period:           cfg.HealthPeriod,
		window:           successWindow,
		kick:             make(chan struct{}, 1),
	}
	u.bodies.max = int64(cfg.MaxBufferedBodyBytes)
	for _, ep := range cfg.Endpoints {
		u.endpoints = append(u.endpoints, newEndpoint(ep))
	}
	return u, nil
}

// upstreamTLSConfig returns the TLS client configuration for every
// upstream endpoint, from --upstream and from the EndpointSlices alike,
// and for their health checks: the certificate must chain to
// cfg.CAFile, carry cfg.ServerName (by default
// DefaultServerName, kubernetes.default.svc) whatever endpoint IP
// was dialled, and not be a node's (verifyNotNode). It fails, with one line
// naming --upstream-ca-file, on a bundle that cannot be read or holds no
// certificate.
//
// Why the Service's name, and not the endpoint IP or the Service VIP:
//   - The endpoint IP proves nothing. EndpointSlices are data anyone with
//     write access to them can point anywhere, and the cluster CA in the
//     pods' ca.crt often signs kubelet-serving certificates, which carry
//     their node's IPs: a slice pointing at a node would have received
//     every pod's bearer token, where the pods' own check on kube-proxy's
//     path (the VIP or the Service's names) would have failed.
//   - The agent stands in for the Service, so it checks what the pods
//     check. Of the Service's names and VIPs, kubernetes.default.svc is the
//     one every kube-apiserver serving certificate carries: kube-apiserver
//     adds it to the certificates it generates, and kubeadm, k3s and RKE2
//     issue it. The VIP is in the certificate only if it was the Service
//     CIDR's first IP when the certificate was made (not an IPv6 VIP of
//     most dual-stack clusters, nor after a Service CIDR migration), and
//     checking it would make every upstream depend on --service-vip.
//   - Neither the names nor the VIPs tell kube-apiserver from an agent:
//     every agent's certificate carries both, as pods must accept it. That
//     is what verifyNotNode is for. A certificate an operator gave the
//     agents (--tls-cert-file) without O=system:nodes still passes; a
//     dedicated apiserver CA (--upstream-ca-file) closes that gap too.
//
// Since ServerName is set, the handshake sends it as SNI, where the pods,
// dialling the VIP, send none: kube-apiserver then serves its
// --tls-sni-cert-key certificate for that name, if one was given, and its
// default certificate otherwise.
func upstreamTLSConfig(cfg Config) (*tls.Config, error) {
	pem, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading --upstream-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--upstream-ca-file %s holds no PEM certificate", cfg.CAFile)
	}
	return &tls.Config{
		RootCAs:          pool,
		ServerName:       cmp.Or(cfg.ServerName, DefaultServerName),
		MinVersion:       tls.VersionTLS12,
		VerifyConnection: verifyNotNode,
	}, nil
}

// errNodeCertificate is wrapped in the handshake error of an upstream whose
// certificate is a node's.
var errNodeCertificate = errors.New("upstream presented a node's certificate (kubelet serving or kube-apicache agent), not kube-apiserver's")

// verifyNotNode is a tls.Config VerifyConnection that refuses a leaf
// certificate with subject O=system:nodes or CN=system:node:<name>: what the
// kubernetes.io/kubelet-serving signer issues, to kubelets and to the
// agents themselves. Such a certificate may chain to the cluster CA and,
// for an agent, carry the kubernetes Service's names and VIPs, but no
// kube-apiserver serves one. It runs after the chain and name were
// verified, before any request is sent, so a refused endpoint never sees a
// client's credentials.
func verifyNotNode(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("upstream presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if slices.Contains(leaf.Subject.Organization, identity.NodesOrganization) ||
		strings.HasPrefix(leaf.Subject.CommonName, identity.NodeUserPrefix) {
		return fmt.Errorf("%w: subject %q", errNodeCertificate, leaf.Subject.String())
	}
	return nil
}

func newEndpoint(u *url.URL) *endpoint {
	return &endpoint{url: u, inflight: map[*inflightReq]context.CancelFunc{}}
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
// shared transport, to the endpoint named in req.URL. When that fails in a
// way that is safe to retry (see retryable), the endpoint is marked failed
// and the request is sent again to another healthy endpoint; any other
// failure after the request was sent has its endpoint probed soon.
func (u *Set) RoundTrip(req *http.Request) (*http.Response, error) {
	tried := map[string]bool{}
	var body *readTracker
	switch {
	case req.Body == nil || req.Body == http.NoBody || req.GetBody != nil:
	case req.ContentLength > 0 && req.ContentLength <= maxReplayableBody && !apihttp.IsLongRunning(req) && u.bodies.reserve(req.ContentLength):
		defer u.bodies.release(req.ContentLength)
		// A small body of known size (any ordinary write; never a
		// long-running request's, such as a proxied upload, which goes on
		// at the client's pace) is buffered within the budget, so
		// it can be sent again: by net/http when an HTTP/2 connection is
		// shut down (GOAWAY) before upstream processed the request, and
		// here after a failed dial. A body shorter than its length is
		// sent as it is, for the transport to refuse.
		b := make([]byte, req.ContentLength)
		n, err := io.ReadFull(req.Body, b)
		if err != nil && err != io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("reading request body: %w", err)
		}
		b = b[:n]
		// A shallow copy: only the body changes, and nothing here or
		// in the transport writes to the rest.
		req = req.WithContext(req.Context())
		req.Body = newReplayBody(b)
		req.GetBody = func() (io.ReadCloser, error) { return newReplayBody(b), nil }
	default:
		body = &readTracker{ReadCloser: req.Body}
		req = req.WithContext(req.Context())
		req.Body = body
	}
	for {
		tried[req.URL.Host] = true
		resp, err := u.roundTripOnce(req)
		if err == nil {
			return resp, nil
		}
		if IsPeerReset(err) {
			// The endpoint answered by resetting this one stream, as
			// kube-apiserver does when a handler aborts (a pod behind
			// pods/proxy that closes without answering): neither its
			// failure nor a reason to send the request again.
			return nil, err
		}
		if !retryable(req, err, body == nil || !body.read.Load()) {
			if req.Context().Err() == nil {
				u.troubled(req.URL.Host)
			}
			return resp, err
		}
		u.reportFailure(klog.FromContext(req.Context()), req.URL.Host, err)
		next := u.pickExcept(tried)
		if next == nil {
			return nil, err
		}
		klog.FromContext(req.Context()).V(2).Info("Retrying on another upstream", "method", req.Method,
			"path", req.URL.Path, "failed", req.URL.Host, "next", next.Host, "err", err)
		out := req.Clone(req.Context())
		out.URL.Scheme, out.URL.Host = next.Scheme, next.Host
		out.Host = ""
		if req.GetBody != nil {
			if out.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		req = out
	}
}

// roundTripOnce sends req to its endpoint, tracks it while in flight, and
// records what its answer says about the endpoint's health.
func (u *Set) roundTripOnce(req *http.Request) (*http.Response, error) {
	if apihttp.IsUpgrade(req) {
		// An upgraded connection's body must stay an io.ReadWriteCloser, so
		// it is not tracked; a dead endpoint ends it with the TCP
		// connection.
		resp, err := u.upgradeTransport.RoundTrip(req)
		if err == nil {
			u.mu.Lock()
			ep := u.find(req.URL.Host)
			u.mu.Unlock()
			if ep != nil {
				ep.observe(resp.StatusCode, u.clock())
			}
		}
		return resp, err
	}
	ctx, cancel := context.WithCancel(req.Context())
	f := u.track(req.URL.Host, cancel)
	resp, err := u.transport.RoundTrip(req.WithContext(ctx))
	if err != nil {
		f.end()
		cancel()
		return nil, err
	}
	if f == nil {
		resp.Body = &trackedBody{ReadCloser: resp.Body, done: cancel}
		return resp, nil
	}
	f.ep.observe(resp.StatusCode, u.clock())
	resp.Body = &observedBody{ReadCloser: resp.Body, up: u, ep: f.ep, ctx: ctx,
		good: resp.StatusCode < http.StatusInternalServerError, flight: f}
	return resp, nil
}

// track registers an in-flight request to host, which cancel ends, and
// returns it; nil if host is none of the endpoints.
func (u *Set) track(host string, cancel context.CancelFunc) *inflightReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	ep := u.find(host)
	if ep == nil {
		return nil
	}
	f := &inflightReq{up: u, ep: ep, cancel: cancel}
	ep.inflight[f] = cancel
	return f
}

// end deregisters the request and cancels it; on nil it does nothing.
func (f *inflightReq) end() {
	if f == nil {
		return
	}
	f.up.mu.Lock()
	delete(f.ep.inflight, f)
	f.up.mu.Unlock()
	f.cancel()
}

// troubled notes a failed request to host that is no proof the endpoint
// is down (it may have been the request's own); the endpoint is probed
// within a health period unless it answers meanwhile.
func (u *Set) troubled(host string) {
	u.mu.Lock()
	ep := u.find(host)
	u.mu.Unlock()
	if ep != nil {
		ep.lastTrouble.Store(u.clock().UnixNano())
	}
}

// trackedBody calls done once, when the body is closed.
type trackedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *trackedBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// replayBody is a buffered request body, read from the start again for
// each attempt.
type replayBody struct{ bytes.Reader }

func newReplayBody(b []byte) *replayBody {
	r := &replayBody{}
	r.Reset(b)
	return r
}

// Close does nothing: the bytes stay for the next attempt.
func (*replayBody) Close() error { return nil }

// maxReplayableBody is the largest request body buffered for a retry.
const maxReplayableBody = 1 << 20

// byteBudget is a bound on bytes held at once, taken without waiting.
type byteBudget struct {
	max  int64 // fixed; zero or less allows nothing
	used atomic.Int64
}

// reserve takes n bytes of the budget if they are free.
func (b *byteBudget) reserve(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *byteBudget) release(n int64) { b.used.Add(-n) }

// readTracker notes whether a request body was read from.
type readTracker struct {
	io.ReadCloser
	read atomic.Bool
}

func (r *readTracker) Read(p []byte) (int, error) {
	r.read.Store(true)
	return r.ReadCloser.Read(p)
}

// Close does nothing: the transport closes a request's body even when the
// dial failed, and the body must survive for a retry. The server closes a
// forwarded request's body when its handler returns.
func (r *readTracker) Close() error { return nil }

// retryable reports whether req may be sent again after err. A request that
// never reached the endpoint (the connection could not be made) and whose
// body was not read from is retried whatever its method: upstream never
// saw it. A read (GET, HEAD) without a body is retried whenever no answer
// came. Nothing is retried once the client has gone.
func retryable(req *http.Request, err error, bodyUnread bool) bool {
	if req.Context().Err() != nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return bodyUnread || req.GetBody != nil
	}
	if apihttp.IsUpgrade(req) {
		return false
	}
	noBody := req.Body == nil || req.Body == http.NoBody
	return (req.Method == http.MethodGet || req.Method == http.MethodHead) && noBody
}

// Pick returns the endpoint that requests go to now: the active one.
func (u *Set) Pick() *url.URL {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.endpoints[u.active].url
}

// find returns the endpoint for host, or nil. u.mu must be held.
func (u *Set) find(host string) *endpoint {
	for _, ep := range u.endpoints {
		if ep.url.Host == host {
			return ep
		}
	}
	return nil
}

// pickExcept returns a healthy endpoint not in tried, else one not yet
// checked, else nil; it becomes the active endpoint.
func (u *Set) pickExcept(tried map[string]bool) *url.URL {
	u.mu.Lock()
	defer u.mu.Unlock()
	best := -1
	for i, ep := range u.endpoints {
		if tried[ep.url.Host] {
			continue
		}
		if ep.healthy {
			best = i
			break
		}
		if best < 0 && !ep.checked {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	u.active = best
	return u.endpoints[best].url
}

// Healthy returns nil while some endpoint is healthy, else why none is.
func (u *Set) Healthy() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	var errs []error
	for _, ep := range u.endpoints {
		if ep.healthy {
			return nil
		}
		if ep.lastErr != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep.url.Host, ep.lastErr))
		}
	}
	if len(errs) == 0 {
		return errors.New("no upstream endpoint checked yet")
	}
	return fmt.Errorf("no healthy upstream endpoint: %w", errors.Join(errs...))
}

// EndpointStatus is one endpoint's state, for metrics and logs.
type EndpointStatus struct {
	Host    string
	Healthy bool
	Active  bool
}

// Status returns a copy of every endpoint's state.
func (u *Set) Status() []EndpointStatus {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]EndpointStatus, len(u.endpoints))
	for i, ep := range u.endpoints {
		out[i] = EndpointStatus{Host: ep.url.Host, Healthy: ep.healthy, Active: i == u.active}
	}
	return out
}

// SetEndpoints replaces the endpoint list, keeping the health of endpoints
// that stay. An empty list is ignored: the agent never forgets every
// apiserver (a slice can be empty for a moment while apiservers restart).
// Requests in flight to a removed endpoint are left to end on their own:
// a restarting apiserver can drop a live one from the slice for a moment
// (its lease not yet renewed), and ending that one's streams would make
// every informer behind them list again; a removed apiserver that is
// gone breaks its streams, which its connection's pings find.
func (u *Set) SetEndpoints(urls []*url.URL) {
	if len(urls) == 0 {
		return
	}
	u.mu.Lock()
	activeHost := u.endpoints[u.active].url.Host
	var next []*endpoint
	added := false
	for _, nu := range urls {
		ep := u.find(nu.Host)
		if ep == nil {
			ep, added = newEndpoint(nu), true
		}
		next = append(next, ep)
	}
	u.endpoints = next
	u.active = 0
	for i, ep := range next {
		if ep.url.Host == activeHost {
			u.active = i
		}
	}
	if !next[u.active].healthy {
		for i, ep := range next {
			if ep.healthy {
				u.active = i
				break
			}
		}
	}
	u.mu.Unlock()
	if added {
		// A new endpoint is probed at once, so that it can take over
		// from the active one as soon as that fails.
		u.wake()
	}
	if u.OnChange != nil {
		u.OnChange()
	}
}

// LastAnswer is when any endpoint last answered (zero: none ever did).
func (u *Set) LastAnswer() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	var last int64
	for _, ep := range u.endpoints {
		last = max(last, ep.lastSuccess.Load())
	}
	return unixTime(last)
}

// ClientTransport sends each request of the agent's own client to the
// endpoint that is active when it is sent, through the set (so its
// answers count toward the endpoints' health, and it follows failover).
func (u *Set) ClientTransport() http.RoundTripper { return &activeEndpoint{up: u} }

// activeEndpoint is ClientTransport.
type activeEndpoint struct {
	up *Set
}

func (t *activeEndpoint) RoundTrip(req *http.Request) (*http.Response, error) {
	ep := t.up.Pick()
	// A RoundTripper must not modify the caller's request.
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host = ep.Scheme, ep.Host
	out.Host = ""
	return t.up.RoundTrip(out)
}

// NewWithTransport returns a set over t, which must trust cfg's endpoints
// (tests: an httptest server's client transport); the CA file, server
// name, socket mark and stream buffer of cfg are not used.
func NewWithTransport(t *http.Transport, cfg Config) *Set {
	u := &Set{transport: t, upgradeTransport: http1Only(t), period: cfg.HealthPeriod, window: successWindow, kick: make(chan struct{}, 1)}
	u.bodies.max = int64(cfg.MaxBufferedBodyBytes)
	for _, ep := range cfg.Endpoints {
		u.endpoints = append(u.endpoints, newEndpoint(ep))
	}
	return u
}

// Transport is the transport of ordinary requests, for tests that tune it
// before its first use.
func (u *Set) Transport() *http.Transport { return u.transport }
