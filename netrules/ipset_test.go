package netrules_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// doTestLivenessSet runs the dead-man switch's life cycle against one
// implementation of netrules.IPSet; wait lets time pass for it.
func doTestLivenessSet(t *testing.T, ipset netrules.IPSet, family netrules.Family, vip netip.Addr, wait func(time.Duration)) {
	t.Helper()
	s := netrules.NewLivenessSet(ipset, "KAC-TEST-LIVE", family, 2*time.Second)
	entries := func() []netip.Addr {
		t.Helper()
		got, err := s.Entries()
		must(t, err)
		return got
	}

	// Given no set, Ensure creates it, and a second Ensure adopts it.
	created, err := s.Ensure()
	must(t, err)
	if !created {
		t.Fatal("first Ensure did not create the set")
	}
	created, err = s.Ensure()
	must(t, err)
	if created {
		t.Fatal("second Ensure created the set again")
	}
	// An earlier process's set of the same kind is adopted, entries and all.
	must(t, s.Refresh([]netip.Addr{vip}))
	if created, err = netrules.NewLivenessSet(ipset, "KAC-TEST-LIVE", family, 2*time.Second).Ensure(); err != nil || created {
		t.Fatalf("successor's Ensure = %v, %v; want adoption", created, err)
	}
	if diff := cmp.Diff([]netip.Addr{vip}, entries(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("entries after refresh (-want +got):\n%s", diff)
	}

	// Refreshing resets the timeout: refreshed every second, the entry
	// outlives its 2s timeout.
	for range 3 {
		wait(time.Second)
		must(t, s.Refresh([]netip.Addr{vip}))
	}
	if got := entries(); len(got) != 1 {
		t.Fatalf("refreshed entry expired: %v", got)
	}
	// Left alone, it expires: the kernel enforces the switch.
	wait(3 * time.Second)
	if got := entries(); len(got) != 0 {
		t.Fatalf("entry still there after its timeout: %v", got)
	}

	// Clear deletes at once, and tolerates a missing entry.
	must(t, s.Refresh([]netip.Addr{vip}))
	must(t, s.Clear([]netip.Addr{vip}))
	must(t, s.Clear([]netip.Addr{vip}))
	if got := entries(); len(got) != 0 {
		t.Fatalf("entry still there after Clear: %v", got)
	}

	// An address of the other family is refused.
	other := netip.MustParseAddr("fd00::1")
	if family == netrules.IPv6 {
		other = netip.MustParseAddr("10.96.0.1")
	}
	if err := s.Refresh([]netip.Addr{other}); err == nil {
		t.Errorf("a %s set accepted %s", family, other)
	}

	// Destroy removes it, and tolerates a missing set.
	must(t, s.Destroy())
	must(t, s.Destroy())
	if _, err := s.Entries(); !netrules.IsSetNotExist(err) {
		t.Errorf("Entries after Destroy: %v, want not-exist", err)
	}
	must(t, s.Clear([]netip.Addr{vip}))
}

func TestLivenessSetFake(t *testing.T) {
	for _, tc := range []struct {
		family netrules.Family
		vip    string
	}{{netrules.IPv4, "10.96.0.1"}, {netrules.IPv6, "fd00:10:96::1"}} {
		t.Run(tc.family.String(), func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			doTestLivenessSet(t, fake.NewIPSet(clk), tc.family, netip.MustParseAddr(tc.vip), clk.Step)
		})
	}
}

// TestLivenessSetKernel runs the same life cycle against the kernel, in a
// fresh network namespace, for both families.
func TestLivenessSetKernel(t *testing.T) {
	for _, tc := range []struct {
		family netrules.Family
		vip    string
	}{{netrules.IPv4, "10.96.0.1"}, {netrules.IPv6, "fd00:10:96::1"}} {
		t.Run(tc.family.String(), func(t *testing.T) {
			inNewNetNS(t, func(h *netlink.Handle) {
				doTestLivenessSet(t, h, tc.family, netip.MustParseAddr(tc.vip), time.Sleep)
			})
		})
	}
}

// TestLivenessSetReplacesWrongKind: a set of the same name but another
// family (say, left by a misconfigured run) is replaced, not adopted.
func TestLivenessSetReplacesWrongKind(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	ipset := fake.NewIPSet(clk)
	_, err := netrules.NewLivenessSet(ipset, "LIVE", netrules.IPv6, 5*time.Second).Ensure()
	must(t, err)
	created, err := netrules.NewLivenessSet(ipset, "LIVE", netrules.IPv4, 5*time.Second).Ensure()
	must(t, err)
	if !created {
		t.Fatal("an inet6 set was adopted as inet")
	}
	if diff := cmp.Diff("create LIVE hash:ip family inet timeout 5\n", ipset.Save()); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
}
