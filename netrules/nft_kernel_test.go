package netrules_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kube-apicache/kube-apicache/netrules"
	"github.com/kube-apicache/kube-apicache/netrules/netnstest"
)

// nftNet is the network of the nftables kernel tests: a node namespace,
// which holds the tables, the agent's listener and kube-proxy's target,
// and a pod namespace joined to it by a veth pair, which reaches the VIP
// through the node.
type nftNet struct {
	family netrules.Family
	vip    netip.AddrPort
	// vipRoute leads to the VIP: over loopback on the node, through the
	// node from the pod.
	vipRoute netip.Prefix
	agent    netip.AddrPort // the agent's listener
	proxy    netip.AddrPort // where kube-proxy sends the VIP
	node     netip.Prefix   // the node's end of the veth pair
	pod      netip.Prefix   // the pod's end
}

var nftNets = map[netrules.Family]nftNet{
	netrules.IPv4: {
		family:   netrules.IPv4,
		vip:      netip.MustParseAddrPort("10.96.0.1:443"),
		vipRoute: netip.MustParsePrefix("10.96.0.0/16"),
		agent:    netip.MustParseAddrPort("169.254.20.10:6443"),
		proxy:    netip.MustParseAddrPort("169.254.30.10:6443"),
		node:     netip.MustParsePrefix("10.244.0.1/24"),
		pod:      netip.MustParsePrefix("10.244.0.2/24"),
	},
	netrules.IPv6: {
		family:   netrules.IPv6,
		vip:      netip.MustParseAddrPort("[fd00:10:96::1]:443"),
		vipRoute: netip.MustParsePrefix("fd00:10:96::/64"),
		agent:    netip.MustParseAddrPort("[fd00:20::10]:6443"),
		proxy:    netip.MustParseAddrPort("[fd00:30::10]:6443"),
		node:     netip.MustParsePrefix("fd00:244::1/64"),
		pod:      netip.MustParsePrefix("fd00:244::2/64"),
	},
}

const (
	nftTable   = "kube-apicache"
	nodeVeth   = "kacveth0"
	podVeth    = "eth0"
	bypassMark = 0x4000
)

// nftSets are the agent's sets in its table.
type nftSets struct {
	live *netrules.NFTTimedSet
	skip *netrules.NFTTimedSet
	pods *netrules.NFTAddressSet
	seen *netrules.NFTAttemptSet
}

func newNFTSets(nft netrules.NFTables, family netrules.Family) nftSets {
	return nftSets{
		live: netrules.NewNFTTimedSet(nft, family, nftTable, "liveness", time.Second),
		skip: netrules.NewNFTTimedSet(nft, family, nftTable, "skip", 30*time.Second),
		pods: netrules.NewNFTAddressSet(nft, family, nftTable, "pods"),
		seen: netrules.NewNFTAttemptSet(nft, family, nftTable, "seen", 10*time.Second),
	}
}

// redirectSpec is a table like the agent's: marked connections and
// skipped sources return, connections to the VIP are recorded and
// redirected while the liveness set holds the VIP, and the prerouting
// jump is restricted by local.
func redirectSpec(n nftNet, sets nftSets, local netrules.NFTRule) netrules.NFTRedirectSpec {
	vip := n.vip
	return netrules.NFTRedirectSpec{
		Family:   n.family,
		Table:    nftTable,
		Priority: netrules.NFTPriorityDstNAT - 1,
		Chain: netrules.NFTChain{Name: "redirect", Rules: []netrules.NFTRule{
			{MarkMask: bypassMark, Return: true, Note: "kube-apicache: the agent's own connections"},
			{SrcSet: sets.skip.Name(), Return: true, Note: "kube-apicache: sources that bypass the redirect"},
			{DstAddr: vip.Addr(), TCPDstPort: vip.Port(), DstSet: sets.live.Name(), UpdateSet: sets.seen.Name(), Note: "kube-apicache: record the attempt"},
			{DstAddr: vip.Addr(), TCPDstPort: vip.Port(), DstSet: sets.live.Name(), DNAT: n.agent, Note: "kube-apicache: to the local listener"},
		}},
		Local: local,
		Sets:  []netrules.NFTSet{sets.live.Def(), sets.skip.Def(), sets.pods.Def(), sets.seen.Def()},
	}
}

// addKubeProxy writes a table like kube-proxy's nftables mode: nat
// prerouting and output chains at dstnat that DNAT the VIP to proxy.
func addKubeProxy(t *testing.T, nft netrules.NFTables, n nftNet) {
	t.Helper()
	dnat := netrules.NFTRule{DstAddr: n.vip.Addr(), TCPDstPort: n.vip.Port(), DNAT: n.proxy, Note: "kubernetes:https"}
	tx := &netrules.NFTTransaction{Family: n.family, Table: "kube-proxy", Ops: []netrules.NFTOp{{Kind: netrules.NFTAddTable}}}
	for _, c := range []netrules.NFTChain{
		{Name: "nat-prerouting", Hook: netrules.NFTHookPrerouting, Priority: netrules.NFTPriorityDstNAT},
		{Name: "nat-output", Hook: netrules.NFTHookOutput, Priority: netrules.NFTPriorityDstNAT},
	} {
		tx.Ops = append(tx.Ops,
			netrules.NFTOp{Kind: netrules.NFTAddChain, Chain: c},
			netrules.NFTOp{Kind: netrules.NFTAddRule, Chain: c, Rule: dnat})
	}
	must(t, nft.Apply(tx))
}

func openNFT(t *testing.T) *netrules.KernelNFTables {
	t.Helper()
	nft, err := netrules.NewKernelNFTables()
	must(t, err)
	return nft
}

// hostPrefix is a as a one-address prefix.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func addAddr(t *testing.T, h *netlink.Handle, link string, p netip.Prefix) {
	t.Helper()
	l, err := h.LinkByName(link)
	must(t, err)
	// No duplicate address detection: the address is usable at once.
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
	must(t, h.AddrAdd(l, a))
}

func ipNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// setUpNet builds n in the pod namespace (hs[0]) and the node namespace
// (hs[1], the current one).
func setUpNet(t *testing.T, n nftNet, nss []netns.NsHandle, hs []*netlink.Handle) {
	t.Helper()
	podH, nodeH := hs[0], hs[1]
	must(t, nodeH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nodeVeth}, PeerName: podVeth, PeerNamespace: netlink.NsFd(int(nss[0]))}))
	addAddr(t, nodeH, nodeVeth, n.node)
	addAddr(t, podH, podVeth, n.pod)
	addAddr(t, nodeH, "lo", hostPrefix(n.agent.Addr()))
	addAddr(t, nodeH, "lo", hostPrefix(n.proxy.Addr()))
	for _, x := range []struct {
		h    *netlink.Handle
		link string
	}{{nodeH, nodeVeth}, {podH, podVeth}} {
		l, err := x.h.LinkByName(x.link)
		must(t, err)
		must(t, x.h.LinkSetUp(l))
	}
	lo, err := nodeH.LinkByName("lo")
	must(t, err)
	must(t, nodeH.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: ipNet(n.vipRoute), Scope: netlink.SCOPE_LINK}))
	eth, err := podH.LinkByName(podVeth)
	must(t, err)
	must(t, podH.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(n.vipRoute), Gw: n.node.Addr().AsSlice()}))
}

// serve answers every connection to addr with name, in the current
// namespace.
func serve(t *testing.T, addr netip.AddrPort, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr.String())
	must(t, err)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			c.Close()
		}
	}()
	return l
}

// dial connects to addr from namespace from (the current one if it is
// netns.None()), with mark on the socket unless 0, and returns the name of
// the listener that answered, or the error, and the connection's source.
func dial(t *testing.T, from, home netns.NsHandle, addr netip.AddrPort, mark int) (string, netip.AddrPort) {
	t.Helper()
	// Generous: on a loaded machine a first SYN can take its one-second
	// retransmission; what answers, not how fast, is what is checked.
	d := net.Dialer{Timeout: 5 * time.Second}
	if mark != 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
			return errors.Join(err, serr)
		}
	}
	var c net.Conn
	var err error
	if from == netns.None() {
		c, err = d.Dial("tcp", addr.String())
	} else {
		// The socket is created in from's namespace, on this locked
		// thread, and stays there.
		must(t, netns.Set(from))
		c, err = d.Dial("tcp", addr.String())
		must(t, netns.Set(home))
	}
	if err != nil {
		return "error: " + err.Error(), netip.AddrPort{}
	}
	defer c.Close()
	must(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	b, err := io.ReadAll(c)
	if err != nil {
		return "error: " + err.Error(), netip.AddrPort{}
	}
	return string(b), c.LocalAddr().(*net.TCPAddr).AddrPort()
}

// logTable logs nft's view of the table when nft is installed.
func logTable(t *testing.T, family netrules.Family, table string) {
	t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		return
	}
	fam := "ip"
	if family == netrules.IPv6 {
		fam = "ip6"
	}
	out, err := exec.Command(nft, "list", "table", fam, table).CombinedOutput()
	t.Logf("nft list table %s %s: %v\n%s", fam, table, err, out)
}

// checkTable checks that ListTable reads back spec: its chains, hooks,
// priorities and rule comments, and its sets.
func checkTable(t *testing.T, nft netrules.NFTables, spec netrules.NFTRedirectSpec) {
	t.Helper()
	got, err := nft.ListTable(spec.Family, spec.Table)
	must(t, err)
	if got == nil {
		t.Fatalf("table %s %s missing", spec.Family, spec.Table)
	}
	notes := func(rs []netrules.NFTRule) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Note)
		}
		return out
	}
	type chain struct {
		Name     string
		Hook     netrules.NFTHook
		Priority int32
		Rules    []string
	}
	var have []chain
	for _, c := range got.Chains {
		have = append(have, chain{c.Name, c.Hook, c.Priority, notes(c.Rules)})
	}
	slices.SortFunc(have, func(a, b chain) int { return strings.Compare(a.Name, b.Name) })
	// A base chain's one rule is a jump whose comment ends with the
	// digest of the jump rule (the note before it is the redirect's).
	digest := func(r netrules.NFTRule) string { r.Jump, r.Note = spec.Chain.Name, ""; return r.Comment() }
	var regular []string
	for _, r := range spec.Chain.Rules {
		regular = append(regular, r.Comment())
	}
	want := []chain{
		{netrules.NFTOutputChain, netrules.NFTHookOutput, spec.Priority, []string{digest(netrules.NFTRule{})}},
		{netrules.NFTPreroutingChain, netrules.NFTHookPrerouting, spec.Priority, []string{digest(spec.Local)}},
		{spec.Chain.Name, "", 0, regular},
	}
	suffix := cmp.Comparer(func(a, b string) bool {
		return a == b || strings.HasPrefix(b, "kube-apicache: ") && strings.HasSuffix(b, a) || strings.HasPrefix(a, "kube-apicache: ") && strings.HasSuffix(a, b)
	})
	if diff := cmp.Diff(want, have, suffix); diff != "" {
		t.Errorf("chains read back (-want +got):\n%s", diff)
	}
	byName := func(a, b netrules.NFTSet) int { return strings.Compare(a.Name, b.Name) }
	wantSets := slices.SortedFunc(slices.Values(spec.Sets), byName)
	haveSets := slices.SortedFunc(slices.Values(got.Sets), byName)
	if diff := cmp.Diff(wantSets, haveSets); diff != "" {
		t.Errorf("sets read back (-want +got):\n%s", diff)
	}
}

// TestNFTRedirectKernel checks the redirect against the real kernel, per
// family, with a table like kube-proxy's nftables mode loaded before or
// after the agent's: while the liveness element lives, connections to the
// VIP from the node (output hook) and from a pod (prerouting hook) reach
// the agent's listener, whatever the tables' order; the pod's attempt is
// recorded in the seen set; a skipped source and a marked socket bypass
// the agent; once the element is deleted, or expires, kube-proxy's DNAT
// applies.
func TestNFTRedirectKernel(t *testing.T) {
	for _, tc := range []struct {
		name           string
		family         netrules.Family
		kubeProxyFirst bool
	}{
		{"inet/kube-proxy-first", netrules.IPv4, true},
		{"inet/kube-proxy-last", netrules.IPv4, false},
		{"inet6/kube-proxy-first", netrules.IPv6, true},
		{"inet6/kube-proxy-last", netrules.IPv6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			netnstest.Run(t, 2, func(nss []netns.NsHandle, hs []*netlink.Handle) {
				pod, node, self := nss[0], nss[1], netns.None()
				n := nftNets[tc.family]
				setUpNet(t, n, nss, hs)
				defer serve(t, n.agent, "agent").Close()
				defer serve(t, n.proxy, "kube-proxy").Close()
				nft := openNFT(t)
				defer nft.Close()

				// Given kube-proxy's table, before or after ours.
				if tc.kubeProxyFirst {
					addKubeProxy(t, nft, n)
				}
				sets := newNFTSets(nft, tc.family)
				spec := redirectSpec(n, sets, netrules.NFTRule{SrcSet: sets.pods.Name()})
				r := netrules.NewNFTRedirect(nft, spec)
				created, res, err := r.Sync()
				must(t, err)
				if !created || !res.Changed() {
					t.Errorf("first sync: setCreated %v, %+v; want a change", created, res)
				}
				if created, res, err = r.Sync(); err != nil || created || res.Changed() {
					t.Errorf("second sync: setCreated %v, %+v, %v; want no change", created, res, err)
				}
				if !tc.kubeProxyFirst {
					addKubeProxy(t, nft, n)
				}
				checkTable(t, nft, spec)
				if created, res, err = r.Sync(); err != nil || created || res.Changed() {
					t.Errorf("sync with kube-proxy's table: setCreated %v, %+v, %v; want no change", created, res, err)
				}
				podIP := n.pod.Addr()
				if added, _, err := sets.pods.Sync([]netip.Addr{podIP}); err != nil || added != 1 {
					t.Fatalf("pods.Sync = %d, %v", added, err)
				}

				expect := func(what string, from netns.NsHandle, mark int, want string) netip.AddrPort {
					t.Helper()
					got, src := dial(t, from, node, n.vip, mark)
					if got != want {
						t.Errorf("%s: %s answered, want %s", what, got, want)
					}
					return src
				}
				// Checks that need the element alive refresh it with a
				// long timeout: a dial on a loaded machine can outlast the
				// set's one-second default (a SYN retransmission alone
				// takes a second), and the check is about what answers,
				// not how fast. Expiry is checked below with the set's own
				// short timeout, by waiting for the element to go.
				longLive := netrules.NewNFTTimedSet(nft, tc.family, nftTable, sets.live.Name(), time.Minute)
				live := func() { t.Helper(); must(t, longLive.Refresh([]netip.Addr{n.vip.Addr()})) }

				// While the liveness element lives, both paths reach the
				// agent.
				live()
				expect("node, live", self, 0, "agent")
				live()
				src := expect("pod, live", pod, 0, "agent")

				// The pod's attempt is in the seen set, expiring.
				attempts, err := sets.seen.Entries()
				must(t, err)
				if !slices.Contains(attempts, src) {
					t.Errorf("seen set = %v, want %v in it", attempts, src)
				}
				els, err := nft.Elements(tc.family, nftTable, sets.seen.Name())
				must(t, err)
				for _, e := range els {
					if e.Expires <= 0 || e.Expires > 10*time.Second {
						t.Errorf("seen element %+v: want 0 < Expires <= 10s", e)
					}
				}

				// The mark bypasses the agent.
				live()
				expect("node, marked", self, bypassMark, "kube-proxy")

				// So does a source in the skip set, until cleared.
				must(t, sets.skip.Refresh([]netip.Addr{podIP}))
				live()
				expect("pod, skipped", pod, 0, "kube-proxy")
				must(t, sets.skip.Clear([]netip.Addr{podIP}))
				live()
				expect("pod, no longer skipped", pod, 0, "agent")

				// A deleted liveness element stops the redirect at once.
				must(t, sets.live.Clear([]netip.Addr{n.vip.Addr()}))
				expect("node, cleared", self, 0, "kube-proxy")
				expect("pod, cleared", pod, 0, "kube-proxy")

				// An element no longer refreshed expires, and with it the
				// redirect.
				live()
				expect("node, live again", self, 0, "agent")
				must(t, sets.live.Refresh([]netip.Addr{n.vip.Addr()}))
				deadline := time.Now().Add(10 * time.Second)
				for {
					ips, err := sets.live.Entries()
					must(t, err)
					if len(ips) == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("liveness element %v did not expire", ips)
					}
					time.Sleep(100 * time.Millisecond)
				}
				expect("node, expired", self, 0, "kube-proxy")
				expect("pod, expired", pod, 0, "kube-proxy")
				logTable(t, tc.family, nftTable)
			})
		})
	}
}

// TestNFTLocalKernel checks each kind of match that restricts the
// prerouting jump to the node's pods, against a pod's real connection: a
// source prefix, an interface name, an interface prefix ("kacveth*"), and
// ones that do not match, which leave the connection to kube-proxy.
func TestNFTLocalKernel(t *testing.T) {
	netnstest.Run(t, 2, func(nss []netns.NsHandle, hs []*netlink.Handle) {
		pod, node := nss[0], nss[1]
		n := nftNets[netrules.IPv4]
		setUpNet(t, n, nss, hs)
		defer serve(t, n.agent, "agent").Close()
		defer serve(t, n.proxy, "kube-proxy").Close()
		nft := openNFT(t)
		defer nft.Close()
		addKubeProxy(t, nft, n)
		sets := newNFTSets(nft, netrules.IPv4)
		r := netrules.NewNFTRedirect(nft, redirectSpec(n, sets, netrules.NFTRule{}))
		// A minute's element: the set's one-second default can expire
		// during a dial on a loaded machine (see TestNFTRedirectKernel).
		live := netrules.NewNFTTimedSet(nft, netrules.IPv4, nftTable, sets.live.Name(), time.Minute)
		for _, tc := range []struct {
			local netrules.NFTRule
			want  string
		}{
			{netrules.NFTRule{SrcPrefix: netip.MustParsePrefix("10.244.0.0/24")}, "agent"},
			{netrules.NFTRule{SrcPrefix: netip.MustParsePrefix("10.244.0.2/32")}, "agent"},
			{netrules.NFTRule{SrcPrefix: netip.MustParsePrefix("10.245.0.0/16")}, "kube-proxy"},
			{netrules.NFTRule{InIface: "kacveth0"}, "agent"},
			{netrules.NFTRule{InIface: "kacveth*"}, "agent"},
			{netrules.NFTRule{InIface: "kacveth"}, "kube-proxy"},
			{netrules.NFTRule{InIface: "kacveth00"}, "kube-proxy"},
			{netrules.NFTRule{InIface: "cali*"}, "kube-proxy"},
			{netrules.NFTRule{InIface: "kac*", SrcSet: sets.pods.Name()}, "kube-proxy"}, // the pods set is empty
		} {
			r.SetSpec(redirectSpec(n, sets, tc.local))
			if _, _, err := r.Sync(); err != nil {
				t.Errorf("%s: %v", tc.local, err)
				continue
			}
			must(t, live.Refresh([]netip.Addr{n.vip.Addr()}))
			if got, _ := dial(t, pod, node, n.vip, 0); got != tc.want {
				t.Errorf("%s: %s answered, want %s", tc.local, got, tc.want)
			}
		}
		logTable(t, netrules.IPv4, nftTable)
	})
}

// TestNFTRedirectRepairKernel checks that Sync repairs foreign changes to
// the table, and that the elements of sets it leaves alone survive a
// rewrite of the rules.
func TestNFTRedirectRepairKernel(t *testing.T) {
	inNewNetNS(t, func(*netlink.Handle) {
		nft := openNFT(t)
		defer nft.Close()
		n := nftNets[netrules.IPv4]
		sets := newNFTSets(nft, netrules.IPv4)
		spec := redirectSpec(n, sets, netrules.NFTRule{SrcSet: sets.pods.Name()})
		r := netrules.NewNFTRedirect(nft, spec)
		_, _, err := r.Sync()
		must(t, err)
		pods := []netip.Addr{netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("10.244.0.3")}
		_, _, err = sets.pods.Sync(pods)
		must(t, err)
		must(t, sets.skip.Refresh(pods[:1]))
		attempt := netip.MustParseAddrPort("10.244.0.2:40000")
		must(t, nft.RefreshElements(netrules.IPv4, nftTable, sets.seen.Name(), []netrules.NFTElement{{Addr: attempt.Addr(), Port: attempt.Port()}}))
		foreign := openNFT(t) // someone else on the node
		defer foreign.Close()
		tx := func(ops ...netrules.NFTOp) *netrules.NFTTransaction {
			return &netrules.NFTTransaction{Family: netrules.IPv4, Table: nftTable, Ops: ops}
		}
		flush := func(name string) netrules.NFTOp {
			return netrules.NFTOp{Kind: netrules.NFTFlushChain, Chain: netrules.NFTChain{Name: name}}
		}
		all := []netrules.NFTOp{flush(spec.Chain.Name), flush(netrules.NFTPreroutingChain), flush(netrules.NFTOutputChain)}

		for _, tc := range []struct {
			name        string
			change      *netrules.NFTTransaction
			wantCreated bool
			wantFixed   []string
			// emptied is the set the change leaves empty, if any.
			emptied string
		}{{
			name:   "regular chain flushed",
			change: tx(flush(spec.Chain.Name)),
		}, {
			name:        "liveness set deleted",
			change:      tx(append(all, netrules.NFTOp{Kind: netrules.NFTDeleteSet, Set: netrules.NFTSet{Name: sets.live.Name()}})...),
			wantCreated: true,
		}, {
			// Sync replaces the set, deleting and adding it in one batch.
			name: "skip set redefined",
			change: tx(append(all,
				netrules.NFTOp{Kind: netrules.NFTDeleteSet, Set: netrules.NFTSet{Name: sets.skip.Name()}},
				netrules.NFTOp{Kind: netrules.NFTAddSet, Set: netrules.NFTSet{Name: sets.skip.Name(), Type: netrules.NFTSetAddr, Timeout: time.Minute}})...),
			wantCreated: true,
			emptied:     sets.skip.Name(),
		}, {
			name:      "output chain deleted",
			change:    tx(flush(netrules.NFTOutputChain), netrules.NFTOp{Kind: netrules.NFTDeleteChain, Chain: netrules.NFTChain{Name: netrules.NFTOutputChain}}),
			wantFixed: []string{netrules.NFTOutputChain},
		}, {
			name: "prerouting chain at another priority",
			change: tx(append(all,
				netrules.NFTOp{Kind: netrules.NFTDeleteChain, Chain: netrules.NFTChain{Name: netrules.NFTPreroutingChain}},
				netrules.NFTOp{Kind: netrules.NFTAddChain, Chain: netrules.NFTChain{Name: netrules.NFTPreroutingChain, Hook: netrules.NFTHookPrerouting, Priority: netrules.NFTPriorityDstNAT}})...),
			wantFixed: []string{netrules.NFTPreroutingChain},
		}, {
			name:        "whole table deleted",
			change:      nil,
			wantCreated: true,
			wantFixed:   []string{netrules.NFTPreroutingChain, netrules.NFTOutputChain},
		}} {
			if tc.change != nil {
				must(t, foreign.Apply(tc.change))
			} else {
				must(t, foreign.DeleteTable(netrules.IPv4, nftTable))
			}
			created, res, err := r.Sync()
			if err != nil {
				t.Fatalf("%s: sync: %v", tc.name, err)
			}
			if created != tc.wantCreated || !res.Changed() || !slices.Equal(res.JumpsFixed, tc.wantFixed) {
				t.Errorf("%s: sync = setCreated %v, %+v; want setCreated %v, JumpsFixed %v", tc.name, created, res, tc.wantCreated, tc.wantFixed)
			}
			checkTable(t, nft, spec)
			if created, res, err := r.Sync(); err != nil || created || res.Changed() {
				t.Errorf("%s: second sync = %v, %+v, %v; want no change", tc.name, created, res, err)
			}
			if tc.change == nil {
				continue
			}
			// The sets the change left alone keep their elements.
			if tc.emptied == sets.skip.Name() {
				if got, err := sets.skip.Entries(); err != nil || len(got) != 0 {
					t.Errorf("%s: skip set = %v, %v; want it recreated empty", tc.name, got, err)
				}
				must(t, sets.skip.Refresh(pods[:1]))
			}
			if got, err := sets.pods.Entries(); err != nil || len(got) != len(pods) {
				t.Errorf("%s: pods set = %v, %v; want %v", tc.name, got, err, pods)
			}
			if got, err := sets.skip.Entries(); err != nil || len(got) != 1 {
				t.Errorf("%s: skip set = %v, %v; want %v", tc.name, got, err, pods[:1])
			}
			if got, err := sets.seen.Entries(); err != nil || !slices.Equal(got, []netip.AddrPort{attempt}) {
				t.Errorf("%s: seen set = %v, %v; want %v", tc.name, got, err, attempt)
			}
		}

		// RemoveRules keeps the sets; Remove deletes everything.
		_, _, err = sets.pods.Sync(pods)
		must(t, err)
		must(t, r.RemoveRules())
		if present, err := r.Present(); err != nil || present {
			t.Errorf("Present after RemoveRules = %v, %v", present, err)
		}
		if got, err := sets.pods.Entries(); err != nil || len(got) != len(pods) {
			t.Errorf("pods set after RemoveRules = %v, %v; want %v", got, err, pods)
		}
		must(t, r.Remove())
		must(t, r.Remove()) // gone: not an error
		if tbl, err := nft.ListTable(netrules.IPv4, nftTable); err != nil || tbl != nil {
			t.Errorf("ListTable after Remove = %+v, %v; want nil", tbl, err)
		}
		if names, err := nft.Tables(netrules.IPv4); err != nil || slices.Contains(names, nftTable) {
			t.Errorf("Tables after Remove = %v, %v", names, err)
		}
	})
}

// TestNFTSetsKernel checks the set types against the kernel: an address
// set synced to a list, a timed set whose Refresh resets the time left,
// an attempt set read and forgotten, and errors for what does not exist.
func TestNFTSetsKernel(t *testing.T) {
	inNewNetNS(t, func(*netlink.Handle) {
		nft := openNFT(t)
		defer nft.Close()
		const fam = netrules.IPv4
		sets := newNFTSets(nft, fam)
		sets.live = netrules.NewNFTTimedSet(nft, fam, nftTable, "liveness", 5*time.Second)

		// Nothing exists yet.
		if _, err := nft.Elements(fam, nftTable, "pods"); !netrules.IsNFTNotExist(err) {
			t.Errorf("Elements of a missing table = %v, want not-exist", err)
		}
		if got, err := sets.pods.Entries(); err != nil || got != nil {
			t.Errorf("Entries of a missing set = %v, %v; want none", got, err)
		}
		must(t, sets.live.Clear([]netip.Addr{netip.MustParseAddr("10.0.0.1")}))
		must(t, sets.seen.Forget(netip.MustParseAddrPort("10.0.0.1:1")))
		must(t, nft.DeleteTable(fam, nftTable))

		tx := &netrules.NFTTransaction{Family: fam, Table: nftTable, Ops: []netrules.NFTOp{{Kind: netrules.NFTAddTable}}}
		for _, s := range []netrules.NFTSet{sets.live.Def(), sets.pods.Def(), sets.seen.Def()} {
			tx.Ops = append(tx.Ops, netrules.NFTOp{Kind: netrules.NFTAddSet, Set: s})
		}
		must(t, nft.Apply(tx))
		for _, err := range []error{
			nft.RefreshElements(fam, nftTable, "nope", []netrules.NFTElement{{Addr: netip.MustParseAddr("10.0.0.1")}}),
			nft.DeleteElements(fam, nftTable, "nope", []netrules.NFTElement{{Addr: netip.MustParseAddr("10.0.0.1")}}),
			func() error { _, err := nft.Elements(fam, nftTable, "nope"); return err }(),
		} {
			if !netrules.IsNFTNotExist(err) {
				t.Errorf("missing set: %v, want not-exist", err)
			}
		}
		if names, err := nft.Tables(fam); err != nil || !slices.Equal(names, []string{nftTable}) {
			t.Errorf("Tables = %v, %v", names, err)
		}
		if names, err := nft.Tables(netrules.IPv6); err != nil || len(names) != 0 {
			t.Errorf("Tables(IPv6) = %v, %v", names, err)
		}

		// The address set follows the list, ignoring the other family.
		a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
		for _, step := range []struct {
			ips            []netip.Addr
			added, removed int
			want           []netip.Addr
		}{
			{[]netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("fd00::1")}, 2, 0, []netip.Addr{a("10.0.0.1"), a("10.0.0.2")}},
			{[]netip.Addr{a("10.0.0.2"), a("::ffff:10.0.0.3")}, 1, 1, []netip.Addr{a("10.0.0.2"), a("10.0.0.3")}},
			{[]netip.Addr{a("10.0.0.2"), a("10.0.0.3")}, 0, 0, []netip.Addr{a("10.0.0.2"), a("10.0.0.3")}},
			{nil, 0, 2, nil},
		} {
			added, removed, err := sets.pods.Sync(step.ips)
			must(t, err)
			got, err := sets.pods.Entries()
			must(t, err)
			slices.SortFunc(got, netip.Addr.Compare)
			if added != step.added || removed != step.removed || !slices.Equal(got, step.want) {
				t.Errorf("Sync(%v) = +%d -%d, entries %v; want +%d -%d, %v", step.ips, added, removed, got, step.added, step.removed, step.want)
			}
		}

		// A timed set: Refresh resets the time left, for elements present
		// and new ones alike, and Clear removes only what it names.
		expires := func() map[netip.Addr]time.Duration {
			t.Helper()
			els, err := nft.Elements(fam, nftTable, sets.live.Name())
			must(t, err)
			out := map[netip.Addr]time.Duration{}
			for _, e := range els {
				out[e.Addr] = e.Expires
			}
			return out
		}
		x, y := a("10.96.0.1"), a("10.96.0.2")
		must(t, sets.live.Refresh([]netip.Addr{x}))
		time.Sleep(1500 * time.Millisecond)
		if e := expires()[x]; e <= 0 || e > 4*time.Second {
			t.Errorf("after 1.5s of a 5s timeout: Expires %v", e)
		}
		must(t, sets.live.Refresh([]netip.Addr{x, y, x}))
		for ip, e := range expires() {
			if e <= 4*time.Second || e > 5*time.Second {
				t.Errorf("%s refreshed: Expires %v, want about 5s", ip, e)
			}
		}
		must(t, nft.RefreshElements(fam, nftTable, sets.live.Name(), []netrules.NFTElement{{Addr: y, Timeout: 2 * time.Second}}))
		if e := expires()[y]; e <= 0 || e > 2*time.Second {
			t.Errorf("element with its own 2s timeout: Expires %v", e)
		}
		must(t, sets.live.Clear([]netip.Addr{y, a("10.96.0.3")}))
		if got, err := sets.live.Entries(); err != nil || !slices.Equal(got, []netip.Addr{x}) {
			t.Errorf("after Clear: %v, %v; want %v", got, err, x)
		}
		if err := nft.RefreshElements(fam, nftTable, sets.pods.Name(), []netrules.NFTElement{{Addr: y, Timeout: time.Second}}); err == nil {
			t.Error("an element timeout in a set without timeouts was accepted")
		}
		if err := nft.RefreshElements(fam, nftTable, sets.pods.Name(), []netrules.NFTElement{{Addr: a("fd00::1")}}); err == nil {
			t.Error("an IPv6 element in an IPv4 set was accepted")
		}

		// The attempt set: addr . port elements, read and forgotten.
		p := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
		var els []netrules.NFTElement
		for _, ap := range []netip.AddrPort{p("10.244.0.2:40000"), p("10.244.0.2:40001"), p("10.244.0.3:443")} {
			els = append(els, netrules.NFTElement{Addr: ap.Addr(), Port: ap.Port()})
		}
		must(t, nft.RefreshElements(fam, nftTable, sets.seen.Name(), els))
		must(t, sets.seen.Forget(p("10.244.0.2:40001")))
		must(t, sets.seen.Forget(p("10.244.0.2:40001"))) // gone: not an error
		got, err := sets.seen.Entries()
		must(t, err)
		slices.SortFunc(got, netip.AddrPort.Compare)
		if want := []netip.AddrPort{p("10.244.0.2:40000"), p("10.244.0.3:443")}; !slices.Equal(got, want) {
			t.Errorf("attempts = %v, want %v", got, want)
		}

		// Many elements go in several messages of one batch.
		var many []netip.Addr
		for i := range 3000 {
			many = append(many, netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
		}
		if added, _, err := sets.pods.Sync(many); err != nil || added != len(many) {
			t.Errorf("Sync of %d addresses = %d, %v", len(many), added, err)
		}
		must(t, sets.live.Refresh(many))
		if got, err := sets.live.Entries(); err != nil || len(got) != len(many)+1 {
			t.Errorf("timed set after refreshing %d: %d entries, %v", len(many), len(got), err)
		}
		logTable(t, fam, nftTable)
	})
}

// TestNFTApplyKernel checks Apply's atomicity and its checks: a batch that
// fails in the kernel leaves nothing behind, and a malformed one is refused
// before anything is sent.
func TestNFTApplyKernel(t *testing.T) {
	inNewNetNS(t, func(*netlink.Handle) {
		nft := openNFT(t)
		defer nft.Close()
		const fam = netrules.IPv4
		regular := netrules.NFTChain{Name: "c"}
		for _, tc := range []struct {
			name string
			ops  []netrules.NFTOp
		}{{
			// The kernel refuses a lookup in a missing set: the table and
			// chain before it are not created either.
			name: "lookup of a missing set",
			ops: []netrules.NFTOp{
				{Kind: netrules.NFTAddTable},
				{Kind: netrules.NFTAddChain, Chain: regular},
				{Kind: netrules.NFTAddRule, Chain: regular, Rule: netrules.NFTRule{SrcSet: "missing", Return: true}},
			},
		}, {
			name: "two actions",
			ops: []netrules.NFTOp{
				{Kind: netrules.NFTAddTable},
				{Kind: netrules.NFTAddChain, Chain: regular},
				{Kind: netrules.NFTAddRule, Chain: regular, Rule: netrules.NFTRule{Return: true, Jump: "c"}},
			},
		}, {
			name: "an address of the other family",
			ops: []netrules.NFTOp{
				{Kind: netrules.NFTAddTable},
				{Kind: netrules.NFTAddChain, Chain: regular},
				{Kind: netrules.NFTAddRule, Chain: regular, Rule: netrules.NFTRule{DstAddr: netip.MustParseAddr("fd00::1"), Return: true}},
			},
		}, {
			name: "an interface name too long",
			ops: []netrules.NFTOp{
				{Kind: netrules.NFTAddTable},
				{Kind: netrules.NFTAddChain, Chain: regular},
				{Kind: netrules.NFTAddRule, Chain: regular, Rule: netrules.NFTRule{InIface: "a-very-long-name", Return: true}},
			},
		}} {
			err := nft.Apply(&netrules.NFTTransaction{Family: fam, Table: "t", Ops: tc.ops})
			if err == nil {
				t.Errorf("%s: applied", tc.name)
			}
			if tbl, lerr := nft.ListTable(fam, "t"); lerr != nil || tbl != nil {
				t.Errorf("%s: left table %+v, %v", tc.name, tbl, lerr)
			}
		}
		// A chain in a missing table does not exist.
		err := nft.Apply(&netrules.NFTTransaction{Family: fam, Table: "t", Ops: []netrules.NFTOp{{Kind: netrules.NFTAddChain, Chain: regular}}})
		if !netrules.IsNFTNotExist(err) {
			t.Errorf("chain in a missing table: %v, want not-exist", err)
		}
		// The connection still works after all that.
		must(t, nft.Apply(&netrules.NFTTransaction{Family: fam, Table: "t", Ops: []netrules.NFTOp{
			{Kind: netrules.NFTAddTable}, {Kind: netrules.NFTAddTable}, {Kind: netrules.NFTAddChain, Chain: regular},
			{Kind: netrules.NFTAddRule, Chain: regular, Rule: netrules.NFTRule{InIface: "eth0", Return: true, Note: "n"}},
		}}))
		tbl, err := nft.ListTable(fam, "t")
		must(t, err)
		want := &netrules.NFTTable{Chains: []netrules.NFTChain{{Name: "c", Rules: []netrules.NFTRule{{Note: netrules.NFTRule{InIface: "eth0", Return: true, Note: "n"}.Comment()}}}}}
		if diff := cmp.Diff(want, tbl, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{}, netip.Prefix{})); diff != "" {
			t.Errorf("table (-want +got):\n%s", diff)
		}
	})
}
