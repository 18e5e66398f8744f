package interception

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// ipvsClusterIPSet is kube-proxy's IPVS-mode set of cluster IP and port
// pairs (hash:ip,port), matched "dst,dst".
const ipvsClusterIPSet = "KUBE-CLUSTER-IP"

// newIPVSFakeKernel is a node as kube-proxy's IPVS mode leaves it, for the
// IPv4 VIP: the VIP bound to the kube-ipvs0 dummy link (so the packet is
// local and IPVS takes it at input), the VIP and port in KUBE-CLUSTER-IP,
// and nat KUBE-SERVICES, jumped from PREROUTING and OUTPUT, ending the nat
// traversal with ACCEPT for every cluster IP. No DNAT: IPVS, not
// netfilter, picks the endpoint.
func newIPVSFakeKernel(t *testing.T, vip netip.AddrPort) *fakeKernel {
	t.Helper()
	k := newFakeKernel(t)
	k.ipt = fake.NewIPTables()
	k.ipt.UseSets(k.ipset)
	mustDo(t, k.ipset.IpsetCreate(ipvsClusterIPSet, "hash:ip,port", netlink.IpsetCreateOptions{}))
	port, proto := vip.Port(), uint8(6)
	mustDo(t, k.ipset.IpsetAdd(ipvsClusterIPSet, &netlink.IPSetEntry{IP: vip.Addr().AsSlice(), Port: &port, Protocol: &proto}))
	mustDo(t, k.ipt.NewChain("nat", "KUBE-SERVICES"))
	mustDo(t, k.ipt.Append("nat", "KUBE-SERVICES", "-m", "comment", "--comment", "Kubernetes service cluster ip + port for masquerade purpose",
		"-m", "set", "--match-set", ipvsClusterIPSet, "dst,dst", "-j", "ACCEPT"))
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		mustDo(t, k.ipt.Append("nat", hook, "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"))
	}
	ipvs := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}}
	mustDo(t, k.nl.LinkAdd(ipvs))
	link, err := k.nl.LinkByName("kube-ipvs0")
	mustDo(t, err)
	mustDo(t, k.nl.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(vip.Addr(), 32))}))
	return k
}

// TestIPVSMode: on a node of kube-proxy's IPVS mode, with either
// dataplane, a connection to the VIP from a pod or the host goes to the
// agent while the liveness entry lives, and to IPVS (the nat traversal
// ends in kube-proxy's ACCEPT, with the VIP untouched) once it expires or
// for the agent's own marked traffic; the agent's redirect runs ahead of
// kube-proxy's jump and leaves kube-proxy's rules, set and kube-ipvs0's
// VIP alone, through syncs and removal.
func TestIPVSMode(t *testing.T) {
	for _, dataplane := range []string{DataplaneIPTables, DataplaneNFTables} {
		t.Run(dataplane, func(t *testing.T) {
			cfg := dataplaneConfig()
			cfg.ServiceVIPs = cfg.ServiceVIPs[:1]
			vip := netip.AddrPortFrom(cfg.ServiceVIPs[0], cfg.ServicePort)
			k := newIPVSFakeKernel(t, vip)
			kubeProxyRules := k.ipt.Save("nat")
			planes, err := newDataplanes(cfg, dataplane, k.kernel())
			mustDo(t, err)
			d := planes[0]
			d.setLocal(localMatch{cidr: netip.MustParsePrefix("10.244.0.0/16")})
			_, _, err = d.sync()
			mustDo(t, err)
			mustDo(t, d.refresh())

			listen := cfg.ListenAddress.String()
			const toIPVS = "" // no DNAT: the nat traversal ends, IPVS takes it
			pod := netip.MustParseAddrPort("10.244.1.5:40000")
			route := func(what, hook string, p fake.Packet, want string) {
				t.Helper()
				var to string
				var err error
				if dataplane == DataplaneNFTables {
					// The agent's table runs at dstnat-1, before
					// iptables-nft's nat chains (dstnat) where
					// kube-proxy's jump is.
					nftHook := netrules.NFTHookPrerouting
					if hook == "OUTPUT" {
						nftHook = netrules.NFTHookOutput
					}
					src := netip.AddrPort{}
					if p.Src.IsValid() {
						src = netip.AddrPortFrom(p.Src, 40000)
					}
					_, to, err = k.nft.Traverse(netrules.IPv4, nftHook, fake.NFTPacket{Src: src, InIface: p.InIface, Dst: p.Dst, Mark: p.Mark})
				}
				if err == nil && to == "" {
					to, err = k.ipt.Traverse(hook, p)
				}
				if err != nil || to != want {
					t.Errorf("%s went to %q (%v), want %q", what, to, err, want)
				}
			}
			route("a pod", "PREROUTING", fake.Packet{Src: pod.Addr(), InIface: "veth1", Dst: vip}, listen)
			route("the host", "OUTPUT", fake.Packet{Dst: vip}, listen)
			route("the agent's own marked traffic", "OUTPUT", fake.Packet{Dst: vip, Mark: cfg.SocketMark}, toIPVS)

			if dataplane == DataplaneIPTables {
				nat := k.ipt.Save("nat")
				for _, hook := range []string{"PREROUTING", "OUTPUT"} {
					first := ""
					for _, l := range strings.Split(nat, "\n") {
						if strings.HasPrefix(l, "-A "+hook+" ") {
							first = l
							break
						}
					}
					if !strings.HasSuffix(first, "-j "+DefaultChain) {
						t.Errorf("first rule of %s is %q, want the agent's jump ahead of kube-proxy's", hook, first)
					}
				}
			}
			if _, res, err := d.sync(); err != nil || res.Changed() {
				t.Errorf("second sync: %+v %v", res, err)
			}
			k.clock.Step(cfg.LivenessTimeout)
			route("a pod after expiry", "PREROUTING", fake.Packet{Src: pod.Addr(), InIface: "veth1", Dst: vip}, toIPVS)

			mustDo(t, d.remove())
			if got := k.ipt.Save("nat"); got != kubeProxyRules {
				t.Errorf("nat table after removal:\n%s\nwant kube-proxy's alone:\n%s", got, kubeProxyRules)
			}
			if !k.ipset.ContainsAddrPort(ipvsClusterIPSet, vip) {
				t.Errorf("kube-proxy's %s lost the VIP", ipvsClusterIPSet)
			}
			if addrs := k.nl.Addresses(); !slices.ContainsFunc(addrs, func(a string) bool {
				return strings.HasPrefix(a, "kube-ipvs0 ") && strings.Contains(a, vip.Addr().String())
			}) {
				t.Errorf("kube-ipvs0 lost the VIP: %v", addrs)
			}
		})
	}
}
