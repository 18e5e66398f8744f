package agent

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

func validConfig() *Config {
	u, _ := url.Parse("https://10.0.0.2:6443")
	return &Config{
		NodeName:             "node-a",
		ListenAddress:        netip.MustParseAddrPort(DefaultListenAddress),
		ListenLink:           DefaultListenLink,
		ServiceVIPs:          []netip.Addr{netip.MustParseAddr(DefaultServiceVIP)},
		ServicePort:          DefaultServicePort,
		Upstreams:            []*url.URL{u},
		UpstreamCheckTimeout: time.Second,
		TLSCertFile:          "c",
		TLSKeyFile:           "k",
		Chain:                DefaultChain,
		SyncPeriod:           time.Second,
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string // substring of the error; "" means valid
	}{
		{"defaults are valid", func(*Config) {}, ""},
		{"no node name", func(c *Config) { c.NodeName = "" }, "--node-name"},
		{"built-in chain", func(c *Config) { c.Chain = "PREROUTING" }, "belongs to the kernel or kube-proxy"},
		{"kube-proxy chain", func(c *Config) { c.Chain = "KUBE-SERVICES" }, "belongs to the kernel or kube-proxy"},
		{"loopback listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("127.0.0.5:10443") }, "loopback"},
		{"wildcard listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("0.0.0.0:10443") }, "wildcard"},
		{"IPv6 listen address", func(c *Config) { c.ListenAddress = netip.MustParseAddrPort("[fd00::10]:10443") }, "IPv4"},
		{"long link name", func(c *Config) { c.ListenLink = "a-very-long-link-name" }, "--listen-link"},
		{"upstream is the VIP", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://10.96.0.1:443") }, "Service VIP"},
		{"upstream is the listener", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://169.254.25.10:10443") }, "own listen address"},
		{"plain http upstream", func(c *Config) { c.Upstreams[0], _ = url.Parse("http://10.0.0.2:6443") }, "https://host:port"},
		{"upstream with query", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://10.0.0.2:6443?x=1") }, "https://host:port"},
		{"upstream with credentials", func(c *Config) { c.Upstreams[0], _ = url.Parse("https://u:secret@10.0.0.2:6443") }, "https://host:port"},
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
			}
		})
	}
}
