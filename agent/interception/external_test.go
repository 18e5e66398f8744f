package interception

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// TestBindAddresses checks where the listeners bind: at the listen
// addresses with a dataplane of the agent's own, on every address at their
// ports with the external one.
func TestBindAddresses(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")
	for _, tc := range []struct {
		name      string
		dataplane string
		vips      []netip.Addr
		listen6   string
		want      []string
	}{
		// Interception binds the link-local listen address the VIP is
		// DNATed to.
		{name: "iptables", dataplane: DataplaneIPTables, vips: []netip.Addr{v4}, want: []string{DefaultListenAddress}},
		// External binds every address of the namespace at the port.
		{name: "external IPv4", dataplane: DataplaneExternal, vips: []netip.Addr{v4}, want: []string{"0.0.0.0:10443"}},
		// One dual-stack wildcard listener serves both families when
		// their ports are the same.
		{name: "external dual-stack, one port", dataplane: DataplaneExternal, vips: []netip.Addr{v4, v6}, want: []string{"0.0.0.0:10443"}},
		// Different ports need a listener each.
		{name: "external dual-stack, two ports", dataplane: DataplaneExternal, vips: []netip.Addr{v4, v6}, listen6: "[fd00::10]:10444",
			want: []string{"0.0.0.0:10443", "[::]:10444"}},
		// An IPv6-only cluster binds the IPv6 wildcard.
		{name: "external IPv6", dataplane: DataplaneExternal, vips: []netip.Addr{v6}, want: []string{"[::]:10443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			c.Dataplane = tc.dataplane
			c.ServiceVIPs = tc.vips
			if tc.listen6 != "" {
				c.ListenAddressIPv6 = netip.MustParseAddrPort(tc.listen6)
			}
			var got []string
			for _, ap := range c.BindAddresses() {
				got = append(got, ap.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("BindAddresses (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExternalProgramsNothing: with the external dataplane the agent
// adds no address, set, chain or table to the node, and removes the
// redirect an agent of the iptables dataplane left there.
func TestExternalProgramsNothing(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	k := newFakeKernel(t)
	natBefore := k.ipt.Save("nat")
	ep := newTestEndpoint(t, ok)

	// Given the redirect of an iptables-dataplane agent that died.
	old, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneIPTables })
	if notReady, err := old.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("predecessor's sync = %v, %v", notReady, err)
	}
	if k.ipt.Save("nat") == natBefore {
		t.Fatal("the predecessor installed no redirect")
	}
	addrsBefore := k.nl.Addresses()

	// When an agent of the external dataplane syncs.
	a, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneExternal })
	if name, _ := a.icpt.Dataplane(); name != DataplaneExternal {
		t.Fatalf("dataplane %q, want %q", name, DataplaneExternal)
	}
	a.icpt.syncOrStepAside(ctx)

	// Then only kube-proxy's rules are left, and nothing is added.
	if diff := cmp.Diff(natBefore, k.ipt.Save("nat")); diff != "" {
		t.Errorf("nat (-kube-proxy's +after):\n%s", diff)
	}
	if got := k.ipset.Save(); got != "" {
		t.Errorf("sets left:\n%s", got)
	}
	for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
		if tables, _ := k.nft.Tables(f); len(tables) != 0 {
			t.Errorf("nftables tables of family %v: %v", f, tables)
		}
	}
	if diff := cmp.Diff(addrsBefore, k.nl.Addresses()); diff != "" {
		t.Errorf("addresses changed (-before +after):\n%s", diff)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready = %v, want nil", err)
	}
	if err := a.Intercepting(); err != nil {
		t.Errorf("Intercepting = %v, want nil", err)
	}
	if got := a.icpt.VIPs(); len(got) != 1 {
		t.Errorf("VIPs = %v, want the configured VIP (degraded mode probes it)", got)
	}
	if steerable, _ := a.icpt.SkipSource(netip.MustParseAddr("10.244.0.5")); steerable {
		t.Error("SkipSource steered a source without a skip set")
	}

	// And when it stops, it still touches nothing.
	if !a.icpt.Stop(klog.Background()) {
		t.Error("Stop reported a redirect it could not remove")
	}
	if diff := cmp.Diff(natBefore, k.ipt.Save("nat")); diff != "" {
		t.Errorf("nat after stop (-kube-proxy's +after):\n%s", diff)
	}
}

// TestExternalReadinessIsTheSwitch: with the external dataplane the
// agent is ready exactly while it would intercept with a dataplane of its
// own, since the platform's redirect follows readiness alone.
func TestExternalReadinessIsTheSwitch(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	a, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) { c.Dataplane = DataplaneExternal })
	sync := func() { a.icpt.syncOrStepAside(ctx) }
	wantReady := func(step string, want bool, because string) {
		t.Helper()
		err := a.Ready()
		switch {
		case want && err != nil:
			t.Errorf("%s: Ready = %v, want nil", step, err)
		case !want && err == nil:
			t.Errorf("%s: Ready = nil, want not ready", step)
		case !want && !strings.Contains(err.Error(), because):
			t.Errorf("%s: Ready = %v, want it to say %q", step, err, because)
		}
		if got, wantGauge := testutil.ToFloat64(a.metrics.ready), map[bool]float64{true: 1, false: 0}[want]; got != wantGauge {
			t.Errorf("%s: ready gauge %v, want %v", step, got, wantGauge)
		}
	}

	// Given a healthy agent, when it syncs, then it is ready.
	sync()
	wantReady("healthy", true, "")

	// When no upstream is healthy, then it is not ready, so that the
	// platform's redirect leaves it.
	ep.sick.Store(true)
	sync()
	wantReady("upstream down", false, "no healthy upstream endpoint")
	ep.sick.Store(false)
	sync()
	wantReady("upstream back", true, "")

	// When the warm-up (or the certificate) is not done, then not ready.
	a.setHealthErr(errString("waiting for the pinned resources"))
	sync()
	wantReady("warming up", false, "waiting for the pinned resources")
	a.setHealthErr(nil)
	sync()
	wantReady("warmed up", true, "")

	// When the kill switch is turned on, then not ready.
	a.SetInterception(false, "test")
	sync()
	wantReady("switched off", false, "interception turned off")
	a.SetInterception(true, "test")
	sync()
	wantReady("switched on", true, "")

	// When the Service does not hold the configured VIP, then not ready.
	a.icpt.service.Store(&serviceCheck{read: true, mismatch: "VIP is not the Service's"})
	sync()
	wantReady("wrong VIP", false, "VIP is not the Service's")
	a.icpt.service.Store(&serviceCheck{read: true})
	sync()
	wantReady("right VIP", true, "")

	// When shutdown starts, then not ready before anything closes.
	a.icpt.Stop(klog.Background())
	wantReady("stopped", false, "shutting down")
}

type errString string

func (e errString) Error() string { return string(e) }
