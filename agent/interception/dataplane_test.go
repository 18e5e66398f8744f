package interception

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// fakeKernel is a node with kube-proxy's iptables-mode rules for the VIPs,
// in both families.
type fakeKernel struct {
	clock     *clocktesting.FakeClock
	ipt, ip6t *fake.IPTables
	ipset     *fake.IPSet
	nl        *fake.Netlink
	ct        *fake.Conntrack
	nft       *fake.NFTables
}

func newFakeKernel(t *testing.T) *fakeKernel {
	t.Helper()
	k := &fakeKernel{
		clock: clocktesting.NewFakeClock(time.Now()),
		ipt:   fake.NewIPTables(),
		ip6t:  fake.NewIP6Tables(),
		nl:    fake.NewNetlink(),
		ct:    &fake.Conntrack{},
	}
	k.ipset = fake.NewIPSet(k.clock)
	k.nft = fake.NewNFTables(k.clock)
	k.ipt.UseSets(k.ipset)
	k.ip6t.UseSets(k.ipset)
	for ipt, svc := range map[*fake.IPTables][]string{
		k.ipt:  {"-d", "10.96.0.1/32", "-p", "tcp", "-m", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", "10.250.0.2:6443"},
		k.ip6t: {"-d", "fd00:10:96::1/128", "-p", "tcp", "-m", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", "[fd00:250::2]:6443"},
	} {
		mustDo(t, ipt.NewChain("nat", "KUBE-SERVICES"))
		mustDo(t, ipt.Append("nat", "KUBE-SERVICES", svc...))
		for _, hook := range []string{"PREROUTING", "OUTPUT"} {
			mustDo(t, ipt.Append("nat", hook, "-j", "KUBE-SERVICES"))
		}
	}
	return k
}

func (k *fakeKernel) kernel() Kernel {
	return Kernel{
		IPTables: func(f netrules.Family) (netrules.IPTables, error) {
			if f == netrules.IPv6 {
				return k.ip6t, nil
			}
			return k.ipt, nil
		},
		Backend:   "fake",
		Netlink:   k.nl,
		IPSet:     k.ipset,
		NFTables:  k.nft,
		Conntrack: k.ct,
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func dataplaneConfig() *Config {
	c := validConfig()
	c.SocketMark = testSocketMark
	c.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")}
	return c
}

// TestRedirectRules pins the rules the agent writes, per family, as
// iptables-save prints them: the RETURN for the agent's own marked traffic
// first, then the VIP's DNAT guarded by the liveness set, jumped first from
// PREROUTING and OUTPUT ahead of kube-proxy. The same rules serve
// kube-proxy's IPVS mode: IPVS sees packets only after nat PREROUTING and
// OUTPUT, by which time a redirected VIP is already the agent's local
// address.
func TestRedirectRules(t *testing.T) {
	k := newFakeKernel(t)
	planes, err := newDataplanes(dataplaneConfig(), DataplaneIPTables, k.kernel())
	mustDo(t, err)
	if len(planes) != 2 {
		t.Fatalf("got %d dataplanes, want one per family", len(planes))
	}
	for _, d := range planes {
		_, _, err := d.sync()
		mustDo(t, err)
	}
	want4 := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-APICACHE - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kube-apicache: redirect the kubernetes Service VIP" -j KUBE-APICACHE
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kube-apicache: redirect the kubernetes Service VIP" -j KUBE-APICACHE
-A OUTPUT -j KUBE-SERVICES
-A KUBE-APICACHE -m comment --comment "kube-apicache: own upstream traffic" -m mark --mark 0x1000/0x1000 -j RETURN
-A KUBE-APICACHE -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -m set --match-set KUBE-APICACHE-LIVE dst -m comment --comment "kube-apicache: kubernetes Service VIP to the node-local agent while it is alive" -j DNAT --to-destination 169.254.25.10:10443
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.250.0.2:6443
COMMIT
`
	if diff := cmp.Diff(want4, k.ipt.Save("nat")); diff != "" {
		t.Errorf("iptables nat (-want +got):\n%s", diff)
	}
	// The IPv6 VIP of a dual-stack Service: the same chain in ip6tables,
	// guarded by the inet6 set, to the IPv6 listen address.
	want6 := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-APICACHE - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kube-apicache: redirect the kubernetes Service VIP" -j KUBE-APICACHE
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kube-apicache: redirect the kubernetes Service VIP" -j KUBE-APICACHE
-A OUTPUT -j KUBE-SERVICES
-A KUBE-APICACHE -m comment --comment "kube-apicache: own upstream traffic" -m mark --mark 0x1000/0x1000 -j RETURN
-A KUBE-APICACHE -d fd00:10:96::1/128 -p tcp -m tcp --dport 443 -m set --match-set KUBE-APICACHE-LIVE6 dst -m comment --comment "kube-apicache: kubernetes Service VIP to the node-local agent while it is alive" -j DNAT --to-destination [fd00:169:254:25::10]:10443
-A KUBE-SERVICES -d fd00:10:96::1/128 -p tcp -m tcp --dport 443 -j DNAT --to-destination [fd00:250::2]:6443
COMMIT
`
	if diff := cmp.Diff(want6, k.ip6t.Save("nat")); diff != "" {
		t.Errorf("ip6tables nat (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("create KUBE-APICACHE-LIVE hash:ip family inet timeout 1\ncreate KUBE-APICACHE-LIVE6 hash:ip family inet6 timeout 1\n", k.ipset.Save()); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
}

// TestDeadManSwitch walks a new connection's first packet through the fake
// kernel: it goes to the agent only while the liveness entry lives, and to
// kube-proxy's endpoint once the agent stops refreshing it, without anyone
// touching the rules. The agent's own marked packets never go to the agent.
func TestDeadManSwitch(t *testing.T) {
	k := newFakeKernel(t)
	cfg := dataplaneConfig()
	cfg.ServiceVIPs = cfg.ServiceVIPs[:1]
	planes, err := newDataplanes(cfg, DataplaneIPTables, k.kernel())
	mustDo(t, err)
	d := planes[0]
	_, _, err = d.sync()
	mustDo(t, err)
	vip := netip.MustParseAddrPort("10.96.0.1:443")
	route := func(hook string, mark uint32) string {
		t.Helper()
		to, err := k.ipt.Traverse(hook, fake.Packet{Dst: vip, Mark: mark})
		mustDo(t, err)
		return to
	}
	const agent, kubeProxy = "169.254.25.10:10443", "10.250.0.2:6443"

	// Given rules but no entry yet (agent not yet healthy): kube-proxy.
	if got := route("PREROUTING", 0); got != kubeProxy {
		t.Fatalf("before the first refresh: %s, want %s", got, kubeProxy)
	}
	// When the agent refreshes every timeout/4: the agent, for pods and
	// host-network clients; never for the agent's own marked sockets.
	for range 8 {
		mustDo(t, d.refresh())
		k.clock.Step(cfg.LivenessTimeout / refreshesPerTimeout)
		for _, hook := range []string{"PREROUTING", "OUTPUT"} {
			if got := route(hook, 0); got != agent {
				t.Fatalf("%s while refreshed: %s, want %s", hook, got, agent)
			}
		}
		if got := route("OUTPUT", testSocketMark); got != kubeProxy {
			t.Fatalf("marked packet went to %s, want %s (a loop)", got, kubeProxy)
		}
	}
	// Then the agent dies: within the timeout, kube-proxy again.
	k.clock.Step(cfg.LivenessTimeout)
	if got := route("PREROUTING", 0); got != kubeProxy {
		t.Fatalf("after the timeout: %s, want %s", got, kubeProxy)
	}
	// An unhealthy agent deletes its entry at once.
	mustDo(t, d.refresh())
	mustDo(t, d.clear())
	if got := route("PREROUTING", 0); got != kubeProxy {
		t.Fatalf("after clear: %s, want %s", got, kubeProxy)
	}
}

// TestDataplaneRepairAndRestarts: rules deleted or reordered by hand are
// put back by the next sync; a hundred successive instances (each a new
// dataplane over the state the previous one left) never duplicate a chain,
// rule, jump or set entry; removal leaves kube-proxy's rules only.
func TestDataplaneRepairAndRestarts(t *testing.T) {
	k := newFakeKernel(t)
	cfg := dataplaneConfig()
	cfg.ServiceVIPs = cfg.ServiceVIPs[:1]
	before := k.ipt.Save("nat")
	var want string
	for i := range 100 {
		planes, err := newDataplanes(cfg, DataplaneIPTables, k.kernel())
		mustDo(t, err)
		d := planes[0]
		_, _, err = d.sync()
		mustDo(t, err)
		mustDo(t, d.refresh())
		if i == 0 {
			want = k.ipt.Save("nat")
			continue
		}
		if diff := cmp.Diff(want, k.ipt.Save("nat")); diff != "" {
			t.Fatalf("instance %d changed the rules (-first +now):\n%s", i, diff)
		}
		if got := k.ipset.Save(); got != "create KUBE-APICACHE-LIVE hash:ip family inet timeout 1\nadd KUBE-APICACHE-LIVE 10.96.0.1\n" {
			t.Fatalf("instance %d: sets:\n%s", i, got)
		}
		switch i % 3 {
		case 0: // someone deletes our jump from PREROUTING
			mustDo(t, k.ipt.Delete("nat", "PREROUTING", "-m", "comment", "--comment", "kube-apicache: redirect the kubernetes Service VIP", "-j", "KUBE-APICACHE"))
		case 1: // someone moves our jump behind kube-proxy's
			jump := []string{"-m", "comment", "--comment", "kube-apicache: redirect the kubernetes Service VIP", "-j", "KUBE-APICACHE"}
			mustDo(t, k.ipt.Delete("nat", "OUTPUT", jump...))
			mustDo(t, k.ipt.Append("nat", "OUTPUT", jump...))
		case 2: // someone deletes the DNAT rule
			mustDo(t, k.ipt.Delete("nat", "KUBE-APICACHE", "2"))
		}
		res, err := d.rules.(*iptablesRules).chain.Sync()
		mustDo(t, err)
		if !res.Changed() {
			t.Fatalf("instance %d: sync did not repair the change", i)
		}
		if diff := cmp.Diff(want, k.ipt.Save("nat")); diff != "" {
			t.Fatalf("instance %d: not repaired (-want +got):\n%s", i, diff)
		}
	}
	planes, err := newDataplanes(cfg, DataplaneIPTables, k.kernel())
	mustDo(t, err)
	mustDo(t, planes[0].remove())
	if diff := cmp.Diff(before, k.ipt.Save("nat")); diff != "" {
		t.Errorf("after remove (-kube-proxy only +got):\n%s", diff)
	}
	if got := k.ipset.Save(); got != "" {
		t.Errorf("sets left after remove:\n%s", got)
	}
}
