package serving

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/fairshare"
)

// connLimiter bounds the client connections the agent holds. Each costs
// memory and goroutines from its accept on, whatever it sends, so the
// bounds are applied where connections are accepted, before the TLS
// handshake:
//
//   - Connections are shared among sources (client IPs) as package
//     fairshare says: a connection past its source's bound, or past the
//     source's guaranteed share with the shared pool used up, is closed at
//     once. One source, or a few, cannot keep another pod from connecting.
//   - A connection that has not sent the headers of a first request within
//     the first-request timeout of its accept is closed: a client connects
//     when it has a request to send. (Later, the server's idle timeout
//     closes connections without requests.) HTTP/2 multiplexes streams on
//     a connection, so "a request" is a first stream's headers.
//
// One connLimiter serves every listener of the agent.
type connLimiter struct {
	pool         *fairshare.Pool
	firstRequest time.Duration
	metrics      *metrics
	logger       klog.Logger
	// refusals and timeouts log the connections closed, throttled.
	refusals, timeouts *throttledLog

	mu sync.Mutex // protects open
	// open counts the connections held by their client's address and
	// port, for Holds.
	open map[netip.AddrPort]int
}

// hold records an admitted connection from remote; release forgets it.
func (c *connLimiter) hold(remote netip.AddrPort) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open[remote]++
}

func (c *connLimiter) release(remote netip.AddrPort) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[remote]--; c.open[remote] <= 0 {
		delete(c.open, remote)
	}
}

// holds reports whether a connection from remote is open: admitted and
// not closed yet, hijacked connections (upgraded streams) included.
func (c *connLimiter) holds(remote netip.AddrPort) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open[remote] > 0
}

// newConnLimiter returns the connection bounds of l, counted in m.
func newConnLimiter(l Limits, m *metrics, logger klog.Logger) *connLimiter {
	l = l.WithDefaults()
	return &connLimiter{
		pool: fairshare.New(fairshare.Limits{
			Guaranteed: l.GuaranteedConnectionsPerSource,
			PerSource:  l.MaxConnectionsPerSource,
			Shared:     l.MaxConnections,
		}),
		firstRequest: l.FirstRequestTimeout,
		metrics:      m,
		logger:       logger,
		refusals:     newThrottledLog("Connections refused: too many open", ""),
		timeouts:     newThrottledLog("Connections closed: no request within the first-request timeout", ""),
		open:         map[netip.AddrPort]int{},
	}
}

// listener returns l with the bounds applied to the connections it
// accepts. Wrap it in the TLS listener, not the other way round, so that a
// connection is bounded before its handshake.
func (c *connLimiter) listener(l net.Listener) net.Listener {
	return &limitedListener{Listener: l, limiter: c}
}

// limitedListener accepts the connections its limiter admits and closes the
// others.
type limitedListener struct {
	net.Listener
	limiter *connLimiter
}

func (l *limitedListener) Accept() (net.Conn, error) {
	c := l.limiter
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(conn.RemoteAddr().String())
		slot, refused := c.pool.Acquire(src)
		if refused != "" {
			_ = conn.Close()
			c.metrics.closedConns.WithLabelValues(string(refused)).Inc()
			c.refusals.log(c.logger, "source", src, "reason", refused, "held", c.pool.Held(src))
			continue
		}
		lc := &limitedConn{Conn: conn, src: src, slot: slot, limiter: c}
		if ap, err := netip.ParseAddrPort(conn.RemoteAddr().String()); err == nil {
			lc.remote = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			c.hold(lc.remote)
		}
		lc.mu.Lock()
		lc.timer = time.AfterFunc(c.firstRequest, func() {
			if lc.expire() {
				c.metrics.closedConns.WithLabelValues("first-request-timeout").Inc()
				c.timeouts.log(c.logger, "source", src, "timeout", c.firstRequest)
			}
		})
		lc.mu.Unlock()
		return lc, nil
	}
}

// limitedConn holds its source's slot until it is closed, and is closed
// if no request arrives on it in time.
type limitedConn struct {
	net.Conn
	// src is the connection's source (sourceOf), and slot what it holds
	// of its source's share.
	src  string
	slot *fairshare.Slot
	// remote is the client's address and port, held in limiter's open
	// connections until the connection is closed (zero if unparsable).
	remote  netip.AddrPort
	limiter *connLimiter
	// requested is set once a request arrived.
	requested atomic.Bool

	mu sync.Mutex // protects the fields below
	// timer closes the connection at the first-request timeout; closed is
	// set once it is closed.
	timer  *time.Timer
	closed bool
}

// Close closes the connection and gives back its slot.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.timer.Stop()
		c.slot.Release()
		if c.remote.IsValid() {
			c.limiter.release(c.remote)
		}
	}
	return err
}

// expire closes the connection unless a request arrived on it or it is
// closed already, and says whether it did.
func (c *limitedConn) expire() bool {
	c.mu.Lock()
	expired := !c.closed && !c.requested.Load()
	c.mu.Unlock()
	if expired {
		_ = c.Close()
	}
	return expired
}

// sawRequest records that a request arrived: the first-request timeout no
// longer applies.
func (c *limitedConn) sawRequest() {
	if c.requested.Swap(true) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer.Stop()
}

// connKey carries a request's *limitedConn in its context.
type connKey struct{}

// withConn is the server's ConnContext hook: it puts the *limitedConn under
// a TLS connection into the context of the connection's requests.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// requestSource returns the source of r (sourceOf its remote address):
// its connection's, found once when the connection was accepted, if the
// server's ConnContext is withConn.
func requestSource(r *http.Request) string {
	if lc, ok := r.Context().Value(connKey{}).(*limitedConn); ok {
		return lc.src
	}
	return sourceOf(r.RemoteAddr)
}

// withRequestSeen tells each request's connection that a request arrived
// (the server's ConnContext must be withConn).
func withRequestSeen(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lc, ok := r.Context().Value(connKey{}).(*limitedConn); ok {
			lc.sawRequest()
		}
		h.ServeHTTP(w, r)
	})
}
