package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The nftables dataplane on the emulated node, whose kube-proxy is
// iptables rules (nf_tables backend) at dstnat: the agent's own table runs
// at dstnat-1, ahead of them.

// nftDataplane is the flag of the scenarios below.
const nftDataplane = "--dataplane=nftables"

// nftState is what the agent's nftables tables (ip and ip6) hold.
type nftState struct {
	// Tables counts the agent's tables; BaseChains, Chains and Rules
	// what they hold; Priorities the base chains' priorities.
	Tables, BaseChains, Chains, Rules int
	Priorities                        []int
	// Sets counts the sets; Live are the liveness set's elements.
	Sets int
	Live []string
}

// readNFTState reads the agent's tables from the node with `nft -j`.
func readNFTState(t *testing.T, ctx context.Context, c *sandbox.Cluster) nftState {
	t.Helper()
	out, err := c.Node.Output(ctx, "nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("decoding nft -j: %v\n%s", err, out)
	}
	var s nftState
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			var o struct {
				Family, Table, Name, Hook string
				Prio                      int
				Elem                      []json.RawMessage
			}
			if kind == "table" {
				var tbl struct{ Name string }
				_ = json.Unmarshal(raw, &tbl)
				if tbl.Name == "kube-apicache" {
					s.Tables++
				}
				continue
			}
			if err := json.Unmarshal(raw, &o); err != nil || o.Table != "kube-apicache" {
				continue
			}
			switch kind {
			case "chain":
				s.Chains++
				if o.Hook != "" {
					s.BaseChains++
					s.Priorities = append(s.Priorities, o.Prio)
				}
			case "rule":
				s.Rules++
			case "set":
				s.Sets++
				if o.Name == "liveness" {
					for _, e := range o.Elem {
						s.Live = append(s.Live, elemValue(e))
					}
				}
			}
		}
	}
	return s
}

// elemValue is a set element's address: a plain string, or the "val" of
// an element with a timeout.
func elemValue(raw json.RawMessage) string {
	var v string
	if json.Unmarshal(raw, &v) == nil {
		return v
	}
	var e struct {
		Elem struct {
			Val string `json:"val"`
		} `json:"elem"`
	}
	_ = json.Unmarshal(raw, &e)
	return e.Elem.Val
}

// TestNFTablesKilledAgentFailsOpen: kill -9 of an agent of the nftables
// dataplane, twice: the kernel expires the element of the table's liveness
// set, and new connections reach kube-apiserver through kube-proxy within
// the same bound as with the iptables dataplane.
func TestNFTablesKilledAgentFailsOpen(t *testing.T) {
	var gaps []time.Duration
	for i, ns := range []string{"e2e-nft-sigkill-1", "e2e-nft-sigkill-2"} {
		gaps = append(gaps, doTestAgentDies(t, ns, syscall.SIGKILL, killGapTarget, nftDataplane))
		if t.Failed() {
			t.Fatalf("kill %d failed", i+1)
		}
	}
	figuref(t, "nftables dataplane, SIGKILL x%d: longest gaps %v (target %v)", len(gaps), gaps, killGapTarget)
}

// TestNFTablesHungAgentFailsOpen: SIGSTOP, then SIGCONT, with the
// nftables dataplane.
func TestNFTablesHungAgentFailsOpen(t *testing.T) {
	gap := doTestAgentDies(t, "e2e-nft-sigstop", syscall.SIGSTOP, livenessTimeout+4*time.Second, nftDataplane)
	figuref(t, "nftables dataplane, SIGSTOP: longest gap %v", gap)
}

// TestNFTablesGracefulHandoff: the rolling replacement with the nftables
// dataplane: no request fails.
func TestNFTablesGracefulHandoff(t *testing.T) {
	doTestGracefulHandoff(t, "e2e-nft-handoff", nftDataplane)
}

// TestNFTablesStartKillCycles: given 100 agents of the nftables dataplane
// started one after the other, each killed with SIGKILL at a random point
// of its start-up or while serving, when a last agent starts, then the
// node holds one table with its two base chains at dstnat-1, the redirect
// chain's four rules and one jump per base chain, its three sets (the
// liveness set with one element) and one address; nothing of the iptables
// dataplane; and the agent answers through the VIP.
func TestNFTablesStartKillCycles(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	startKillCycles(t, ctx, c, "nftables dataplane", func(i int) { checkCycleNFT(t, ctx, c, i) }, nftDataplane)

	a := startAgent(t, ctx, c, nftDataplane)
	got := checkFinalNFT(t, ctx, c)
	client := newClientPod(t, ctx, c, "e2e-nft-cycles", "client")
	before := forwarded(t, ctx, a)
	quick, cancelQuick := context.WithTimeout(ctx, 20*time.Second)
	defer cancelQuick()
	mustKubectl(t, quick, client, "get", "configmaps")
	if after := forwarded(t, ctx, a); after <= before {
		t.Errorf("request through the VIP not forwarded by the agent (%v -> %v)", before, after)
	}
	figuref(t, "nftables dataplane, final state: %+v", got)
}

// TestDataplaneSwitch: given the iptables dataplane's redirect left on the
// node by a SIGKILLed agent, when an agent starts with --dataplane=auto on
// this node (iptables uses the nf_tables backend), then it runs the
// nftables dataplane, says so and why on /readyz, and removes the iptables
// redirect, chain and sets: one redirect. And back: an agent with
// --dataplane=iptables removes the table.
func TestDataplaneSwitch(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	old := startAgent(t, ctx, c)
	if nat, _, _ := c.NodeNetState(ctx); !strings.Contains(nat, sandbox.AgentChain) {
		t.Fatalf("the iptables agent's chain is not there:\n%s", nat)
	}
	_ = old.Process.Signal(syscall.SIGKILL)
	_ = old.Process.Wait(10 * time.Second)

	a := startAgent(t, ctx, c, "--dataplane=auto")
	code, body, err := agentEndpoint(ctx, c, "/readyz")
	if code != http.StatusOK || !strings.Contains(body, "dataplane nftables (auto: iptables uses the nf_tables backend)") {
		t.Errorf("/readyz = %d %q (%v), want the nftables dataplane and why", code, body, err)
	}
	figuref(t, "dataplane switch: /readyz says %q", body)
	nat, _, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) {
		t.Errorf("the iptables redirect is still there next to the nftables one:\n%s", nat)
	}
	if sets, _ := c.NodeSets(ctx); strings.Contains(sets, sandbox.AgentLivenessSet) {
		t.Errorf("the iptables dataplane's sets are still there:\n%s", sets)
	}
	if st := readNFTState(t, ctx, c); st.BaseChains != 2 || !slices.Equal(st.Live, []string{sandbox.ServiceVIP}) {
		t.Errorf("nftables state %+v, want the redirect with the VIP alive", st)
	}
	_ = a.Process.Signal(syscall.SIGKILL)
	_ = a.Process.Wait(10 * time.Second)

	back := startAgent(t, ctx, c, "--dataplane=iptables")
	if st := readNFTState(t, ctx, c); st.Tables != 0 {
		t.Errorf("the nftables table is still there next to the iptables redirect: %+v", st)
	}
	if got := readNodeState(t, ctx, c); got.Chains != 1 || got.Entries != 1 {
		t.Errorf("iptables state %+v, want the redirect with the VIP alive", got)
	}
	back.Process.Stop(40 * time.Second)
	assertNoAgentState(t, ctx, c)
}

// checkCycleNFT fails the test if the nftables dataplane's state was
// duplicated by cycle i.
func checkCycleNFT(t *testing.T, ctx context.Context, c *sandbox.Cluster, i int) {
	t.Helper()
	if s := readNFTState(t, ctx, c); s.Tables > 1 || s.Chains > 3 || s.Rules > 6 || s.Sets > 3 || len(s.Live) > 1 {
		t.Fatalf("cycle %d: duplicated state: %+v", i, s)
	}
}

// checkFinalNFT fails the test unless the node holds exactly one running
// agent's nftables dataplane: one table with its two base chains at
// dstnat-1, the redirect chain's rules, three sets with the VIP alive, one
// listen address, and nothing of the iptables dataplane.
func checkFinalNFT(t *testing.T, ctx context.Context, c *sandbox.Cluster) nftState {
	t.Helper()
	got := readNFTState(t, ctx, c)
	want := nftState{Tables: 1, BaseChains: 2, Chains: 3, Rules: 6, Priorities: []int{-101, -101}, Sets: 3, Live: []string{sandbox.ServiceVIP}}
	if got.Tables != want.Tables || got.BaseChains != want.BaseChains || got.Chains != want.Chains || got.Rules != want.Rules ||
		!slices.Equal(got.Priorities, want.Priorities) || got.Sets != want.Sets || !slices.Equal(got.Live, want.Live) {
		ruleset, _ := c.Node.Output(ctx, "nft", "list", "ruleset")
		t.Fatalf("nftables state after the cycles = %+v, want %+v\n%s", got, want, ruleset)
	}
	nat, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) {
		t.Errorf("the iptables dataplane's chain is on the node next to the table:\n%s", nat)
	}
	if n := strings.Count(addrs, " "+sandbox.AgentListenIP+"/"); n != 1 {
		t.Errorf("%d listen addresses, want 1:\n%s", n, addrs)
	}
	return got
}
