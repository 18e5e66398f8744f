package netrules_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

func testChain() netrules.Chain {
	return netrules.Chain{
		Table: "nat",
		Name:  "TEST-CHAIN",
		Rules: [][]string{
			{"-m", "mark", "--mark", "0x1000/0x1000", "-j", "RETURN"},
			{"-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", "169.254.25.10:10443"},
		},
		JumpFrom: []string{"PREROUTING", "OUTPUT"},
		Comment:  "test chain",
		Before:   []string{"KUBE-SERVICES"},
	}
}

const wantSynced = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:TEST-CHAIN - [0:0]
-A PREROUTING -m comment --comment "test chain" -j TEST-CHAIN
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -m comment --comment "test chain" -j TEST-CHAIN
-A OUTPUT -j KUBE-SERVICES
-A TEST-CHAIN -m mark --mark 0x1000/0x1000 -j RETURN
-A TEST-CHAIN -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 169.254.25.10:10443
COMMIT
`

const wantRemoved = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
COMMIT
`

// withKubeProxy returns a fake holding kube-proxy's entry jumps, as on a node.
func withKubeProxy(t *testing.T) *fake.IPTables {
	t.Helper()
	ipt := fake.NewIPTables()
	must(t, ipt.NewChain("nat", "KUBE-SERVICES"))
	must(t, ipt.Append("nat", "PREROUTING", "-j", "KUBE-SERVICES"))
	must(t, ipt.Append("nat", "OUTPUT", "-j", "KUBE-SERVICES"))
	return ipt
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestChainSyncer(t *testing.T) {
	tests := []struct {
		name string
		// before mutates the synced state, as an operator or another
		// process might, before the second sync.
		before      func(t *testing.T, ipt *fake.IPTables)
		wantChanged bool
	}{{
		// Nothing changed: the second sync is a no-op.
		name:   "idempotent",
		before: func(*testing.T, *fake.IPTables) {},
	}, {
		// Our jump was moved behind kube-proxy's.
		name: "jump no longer first",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Delete("nat", "PREROUTING", "1"))
			must(t, ipt.Append("nat", "PREROUTING", "-m", "comment", "--comment", "test chain", "-j", "TEST-CHAIN"))
		},
		wantChanged: true,
	}, {
		// Someone deleted our jump from OUTPUT.
		name: "jump deleted",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Delete("nat", "OUTPUT", "1"))
		},
		wantChanged: true,
	}, {
		// The whole chain and its jumps were removed by hand.
		name: "chain deleted",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Delete("nat", "OUTPUT", "1"))
			must(t, ipt.Delete("nat", "PREROUTING", "1"))
			must(t, ipt.ClearChain("nat", "TEST-CHAIN"))
			must(t, ipt.DeleteChain("nat", "TEST-CHAIN"))
		},
		wantChanged: true,
	}, {
		// A rule inside our chain was edited.
		name: "rule edited",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Delete("nat", "TEST-CHAIN", "1"))
			must(t, ipt.Append("nat", "TEST-CHAIN", "-j", "RETURN"))
		},
		wantChanged: true,
	}, {
		// Rules reordered inside our chain.
		name: "rules reordered",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Delete("nat", "TEST-CHAIN", "1"))
			must(t, ipt.Append("nat", "TEST-CHAIN", "-m", "mark", "--mark", "0x1000/0x1000", "-j", "RETURN"))
		},
		wantChanged: true,
	}, {
		// Duplicate jumps (say, from an older version) are collapsed to one.
		name: "duplicate jumps",
		before: func(t *testing.T, ipt *fake.IPTables) {
			must(t, ipt.Append("nat", "PREROUTING", "-j", "TEST-CHAIN"))
			must(t, ipt.Insert("nat", "OUTPUT", 2, "-m", "comment", "--comment", "old", "-j", "TEST-CHAIN"))
		},
		wantChanged: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ipt := withKubeProxy(t)
			s := netrules.NewChainSyncer(ipt, testChain())
			res, err := s.Sync()
			must(t, err)
			if !res.Changed() {
				t.Errorf("first sync reported no change")
			}
			if diff := cmp.Diff(wantSynced, ipt.Save("nat")); diff != "" {
				t.Fatalf("after first sync (-want +got):\n%s", diff)
			}
			tc.before(t, ipt)
			calls := ipt.Calls
			res, err = s.Sync()
			must(t, err)
			if res.Changed() != tc.wantChanged {
				t.Errorf("second sync changed = %v (%+v), want %v", res.Changed(), res, tc.wantChanged)
			}
			if !tc.wantChanged && ipt.Calls != calls {
				t.Errorf("no-op sync made %d mutating calls", ipt.Calls-calls)
			}
			if diff := cmp.Diff(wantSynced, ipt.Save("nat")); diff != "" {
				t.Fatalf("after second sync (-want +got):\n%s", diff)
			}
			must(t, s.Remove())
			if diff := cmp.Diff(wantRemoved, ipt.Save("nat")); diff != "" {
				t.Fatalf("after remove (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChainSyncerLeavesTopRuleOfOthers checks that a component that keeps
// its own jump first in PREROUTING and OUTPUT, as Calico's Felix re-inserts
// its chains' jumps at the top every time it syncs, and the agent do not
// move each other: with our jump still ahead of kube-proxy's, a sync
// changes nothing however often the other rule is re-inserted above it.
func TestChainSyncerLeavesTopRuleOfOthers(t *testing.T) {
	ipt := withKubeProxy(t)
	must(t, ipt.NewChain("nat", "cali-PREROUTING"))
	s := netrules.NewChainSyncer(ipt, testChain())
	_, err := s.Sync()
	must(t, err)
	felix := []string{"-m", "comment", "--comment", "cali:6gwbT8clXdHdC1b1", "-j", "cali-PREROUTING"}
	for i := range 5 {
		for _, from := range []string{"PREROUTING", "OUTPUT"} {
			if i > 0 {
				must(t, ipt.Delete("nat", from, felix...))
			}
			must(t, ipt.Insert("nat", from, 1, felix...))
		}
		calls := ipt.Calls
		res, err := s.Sync()
		must(t, err)
		if res.Changed() || ipt.Calls != calls {
			t.Fatalf("round %d: sync changed %+v with %d mutating calls, want none", i, res, ipt.Calls-calls)
		}
	}
	want := `-A PREROUTING -m comment --comment cali:6gwbT8clXdHdC1b1 -j cali-PREROUTING
-A PREROUTING -m comment --comment "test chain" -j TEST-CHAIN
-A PREROUTING -j KUBE-SERVICES
`
	if got := ruleLines(ipt.Save("nat"), "PREROUTING"); got != want {
		t.Errorf("PREROUTING:\n%s\nwant:\n%s", got, want)
	}
	// kube-proxy re-inserting its jump at the top is another matter: ours
	// must move ahead of it again.
	must(t, ipt.Insert("nat", "PREROUTING", 1, "-j", "KUBE-SERVICES"))
	must(t, ipt.Delete("nat", "PREROUTING", "4"))
	res, err := s.Sync()
	must(t, err)
	if !slices.Equal(res.JumpsFixed, []string{"PREROUTING"}) {
		t.Errorf("jumps fixed = %v, want [PREROUTING]", res.JumpsFixed)
	}
	want = `-A PREROUTING -m comment --comment "test chain" -j TEST-CHAIN
-A PREROUTING -j KUBE-SERVICES
-A PREROUTING -m comment --comment cali:6gwbT8clXdHdC1b1 -j cali-PREROUTING
`
	if got := ruleLines(ipt.Save("nat"), "PREROUTING"); got != want {
		t.Errorf("PREROUTING after kube-proxy moved ahead:\n%s\nwant:\n%s", got, want)
	}
}

// TestChainSyncerUnreadableRules checks that rules of others that this
// package cannot read back (iptables-nft prints an nft-native rule as a
// bare "-A CHAIN"; a broken quote stands for worse) do not stop the sync of
// the agent's own chain and jumps.
func TestChainSyncerUnreadableRules(t *testing.T) {
	ipt := withKubeProxy(t)
	for _, from := range []string{"PREROUTING", "OUTPUT", "KUBE-SERVICES"} {
		ipt.AppendRaw("nat", from, "")
		ipt.AppendRaw("nat", from, `-d 10.0.0.1 "unterminated -j`)
	}
	s := netrules.NewChainSyncer(ipt, testChain())
	for i := range 2 {
		res, err := s.Sync()
		must(t, err)
		if res.Changed() != (i == 0) {
			t.Errorf("sync %d changed = %v", i, res.Changed())
		}
	}
	for _, from := range []string{"PREROUTING", "OUTPUT"} {
		if got := strings.SplitN(ruleLines(ipt.Save("nat"), from), "\n", 2)[0]; !strings.Contains(got, "-j TEST-CHAIN") {
			t.Errorf("first rule of %s = %q, want our jump", from, got)
		}
	}
}

// ruleLines returns the "-A chain" lines of an iptables-save text.
func ruleLines(save, chain string) string {
	var b strings.Builder
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-A "+chain+" ") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestChainSyncerAdoptsEarlierInstance checks that a new process takes over
// the state a killed one left behind without duplicating anything.
func TestChainSyncerAdoptsEarlierInstance(t *testing.T) {
	ipt := withKubeProxy(t)
	for range 3 {
		s := netrules.NewChainSyncer(ipt, testChain())
		_, err := s.Sync()
		must(t, err)
		// The process dies here without calling Remove.
	}
	if diff := cmp.Diff(wantSynced, ipt.Save("nat")); diff != "" {
		t.Fatalf("after restarts (-want +got):\n%s", diff)
	}
}

// TestChainSyncerRemoveMissing checks that removing state that is not there
// is not an error, so teardown can always run.
func TestChainSyncerRemoveMissing(t *testing.T) {
	ipt := withKubeProxy(t)
	must(t, netrules.NewChainSyncer(ipt, testChain()).Remove())
	if diff := cmp.Diff(wantRemoved, ipt.Save("nat")); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// TestSplitQuoted checks the tokenizer against iptables -S quoting.
func TestSplitQuoted(t *testing.T) {
	line := `-A PREROUTING -m comment --comment "kube-apicache: say \"hi\" -j X" -c 10 20 -j KUBE-APICACHE`
	got := netrules.ParseRuleForTest(line)
	want := []string{"-m", "comment", "--comment", `kube-apicache: say "hi" -j X`, "-j", "KUBE-APICACHE"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
