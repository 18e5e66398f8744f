package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// Config holds everything the agent needs to run. The command line fills it
// in; Validate checks it before anything touches the node.
type Config struct {
	// NodeName is the name of the node the agent runs on.
	NodeName string

	// ListenAddress is the local address the agent serves TLS on and that
	// the Service VIP is redirected to. It is added to the node by the
	// agent; a link-local address keeps it off every network.
	ListenAddress netip.AddrPort
	// ListenLink is the dummy link that holds ListenAddress, where the
	// kernel supports dummy links; otherwise it goes on loopback.
	ListenLink string

	// ServiceVIPs are the cluster IPs of the default/kubernetes Service and
	// ServicePort its port: the destinations that get redirected.
	ServiceVIPs []netip.Addr
	ServicePort uint16

	// Upstreams are kube-apiserver endpoints, dialled directly and never
	// through the Service VIP.
	Upstreams []*url.URL
	// UpstreamCAFile is the CA bundle that verifies the upstream serving
	// certificates (in a pod: the ServiceAccount ca.crt).
	UpstreamCAFile string
	// UpstreamServerName overrides the name checked in the upstream
	// certificates; by default the host of each upstream URL.
	UpstreamServerName string
	// UpstreamCheckTimeout bounds the start-up health check of the upstream.
	UpstreamCheckTimeout time.Duration
	// SocketMark is set (SO_MARK) on every upstream socket, and packets
	// carrying it skip the redirect. 0 disables marking.
	SocketMark uint32

	// TLSCertFile and TLSKeyFile hold the serving certificate chain and key.
	TLSCertFile string
	TLSKeyFile  string

	// Chain is the nat chain the agent owns.
	Chain string
	// SyncPeriod is how often the rules and address are reconciled.
	SyncPeriod time.Duration

	// MetricsBindAddress serves /metrics, /healthz and /readyz; empty
	// disables it.
	MetricsBindAddress string

	// ShutdownGracePeriod bounds how long in-flight requests and watches
	// may run after the redirect is removed on shutdown.
	ShutdownGracePeriod time.Duration
}

// Default values for Config fields.
const (
	DefaultListenAddress        = "169.254.25.10:10443"
	DefaultListenLink           = "kube-apicache0"
	DefaultServiceVIP           = "10.96.0.1"
	DefaultServicePort          = 443
	DefaultUpstreamCAFile       = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	DefaultUpstreamCheckTimeout = 10 * time.Second
	DefaultSocketMark           = 0x1000
	DefaultChain                = "KUBE-APICACHE"
	DefaultSyncPeriod           = 10 * time.Second
	DefaultMetricsBindAddress   = "127.0.0.1:10445"
	DefaultShutdownGracePeriod  = 30 * time.Second
)

// builtinChains are the nat table's own chains.
var builtinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "OUTPUT": true, "POSTROUTING": true, "FORWARD": true}

// Validate reports the first problem with c, as a one-line error.
func (c *Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("--node-name is required")
	case !c.ListenAddress.IsValid() || c.ListenAddress.Port() == 0:
		return errors.New("--listen-address must be an IP:port")
	case c.ListenAddress.Addr().IsUnspecified():
		return errors.New("--listen-address must be a specific IP, not a wildcard")
	case len(c.ServiceVIPs) == 0:
		return errors.New("--service-vip is required")
	case c.ServicePort == 0:
		return errors.New("--service-port must be 1-65535")
	case len(c.Upstreams) == 0:
		return errors.New("--upstream is required")
	case c.TLSCertFile == "" || c.TLSKeyFile == "":
		return errors.New("--tls-cert-file and --tls-private-key-file are required")
	case c.Chain == "" || len(c.Chain) > 28:
		return errors.New("--iptables-chain must be 1-28 characters")
	case builtinChains[c.Chain] || (strings.HasPrefix(c.Chain, "KUBE-") && !strings.HasPrefix(c.Chain, "KUBE-APICACHE")):
		return fmt.Errorf("--iptables-chain %s belongs to the kernel or kube-proxy; the agent flushes its own chain", c.Chain)
	case c.ListenLink == "" || len(c.ListenLink) > 15 || strings.ContainsAny(c.ListenLink, "/ "):
		return errors.New("--listen-link must be a valid link name of 1-15 characters")
	case !c.ListenAddress.Addr().Is4():
		return errors.New("--listen-address must be IPv4; IPv6 is not supported yet")
	case c.ListenAddress.Addr().IsLoopback():
		return errors.New("--listen-address must not be a loopback address: the kernel drops pod traffic DNATed to loopback")
	case c.SyncPeriod <= 0:
		return errors.New("--sync-period must be positive")
	case c.UpstreamCheckTimeout <= 0:
		return errors.New("--upstream-check-timeout must be positive")
	case c.ShutdownGracePeriod < 0:
		return errors.New("--shutdown-grace-period must not be negative")
	}
	for _, vip := range c.ServiceVIPs {
		if vip.Is4() != c.ListenAddress.Addr().Is4() {
			return fmt.Errorf("--service-vip %s and --listen-address %s must be of the same IP family", vip, c.ListenAddress.Addr())
		}
	}
	for _, u := range c.Upstreams {
		if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
			return fmt.Errorf("--upstream %q must be an https://host:port URL", u.Redacted())
		}
		if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
			ip = ip.Unmap()
			for _, vip := range c.ServiceVIPs {
				if ip == vip {
					return fmt.Errorf("--upstream %s is the Service VIP: the agent must dial apiserver endpoints directly", u.Host)
				}
			}
			if ip == c.ListenAddress.Addr() {
				return fmt.Errorf("--upstream %s is the agent's own listen address", u.Host)
			}
		}
	}
	return nil
}
