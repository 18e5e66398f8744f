package agent

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-apicache/kube-apicache/agent/interception"
)

func validConfig() *Config {
	u, _ := url.Parse("https://10.0.0.2:6443")
	return &Config{
		Config: interception.Config{
			NodeName:          "node-a",
			ListenAddress:     netip.MustParseAddrPort(DefaultListenAddress),
			ListenAddressIPv6: netip.MustParseAddrPort(DefaultListenAddressIPv6),
			ListenLink:        DefaultListenLink,
			ServiceVIPs:       []netip.Addr{netip.MustParseAddr(DefaultServiceVIP)},
			ServicePort:       DefaultServicePort,
			Chain:             DefaultChain,
			SyncPeriod:        time.Second,
			LivenessSet:       DefaultLivenessSet,
			LivenessTimeout:   DefaultLivenessTimeout,
			DetectLocalMode:   interception.DetectLocalNone,
		},
		Upstreams:            []*url.URL{u},
		UpstreamCheckTimeout: time.Second,
		TLSCertFile:          "c",
		TLSKeyFile:           "k",
		IPTablesBackend:      DefaultIPTablesBackend,
		UpstreamHealthPeriod: DefaultUpstreamHealthPeriod,
	}
}

// dualStack gives c the IPv4 and the IPv6 cluster IP of a dual-stack
// kubernetes Service.
func dualStack(c *Config) {
	c.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string // substring of the error; "" means valid
	}{
		{"defaults are valid", func(*Config) {}, ""},
		{"no node name", func(c *Config) { c.NodeName = "" }, "--node-name"},
		{"liveness timeout below the kernel's resolution", func(c *Config) { c.LivenessTimeout = 900 * time.Millisecond }, "--fail-open-timeout"},
		{"liveness set name too long", func(c *Config) { c.LivenessSet = strings.Repeat("X", 31) }, "--fail-open-set"},
		{"unknown iptables backend", func(c *Config) { c.IPTablesBackend = "ebpf" }, "--iptables-backend"},
		{"nftables priority tied with dstnat", func(c *Config) { c.NFTablesPriority = -100 }, "strictly before dstnat"},
		{"no upstream health period", func(c *Config) { c.UpstreamHealthPeriod = 0 }, "--upstream-health-period"},
		{"profiling without a metrics listener", func(c *Config) { c.Profiling = true }, "--profiling needs --metrics-bind-address"},
		{"profiling on the metrics listener", func(c *Config) { c.Profiling, c.MetricsBindAddress = true, DefaultMetricsBindAddress }, ""},
		{"profiling on an IPv6 loopback metrics listener", func(c *Config) { c.Profiling, c.MetricsBindAddress = true, "[::1]:10445" }, ""},
		{"profiling on a node IP", func(c *Config) { c.Profiling, c.MetricsBindAddress = true, "10.0.0.7:10445" }, "--profiling needs a loopback --metrics-bind-address"},
		{"profiling on every address", func(c *Config) { c.Profiling, c.MetricsBindAddress = true, ":10445" }, "--profiling needs a loopback --metrics-bind-address"},
		{"metrics bind address without a port", func(c *Config) { c.MetricsBindAddress = "10.0.0.7" }, "--metrics-bind-address"},
		{"metrics bind address with port 0", func(c *Config) { c.MetricsBindAddress = "10.0.0.7:0" }, "port in 1-65535"},
		{"bracketed IPv4 metrics bind address", func(c *Config) { c.MetricsBindAddress = "[10.0.0.7]:10445" }, ""},
		{"metrics certificate without its key", func(c *Config) { c.MetricsBindAddress, c.MetricsTLSCertFile = DefaultMetricsBindAddress, "c" }, "go together"},
		{"metrics certificate without a metrics listener", func(c *Config) { c.MetricsTLSCertFile, c.MetricsTLSKeyFile = "c", "k" }, "needs --metrics-bind-address"},
		{"built-in chain", func(c *Config) { c.Chain = "PREROUTING" }, "belongs to the kernel or kube-proxy"},
		{"kube-proxy chain", func(c *Config) { c.Chain = "KUBE-SERVICES" }, "belongs to the kernel or kube-proxy"},
		{"loopback listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("127.0.0.5:10443") }, "loopback"},
		{"wildcard listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("0.0.0.0:10443") }, "wildcard"},
		{"IPv6 listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("[fd00::10]:10443") }, "IPv4"},
		{"IPv4-mapped listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("[::ffff:169.254.25.10]:10443") }, "IPv4"},
		// Dual-stack: an IPv6 VIP is redirected to the IPv6 listen address.
		{"dual-stack VIPs", dualStack, ""},
		{"IPv6-only VIP", func(c *Config) { c.ServiceVIPs = []netip.Addr{netip.MustParseAddr("fd00:10:96::1")} }, ""},
		{"IPv6 VIP without an IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.AddrPort{} }, "--listen-address-ipv6 is required"},
		{"no IPv6 listen address, no IPv6 VIP", func(c *Config) { c.ListenAddressIPv6 = netip.AddrPort{} }, ""},
		{"IPv4 as IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("169.254.25.11:10443") }, "must be IPv6"},
		{"IPv4-mapped IPv6 listen address", func(c *Config) {
			dualStack(c)
			c.ListenAddressIPv6 = netip.MustParseAddrPort("[::ffff:169.254.25.11]:10443")
		}, "must be IPv6"},
		{"IPv6 listen address without port", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[fd00::10]:0") }, "[IP]:port"},
		{"link-local IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[fe80::10]:10443") }, "link-local"},
		{"IPv6 listen address with a zone", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[fe80::10%eth0]:10443") }, "zone"},
		{"loopback IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[::1]:10443") }, "loopback"},
		{"wildcard IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[::]:10443") }, "wildcard"},
		{"multicast IPv6 listen address", func(c *Config) { dualStack(c); c.ListenAddressIPv6 = netip.MustParseAddrPort("[ff02::1]:10443") }, "unicast"},
		{"VIP given twice", func(c *Config) {
			c.ServiceVIPs = append(c.ServiceVIPs, netip.MustParseAddr("::ffff:10.96.0.1"))
		}, "given twice"},
		{"IPv6 VIP is the IPv6 listen address", func(c *Config) {
			dualStack(c)
			c.ServiceVIPs[1] = c.ListenAddressIPv6.Addr()
		}, "listen address of the agent"},
		{"upstream is the IPv6 listener", func(c *Config) {
			dualStack(c)
			c.Upstreams[0], _ = url.Parse("https://[fd00:169:254:25::10]:10443")
		}, "own listen address"},
		{"long link name", func(c *Config) { c.ListenLink = "a-very-long-link-name" }, "--listen-link"},
		{"upstream is the VIP without a socket mark", func(c *Config) {
			c.Upstreams[0], _ = url.Parse("https://10.96.0.1:443")
			c.SocketMark = 0
		}, "Service VIP"},
		{"upstream is the listener", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://169.254.25.10:10443") }, "own listen address"},
		{"plain http upstream", func(c *Config) { c.Upstreams[0], _ = url.Parse("http://10.0.0.2:6443") }, "https://host:port"},
		{"upstream with query", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://10.0.0.2:6443?x=1") }, "https://host:port"},
		{"upstream with credentials", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://u:secret@10.0.0.2:6443") }, "https://host:port"},
		// The signer: the default, a custom signer, a malformed name and a
		// kubernetes.io signer that issues no serving certificates.
		{"default signer", func(c *Config) { c.SignerName = "kubernetes.io/kubelet-serving" }, ""},
		{"custom signer", func(c *Config) { c.SignerName = "clusterissuers.cert-manager.io/node-serving" }, ""},
		{"signer without a path", func(c *Config) { c.SignerName = "example.com" }, "--signer-name"},
		{"client signer", func(c *Config) { c.SignerName = "kubernetes.io/kube-apiserver-client" }, "--signer-name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mutate(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), "secret"):
				t.Errorf("error leaks credentials: %v", err)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

// TestListenAddresses: the agent listens, and its certificate names, one
// address per IP family among the VIPs, IPv4 first.
func TestListenAddresses(t *testing.T) {
	v4, v6 := netip.MustParseAddrPort(DefaultListenAddress), netip.MustParseAddrPort(DefaultListenAddressIPv6)
	for _, tc := range []struct {
		name string
		vips []string
		want []netip.AddrPort
	}{
		{"IPv4", []string{"10.96.0.1"}, []netip.AddrPort{v4}},
		{"IPv6", []string{"fd00:10:96::1"}, []netip.AddrPort{v6}},
		{"dual-stack, IPv6 primary", []string{"fd00:10:96::1", "10.96.0.1"}, []netip.AddrPort{v4, v6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			c.ServiceVIPs = nil
			for _, s := range tc.vips {
				c.ServiceVIPs = append(c.ServiceVIPs, netip.MustParseAddr(s))
			}
			if diff := cmp.Diff(tc.want, c.ListenAddresses(), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("ListenAddresses (-want +got):\n%s", diff)
			}
		})
	}
}
