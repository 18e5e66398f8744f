package interception

import (
	"net/netip"
	"time"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// Config is what the interception needs to know: the node, its listen
// addresses, the Service VIPs and the names and timings of the redirect.
// The agent's configuration embeds it; Validate there checks it.
type Config struct {
	// NodeName is the name of the node the agent runs on.
	NodeName string

	// ListenAddress is the local address the agent serves TLS on and that
	// the IPv4 Service VIP is redirected to. It is added to the node by the
	// agent; a link-local address keeps it off every network.
	ListenAddress netip.AddrPort
	// ListenAddressIPv6 is the same for the IPv6 Service VIP of a
	// dual-stack (or IPv6) cluster; it is used only when a Service VIP is
	// IPv6. It must be an address the kernel delivers locally from any
	// interface: IPv6 link-local (fe80::/10) is bound to one link and
	// loopback (::1) is never accepted from outside it, so a unique local
	// address (fc00::/7) no network of the cluster uses is the choice.
	ListenAddressIPv6 netip.AddrPort
	// ListenLink is the dummy link that holds ListenAddress, where the
	// kernel supports dummy links; otherwise it goes on loopback.
	ListenLink string

	// ServiceVIPs are the cluster IPs of the default/kubernetes Service and
	// ServicePort its port: the destinations that get redirected.
	ServiceVIPs []netip.Addr
	ServicePort uint16
	// InterceptionDisabled starts the agent with its kill switch on: it
	// runs (cache, metrics, certificate) but leaves the Service to
	// kube-proxy until SetInterception turns interception on.
	InterceptionDisabled bool
	// InterceptionConfigMap, NAMESPACE/NAME, is a ConfigMap holding an
	// AgentConfiguration (key InterceptionConfigMapKey) whose
	// interception.enabled the agent follows through a watch: the kill
	// switch in about a second, rather than at the kubelet's next sync of
	// a mounted ConfigMap. Empty: none.
	InterceptionConfigMap string

	// SocketMark is set (SO_MARK) on every upstream socket, and packets
	// carrying it skip the redirect. 0 disables marking.
	SocketMark uint32

	// Chain is the nat chain the agent owns.
	Chain string
	// Dataplane is "auto", "iptables" or "nftables": which backend holds
	// the redirect (resolveDataplane); or "external": another component
	// redirects the VIP to the agent, which programs nothing (external.go). NFTablesTable and NFTablesPriority
	// name the nftables dataplane's table and its base chains' priority
	// (zero values: the defaults).
	Dataplane        string
	NFTablesTable    string
	NFTablesPriority int32

	// LivenessSet names the ipset (one per IP family; the IPv6 one gets a
	// "6" suffix) whose entry for a VIP must be alive for the redirect of
	// that VIP to apply: the kernel-enforced dead-man switch.
	LivenessSet string
	// LivenessTimeout is how long an entry lives after its last refresh;
	// the agent refreshes it several times per timeout while healthy.
	LivenessTimeout time.Duration

	// SyncPeriod is how often the rules and address are reconciled.
	SyncPeriod time.Duration
	// DetectLocalMode says how pod traffic of this node is told from VIP
	// traffic routed in from elsewhere (detectlocal.go); ClusterCIDRs,
	// PodBridgeInterface and PodInterfaceNamePrefix serve the modes of
	// those names.
	DetectLocalMode        string
	ClusterCIDRs           []netip.Prefix
	PodBridgeInterface     string
	PodInterfaceNamePrefix string
	// PodPathCheckInterval is how often the pod-path check (podpath.go)
	// scans conntrack; zero turns it off. BypassDuration is how long a
	// source whose traffic to the agent was dropped goes to kube-proxy's
	// path.
	PodPathCheckInterval time.Duration
	BypassDuration       time.Duration
}

// Defaults of the names the redirect uses on the node.
const (
	DefaultListenAddress     = "169.254.25.10:10443"
	DefaultListenAddressIPv6 = "[fd00:169:254:25::10]:10443"
	DefaultListenLink        = "kube-apicache0"
	DefaultChain             = "KUBE-APICACHE"
	DefaultLivenessSet       = "KUBE-APICACHE-LIVE"
	// DefaultLivenessTimeout bounds how long pods' new connections fail
	// after the agent dies: about this long after its last refresh (every
	// quarter of it), the kernel expires the entry. A refresh that comes
	// late costs only that much: new connections take kube-proxy's path
	// until the next refresh puts the entry back. The agent has no CPU
	// limit in the shipped DaemonSet (so no CFS throttling); a refresh
	// goroutine starved for 750ms on a saturated node is such a late
	// refresh, not an outage.
	DefaultLivenessTimeout = time.Second
)

// The kubernetes Service, whose cluster IPs the configured VIPs must be.
const (
	kubernetesNamespace = "default"
	kubernetesService   = "kubernetes"
)

// HasFamily reports whether a Service VIP is of family f.
func (c *Config) HasFamily(f netrules.Family) bool {
	for _, vip := range c.ServiceVIPs {
		if netrules.FamilyOf(vip) == f {
			return true
		}
	}
	return false
}

// listenAddress returns the listen address of family f.
func (c *Config) listenAddress(f netrules.Family) netip.AddrPort {
	if f == netrules.IPv6 {
		return c.ListenAddressIPv6
	}
	return c.ListenAddress
}

// ListenAddresses returns the listen address of each IP family among the
// Service VIPs, IPv4 first: the addresses the agent serves on, adds to the
// node and names in its serving certificate. A family without a VIP has no
// listener.
func (c *Config) ListenAddresses() []netip.AddrPort {
	var out []netip.AddrPort
	for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
		if c.HasFamily(f) {
			out = append(out, c.listenAddress(f))
		}
	}
	return out
}

// ListenIPs returns the IPs of ListenAddresses: those the serving
// certificate names besides the Service's.
func (c *Config) ListenIPs() []netip.Addr {
	var out []netip.Addr
	for _, ap := range c.ListenAddresses() {
		out = append(out, ap.Addr())
	}
	return out
}

// nftTable is the nftables dataplane's table name.
func (c *Config) nftTable() string {
	if c.NFTablesTable == "" {
		return DefaultNFTablesTable
	}
	return c.NFTablesTable
}

// nftPriority is the priority of the nftables dataplane's base chains.
func (c *Config) nftPriority() int32 {
	if c.NFTablesPriority == 0 {
		return DefaultNFTablesPriority
	}
	return c.NFTablesPriority
}
