package netrules_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// TestSetMatchKernel checks, per family and iptables backend, that a chain
// whose rule matches a liveness set syncs against the real kernel, that the
// set cannot be destroyed while the rule references it, and that removal
// in order (rules, then set) leaves nothing.
func TestSetMatchKernel(t *testing.T) {
	for _, tc := range []struct {
		family  netrules.Family
		backend netrules.Backend
		vip     string
	}{
		{netrules.IPv4, netrules.BackendNFT, "10.96.0.1/32"},
		{netrules.IPv4, netrules.BackendLegacy, "10.96.0.1/32"},
		{netrules.IPv6, netrules.BackendNFT, "fd00:10:96::1/128"},
	} {
		t.Run(tc.family.String()+"-"+string(tc.backend), func(t *testing.T) {
			inNewNetNS(t, func(h *netlink.Handle) {
				ipt, err := netrules.OpenIPTables(tc.backend, tc.family)
				if err != nil {
					t.Skipf("no %s backend here: %v", tc.backend, err)
				}
				set := netrules.NewLivenessSet(h, "KAC-LIVE", tc.family, 5*time.Second)
				chain := netrules.Chain{
					Table: "nat", Name: "KAC-TEST", JumpFrom: []string{"OUTPUT"}, Comment: "kac test",
					Rules: [][]string{{"-d", tc.vip, "-p", "tcp", "-m", "tcp", "--dport", "443",
						"-m", "set", "--match-set", "KAC-LIVE", "dst", "-j", "RETURN"}},
				}
				s := netrules.NewChainSyncer(ipt, chain)
				if _, err := s.Sync(); err == nil {
					t.Fatal("a rule matching a missing set was accepted")
				}
				_, err = set.Ensure()
				must(t, err)
				res, err := s.Sync()
				must(t, err)
				if !res.Changed() {
					t.Error("first sync changed nothing")
				}
				if res, err = s.Sync(); err != nil || res.Changed() {
					t.Errorf("second sync = %+v, %v; want no change", res, err)
				}
				if err := set.Destroy(); !netrules.IsSetInUse(err) {
					t.Errorf("Destroy of a referenced set = %v, want in-use", err)
				}
				lines, err := ipt.List("nat", "KAC-TEST")
				must(t, err)
				if !strings.Contains(strings.Join(lines, "\n"), "--match-set KAC-LIVE dst") {
					t.Errorf("chain lacks the set match:\n%s", strings.Join(lines, "\n"))
				}
				must(t, s.Remove())
				must(t, set.Destroy())
				if present, err := s.Present(); err != nil || present {
					t.Errorf("chain present after Remove: %v, %v", present, err)
				}
			})
		})
	}
}

// TestChainSyncerCoexistsKernel checks against the real kernel (nf_tables
// backend) what TestChainSyncerLeavesTopRuleOfOthers and
// TestChainSyncerUnreadableRules check on the fake: a Felix-like jump
// re-inserted at the top of PREROUTING causes no change, and an nft-native
// rule that iptables cannot print in full does not stop the sync.
func TestChainSyncerCoexistsKernel(t *testing.T) {
	inNewNetNS(t, func(*netlink.Handle) {
		ipt, err := netrules.OpenIPTables(netrules.BackendNFT, netrules.IPv4)
		if err != nil {
			t.Skipf("no nft backend here: %v", err)
		}
		nft, err := exec.LookPath("nft")
		if err != nil {
			t.Skipf("no nft binary: %v", err)
		}
		for _, c := range []string{"KUBE-SERVICES", "cali-PREROUTING"} {
			must(t, ipt.NewChain("nat", c))
		}
		must(t, ipt.Append("nat", "PREROUTING", "-j", "KUBE-SERVICES"))
		if out, err := exec.Command(nft, "add", "rule", "ip", "nat", "PREROUTING", "ip", "daddr", "{", "10.0.0.1,", "10.0.0.2", "}", "counter").CombinedOutput(); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
		s := netrules.NewChainSyncer(ipt, netrules.Chain{
			Table: "nat", Name: "KAC-TEST", JumpFrom: []string{"PREROUTING"}, Comment: "kac test",
			Before: []string{"KUBE-SERVICES"}, Rules: [][]string{{"-d", "10.96.0.1/32", "-j", "RETURN"}},
		})
		_, err = s.Sync()
		must(t, err)
		felix := []string{"-m", "comment", "--comment", "cali:6gwbT8clXdHdC1b1", "-j", "cali-PREROUTING"}
		for i := range 3 {
			if i > 0 {
				must(t, ipt.Delete("nat", "PREROUTING", felix...))
			}
			must(t, ipt.Insert("nat", "PREROUTING", 1, felix...))
			if res, err := s.Sync(); err != nil || res.Changed() {
				t.Fatalf("round %d: sync = %+v, %v; want no change", i, res, err)
			}
		}
		lines, err := ipt.List("nat", "PREROUTING")
		must(t, err)
		got := strings.Join(lines, "\n")
		if i, j := strings.Index(got, "-j KAC-TEST"), strings.Index(got, "-j KUBE-SERVICES"); i < 0 || j < i {
			t.Errorf("our jump is not ahead of kube-proxy's:\n%s", got)
		}
		must(t, s.Remove())
	})
}
