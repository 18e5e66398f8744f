package interception

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// probeSuffix ends the server name of self-check handshakes. .invalid is
// reserved (RFC 2606): no real client sends it.
const probeSuffix = ".selfcheck.kube-apicache.invalid"

// Probes records the server names of self-check handshakes that reached the
// agent's own listener, so a probe can tell whether its connection landed
// here or somewhere else (kube-apiserver, through a load balancer the
// redirect cannot precede).
type Probes struct {
	mu   sync.Mutex // protects the field below
	seen map[string]chan struct{}
}

// NewProbes returns an empty registry.
func NewProbes() *Probes { return &Probes{seen: map[string]chan struct{}{}} }

// expect registers a fresh nonce and returns the server name to send and a
// channel closed when a handshake with that name arrives.
func (p *Probes) expect() (string, <-chan struct{}, func()) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	name := hex.EncodeToString(b) + probeSuffix
	ch := make(chan struct{})
	p.mu.Lock()
	p.seen[name] = ch
	p.mu.Unlock()
	return name, ch, func() {
		p.mu.Lock()
		delete(p.seen, name)
		p.mu.Unlock()
	}
}

// Observe notes a ClientHello's server name.
func (p *Probes) Observe(name string) {
	if !strings.HasSuffix(name, probeSuffix) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ch, ok := p.seen[name]; ok {
		close(ch)
		delete(p.seen, name)
	}
}

// selfCheck opens an unmarked connection to vip:port, as a pod would, and
// checks that its TLS handshake reached this agent: the redirect really
// takes effect for this node's traffic. It fails where something rewrites
// the destination before netfilter sees it (a socket-level load balancer
// such as Cilium's), or where another rule wins over ours.
func (ic *Interceptor) selfCheck(ctx context.Context, vip netip.Addr, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name, landed, forget := ic.probes.expect()
	defer forget()
	addr := netip.AddrPortFrom(vip, ic.cfg.ServicePort).String()
	// A plain dialer: no SO_MARK, so the packet meets the redirect as pod
	// and host-network traffic does.
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer raw.Close()
	conn := tls.Client(raw, &tls.Config{
		ServerName: name,
		// Only where the handshake lands matters, not who it is with;
		// nothing is sent over this connection.
		InsecureSkipVerify: true, //nolint:gosec // see above
		MinVersion:         tls.VersionTLS12,
	})
	hsErr := conn.HandshakeContext(ctx)
	select {
	case <-landed:
		return nil
	default:
	}
	if hsErr != nil {
		return fmt.Errorf("a connection to %s did not reach the agent (TLS handshake: %v)", addr, hsErr)
	}
	var peer string
	if certs := conn.ConnectionState().PeerCertificates; len(certs) > 0 {
		peer = certs[0].Subject.String()
	}
	return fmt.Errorf("a connection to %s was answered by something else (certificate %q): the redirect does not take effect: "+
		"a socket-level load balancer rewrites the Service VIP before netfilter, or, with the iptables dataplane, another nat chain "+
		"at the same priority (kube-proxy's nftables mode) maps it first (--dataplane=nftables runs ahead of it)", addr, peer)
}

// checkListener completes a TLS handshake with the agent's listener on
// addr: proof that it accepts and serves connections there (a hung process
// does not, nor does a listener whose address was taken off the node).
func checkListener(ctx context.Context, addr netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := &tls.Dialer{Config: &tls.Config{
		ServerName:         "healthz.kube-apicache.invalid",
		InsecureSkipVerify: true, //nolint:gosec // only liveness is checked
		MinVersion:         tls.VersionTLS12,
	}}
	conn, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return fmt.Errorf("listener %s: %w", addr, err)
	}
	return conn.Close()
}
