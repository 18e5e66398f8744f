package interception

import (
	"context"
	"net/netip"
	"testing"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// addKubeProxyNFT gives the fake kernel kube-proxy's nftables mode: its
// table with nat prerouting and output at dstnat, sending the VIP to
// kube-apiserver.
func addKubeProxyNFT(t *testing.T, k *fakeKernel, vip netip.AddrPort) {
	t.Helper()
	tx := &netrules.NFTTransaction{Family: netrules.IPv4, Table: kubeProxyNFTTable, Ops: []netrules.NFTOp{{Kind: netrules.NFTAddTable}}}
	for _, hook := range []netrules.NFTHook{netrules.NFTHookPrerouting, netrules.NFTHookOutput} {
		name := "nat-" + string(hook)
		tx.Ops = append(tx.Ops,
			netrules.NFTOp{Kind: netrules.NFTAddChain, Chain: netrules.NFTChain{Name: name, Hook: hook, Priority: netrules.NFTPriorityDstNAT}},
			netrules.NFTOp{Kind: netrules.NFTAddRule, Chain: netrules.NFTChain{Name: name},
				Rule: netrules.NFTRule{DstAddr: vip.Addr(), TCPDstPort: vip.Port(), DNAT: netip.MustParseAddrPort("10.250.0.2:6443")}})
	}
	mustDo(t, k.nft.Apply(tx))
}

// TestResolveDataplane: auto picks nftables where kube-proxy's nftables
// table exists or iptables is the nf_tables backend, iptables on legacy
// nodes and where nftables is unavailable; an explicit choice is kept, and
// nftables without the kernel's support is an error.
func TestResolveDataplane(t *testing.T) {
	k := newFakeKernel(t)
	kern := k.kernel()
	for _, tc := range []struct {
		want, backend string
		nft           bool
		kubeProxy     bool
		got           string
		err           bool
	}{
		{want: "auto", backend: "legacy", nft: true, got: DataplaneIPTables},
		{want: "auto", backend: "nft", nft: true, got: DataplaneNFTables},
		{want: "", backend: "nft", nft: false, got: DataplaneIPTables},
		{want: "auto", backend: "legacy", nft: true, kubeProxy: true, got: DataplaneNFTables},
		{want: "iptables", backend: "nft", nft: true, kubeProxy: true, got: DataplaneIPTables},
		{want: "nftables", backend: "legacy", nft: true, got: DataplaneNFTables},
		{want: "nftables", backend: "legacy", nft: false, err: true},
		{want: "ebpf", backend: "legacy", nft: true, err: true},
	} {
		kk := kern
		kk.Backend = tc.backend
		nft := fake.NewNFTables(k.clock)
		if tc.kubeProxy {
			mustDo(t, nft.Apply(&netrules.NFTTransaction{Family: netrules.IPv6, Table: kubeProxyNFTTable, Ops: []netrules.NFTOp{{Kind: netrules.NFTAddTable}}}))
		}
		kk.NFTables = nft
		if !tc.nft {
			kk.NFTables = nil
		}
		got, why, err := resolveDataplane(tc.want, kk)
		if (err != nil) != tc.err || got != tc.got {
			t.Errorf("%+v: %q (%s), %v", tc, got, why, err)
		}
	}
}

// TestNFTablesDataplane drives the nftables dataplane over the fake
// kernel, next to kube-proxy's nftables table: this node's pods and the
// host go to the agent while the liveness element lives, in either
// registration order of the two tables; the agent's marked traffic and
// traffic from elsewhere go to kube-proxy; when the element expires
// everything does; a second sync changes nothing; removal leaves only
// kube-proxy's table.
func TestNFTablesDataplane(t *testing.T) {
	for _, kubeProxyLater := range []bool{false, true} {
		k := newFakeKernel(t)
		k.nft.TieLatestFirst = kubeProxyLater
		cfg := dataplaneConfig()
		cfg.ServiceVIPs = cfg.ServiceVIPs[:1]
		vip := netip.AddrPortFrom(cfg.ServiceVIPs[0], cfg.ServicePort)
		if !kubeProxyLater {
			addKubeProxyNFT(t, k, vip)
		}
		planes, err := newDataplanes(cfg, DataplaneNFTables, k.kernel())
		mustDo(t, err)
		d := planes[0]
		d.setLocal(localMatch{cidr: netip.MustParsePrefix("10.244.0.0/16")})
		setCreated, res, err := d.sync()
		if err != nil || !setCreated || !res.Changed() {
			t.Fatalf("first sync: %v %+v %v", setCreated, res, err)
		}
		if kubeProxyLater {
			addKubeProxyNFT(t, k, vip)
		}
		mustDo(t, d.refresh())
		listen := cfg.ListenAddress.String()
		route := func(what string, hook netrules.NFTHook, p fake.NFTPacket, want string) {
			t.Helper()
			_, to, err := k.nft.Traverse(netrules.IPv4, hook, p)
			if err != nil || to != want {
				t.Errorf("kube-proxy later %v: %s went to %q (%v), want %s", kubeProxyLater, what, to, err, want)
			}
		}
		pod := fake.NFTPacket{Src: netip.MustParseAddrPort("10.244.1.5:40000"), InIface: "veth1", Dst: vip}
		route("a pod", netrules.NFTHookPrerouting, pod, listen)
		route("the host", netrules.NFTHookOutput, fake.NFTPacket{Dst: vip}, listen)
		route("the agent's own marked traffic", netrules.NFTHookOutput, fake.NFTPacket{Dst: vip, Mark: cfg.SocketMark}, "10.250.0.2:6443")
		route("traffic routed in", netrules.NFTHookPrerouting, fake.NFTPacket{Src: netip.MustParseAddrPort("192.0.2.9:1"), Dst: vip}, "10.250.0.2:6443")
		applies := k.nft.Applies
		if _, res, err := d.sync(); err != nil || res.Changed() || k.nft.Applies != applies {
			t.Errorf("second sync: %+v %v, %d transactions", res, err, k.nft.Applies-applies)
		}
		k.clock.Step(cfg.LivenessTimeout)
		route("a pod after expiry", netrules.NFTHookPrerouting, pod, "10.250.0.2:6443")
		mustDo(t, d.remove())
		if tables, _ := k.nft.Tables(netrules.IPv4); len(tables) != 1 || tables[0] != kubeProxyNFTTable {
			t.Errorf("tables after remove: %v", tables)
		}
		if got := k.ipt.Save("nat"); len(got) == 0 {
			t.Errorf("nat table empty")
		}
	}
}

// TestSwitchDataplane: an agent of one dataplane removes the redirect an
// agent of the other left on the node (an upgrade, a changed
// --dataplane), and only then intercepts: never two redirects.
func TestSwitchDataplane(t *testing.T) {
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	ctx := context.Background()
	old, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneIPTables })
	if notReady, err := old.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("iptables agent: %v %v", notReady, err)
	}
	iptablesPresent := func() bool {
		present, err := old.icpt.planes[0].rules.present()
		mustDo(t, err)
		return present
	}
	if !iptablesPresent() {
		t.Fatal("the iptables agent's chain is not in place")
	}
	// An nftables agent starts on the node.
	a, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneNFTables })
	if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("nftables agent: %v %v", notReady, err)
	}
	if iptablesPresent() {
		t.Error("the iptables redirect is still there next to the nftables one")
	}
	if sets := k.ipset.Save(); sets != "" {
		t.Errorf("ipsets left:\n%s", sets)
	}
	if present, err := a.icpt.planes[0].rules.present(); err != nil || !present {
		t.Errorf("the nftables redirect is not in place: %v", err)
	}
	// And back: an iptables agent removes the nftables table.
	back, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneIPTables })
	if notReady, err := back.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("iptables agent again: %v %v", notReady, err)
	}
	if tables, _ := k.nft.Tables(netrules.IPv4); len(tables) != 0 {
		t.Errorf("nftables tables left: %v", tables)
	}
	if !iptablesPresent() {
		t.Error("the iptables redirect is not in place")
	}
}
