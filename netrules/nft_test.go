package netrules_test

import (
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

var (
	nftVIP    = netip.MustParseAddr("10.96.0.1")
	nftListen = netip.MustParseAddrPort("169.254.25.10:10443")
	nftPod    = netip.MustParseAddr("10.244.0.5")
)

// nftSpec is a redirect like the agent's: the mark returns, skipped
// sources return, attempts are recorded, the VIP goes to the listener while
// the liveness set holds it; only this node's pods (the pods set) enter
// from prerouting.
func nftSpec(nft netrules.NFTables) (netrules.NFTRedirectSpec, *netrules.NFTTimedSet, *netrules.NFTTimedSet, *netrules.NFTAddressSet, *netrules.NFTAttemptSet) {
	const table = "kube-apicache"
	live := netrules.NewNFTTimedSet(nft, netrules.IPv4, table, "liveness", 2*time.Second)
	skip := netrules.NewNFTTimedSet(nft, netrules.IPv4, table, "skip", 10*time.Minute)
	pods := netrules.NewNFTAddressSet(nft, netrules.IPv4, table, "pods")
	seen := netrules.NewNFTAttemptSet(nft, netrules.IPv4, table, "seen", 5*time.Second)
	vip := netrules.NFTRule{DstAddr: nftVIP, TCPDstPort: 443, DstSet: live.Name()}
	record, dnat := vip, vip
	record.UpdateSet, record.Note = seen.Name(), "record each redirected connection attempt"
	dnat.DNAT, dnat.Note = nftListen, "the VIP to the agent while it is alive"
	return netrules.NFTRedirectSpec{
		Family:   netrules.IPv4,
		Table:    table,
		Priority: netrules.NFTPriorityDstNAT - 1,
		Chain: netrules.NFTChain{Name: "redirect", Rules: []netrules.NFTRule{
			{MarkMask: 0x4000, Return: true, Note: "own upstream traffic"},
			{SrcSet: skip.Name(), Return: true, Note: "skipped sources go to kube-proxy"},
			record, dnat,
		}},
		Local: netrules.NFTRule{SrcSet: pods.Name()},
		Sets:  []netrules.NFTSet{live.Def(), skip.Def(), pods.Def(), seen.Def()},
	}, live, skip, pods, seen
}

// kubeProxyTable adds a table like kube-proxy's nftables mode: nat
// prerouting and output at dstnat, sending the VIP to kube-apiserver.
func kubeProxyTable(t *testing.T, nft netrules.NFTables) {
	t.Helper()
	tx := &netrules.NFTTransaction{Family: netrules.IPv4, Table: "kube-proxy", Ops: []netrules.NFTOp{{Kind: netrules.NFTAddTable}}}
	for _, hook := range []netrules.NFTHook{netrules.NFTHookPrerouting, netrules.NFTHookOutput} {
		name := "nat-" + string(hook)
		tx.Ops = append(tx.Ops,
			netrules.NFTOp{Kind: netrules.NFTAddChain, Chain: netrules.NFTChain{Name: name, Hook: hook, Priority: netrules.NFTPriorityDstNAT}},
			netrules.NFTOp{Kind: netrules.NFTAddRule, Chain: netrules.NFTChain{Name: name},
				Rule: netrules.NFTRule{DstAddr: nftVIP, TCPDstPort: 443, DNAT: netip.MustParseAddrPort("10.250.0.2:6443")}})
	}
	if err := nft.Apply(tx); err != nil {
		t.Fatal(err)
	}
}

// TestNFTRedirect: the table is written once and then left alone; it runs
// ahead of kube-proxy's nftables table in either registration order; the
// liveness element's expiry, a skipped source and the mark each send the
// VIP to kube-proxy's path; a foreign change is repaired with the
// elements kept; RemoveRules keeps the sets, Remove takes everything.
func TestNFTRedirect(t *testing.T) {
	for _, latestFirst := range []bool{false, true} {
		clk := clocktesting.NewFakeClock(time.Now())
		nft := fake.NewNFTables(clk)
		nft.TieLatestFirst = latestFirst
		spec, live, skip, pods, seen := nftSpec(nft)
		r := netrules.NewNFTRedirect(nft, spec)
		// kube-proxy's table exists before ours in one order, after it
		// in the other: priority decides, not registration.
		if !latestFirst {
			kubeProxyTable(t, nft)
		}
		setCreated, res, err := r.Sync()
		if err != nil || !setCreated || !res.ChainCreated || len(res.JumpsFixed) != 2 {
			t.Fatalf("first sync: %v %+v %v", setCreated, res, err)
		}
		if latestFirst {
			kubeProxyTable(t, nft)
		}
		applies := nft.Applies
		if setCreated, res, err := r.Sync(); err != nil || setCreated || res.Changed() || nft.Applies != applies {
			t.Fatalf("second sync changed something: %v %+v %v", setCreated, res, err)
		}

		mustNFT(t, live.Refresh([]netip.Addr{nftVIP}))
		if _, _, err := pods.Sync([]netip.Addr{nftPod, netip.MustParseAddr("fd00::5")}); err != nil {
			t.Fatal(err)
		}
		podPacket := fake.NFTPacket{Src: netip.AddrPortFrom(nftPod, 40000), InIface: "veth1", Dst: netip.AddrPortFrom(nftVIP, 443)}
		hostPacket := fake.NFTPacket{Dst: netip.AddrPortFrom(nftVIP, 443)}
		other := fake.NFTPacket{Src: netip.MustParseAddrPort("10.244.9.9:40001"), InIface: "eth0", Dst: netip.AddrPortFrom(nftVIP, 443)}
		expect := func(what string, hook netrules.NFTHook, p fake.NFTPacket, wantTable, wantTo string) {
			t.Helper()
			table, to, err := nft.Traverse(netrules.IPv4, hook, p)
			if err != nil || table != wantTable || to != wantTo {
				t.Errorf("latestFirst=%v %s: %s %s %v, want %s %s", latestFirst, what, table, to, err, wantTable, wantTo)
			}
		}
		expect("pod", netrules.NFTHookPrerouting, podPacket, "kube-apicache", nftListen.String())
		expect("host", netrules.NFTHookOutput, hostPacket, "kube-apicache", nftListen.String())
		expect("traffic routed in from elsewhere", netrules.NFTHookPrerouting, other, "kube-proxy", "10.250.0.2:6443")
		marked := hostPacket
		marked.Mark = 0x4000
		expect("the agent's own marked traffic", netrules.NFTHookOutput, marked, "kube-proxy", "10.250.0.2:6443")
		if got, err := seen.Entries(); err != nil || len(got) != 1 || got[0] != podPacket.Src {
			t.Errorf("seen = %v %v, want the pod's attempt", got, err)
		}

		// A foreign change: someone flushes our chain. The next sync
		// rewrites the rules and keeps the elements.
		mustNFT(t, nft.Apply(&netrules.NFTTransaction{Family: netrules.IPv4, Table: "kube-apicache",
			Ops: []netrules.NFTOp{{Kind: netrules.NFTFlushChain, Chain: netrules.NFTChain{Name: "redirect"}}}}))
		if _, res, err := r.Sync(); err != nil || !res.RulesRewritten {
			t.Fatalf("sync after a flush: %+v %v", res, err)
		}
		expect("pod after the repair", netrules.NFTHookPrerouting, podPacket, "kube-apicache", nftListen.String())

		mustNFT(t, skip.Refresh([]netip.Addr{nftPod}))
		expect("skipped pod", netrules.NFTHookPrerouting, podPacket, "kube-proxy", "10.250.0.2:6443")
		mustNFT(t, skip.Clear([]netip.Addr{nftPod}))

		// The dead-man switch: no refresh for the timeout.
		clk.Step(2 * time.Second)
		expect("pod after expiry", netrules.NFTHookPrerouting, podPacket, "kube-proxy", "10.250.0.2:6443")
		expect("host after expiry", netrules.NFTHookOutput, hostPacket, "kube-proxy", "10.250.0.2:6443")

		mustNFT(t, live.Refresh([]netip.Addr{nftVIP}))
		mustNFT(t, r.RemoveRules())
		if present, err := r.Present(); err != nil || present {
			t.Errorf("present after RemoveRules: %v %v", present, err)
		}
		if got, _ := live.Entries(); len(got) != 1 {
			t.Errorf("liveness entries after RemoveRules: %v, want kept", got)
		}
		expect("host without rules", netrules.NFTHookOutput, hostPacket, "kube-proxy", "10.250.0.2:6443")
		mustNFT(t, r.Remove())
		if tables, _ := nft.Tables(netrules.IPv4); len(tables) != 1 || tables[0] != "kube-proxy" {
			t.Errorf("tables after Remove: %v", tables)
		}
		mustNFT(t, live.Clear([]netip.Addr{nftVIP})) // no table: nothing to clear, no error
	}
}

// TestNFTRedirectSpecChange: a new local match rewrites the rules and
// keeps the liveness element; a set whose definition changed is recreated.
func TestNFTRedirectSpecChange(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	nft := fake.NewNFTables(clk)
	spec, live, _, _, _ := nftSpec(nft)
	r := netrules.NewNFTRedirect(nft, spec)
	if _, _, err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	mustNFT(t, live.Refresh([]netip.Addr{nftVIP}))
	spec.Local = netrules.NFTRule{SrcPrefix: netip.MustParsePrefix("10.244.0.0/16")}
	r.SetSpec(spec)
	setCreated, res, err := r.Sync()
	if err != nil || setCreated || !res.RulesRewritten {
		t.Fatalf("sync with a new local match: %v %+v %v", setCreated, res, err)
	}
	if got, _ := live.Entries(); len(got) != 1 {
		t.Errorf("liveness entries after a rules rewrite: %v", got)
	}
	_, to, _ := nft.Traverse(netrules.IPv4, netrules.NFTHookPrerouting, fake.NFTPacket{Src: netip.MustParseAddrPort("10.244.7.7:1"), Dst: netip.AddrPortFrom(nftVIP, 443)})
	if to != nftListen.String() {
		t.Errorf("a cluster-CIDR source went to %q", to)
	}
	// The liveness timeout changed: that set is recreated, empty.
	spec.Sets[0].Timeout = 3 * time.Second
	r.SetSpec(spec)
	if setCreated, _, err := r.Sync(); err != nil || !setCreated {
		t.Fatalf("sync with a new set timeout: %v %v", setCreated, err)
	}
	if got, _ := live.Entries(); len(got) != 0 {
		t.Errorf("a recreated set kept %v", got)
	}
	// A failed transaction changes nothing.
	nft.FailApply = errFake
	spec.Local = netrules.NFTRule{InIface: "cali*"}
	r.SetSpec(spec)
	if _, _, err := r.Sync(); err == nil {
		t.Fatal("sync succeeded with a failing transaction")
	}
}

var errFake = &fakeErr{}

type fakeErr struct{}

func (*fakeErr) Error() string { return "injected failure" }

func mustNFT(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
