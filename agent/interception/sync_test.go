package interception

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// newSyncTestAgent returns an agent over the fake kernel k whose listener
// is a real TLS server on loopback. The "VIP" is that listener's address, so
// the self-check's connection lands on it without NAT (the fake kernel does
// not carry packets), and the upstream is ep.
func newSyncTestAgent(t *testing.T, k *fakeKernel, ep *testEndpoint) (*testAgent, netip.AddrPort) {
	t.Helper()
	return newSyncTestAgentWith(t, k, ep, nil)
}

// newSyncTestAgentWith is newSyncTestAgent with edit applied to the
// configuration before the dataplanes are built.
func newSyncTestAgentWith(t *testing.T, k *fakeKernel, ep *testEndpoint, edit func(*Config)) (*testAgent, netip.AddrPort) {
	t.Helper()
	a := newTestAgent(ep)
	listener := httptest.NewUnstartedServer(http.NotFoundHandler())
	listener.TLS = &tls.Config{GetCertificate: a.getCertificate}
	listener.StartTLS()
	t.Cleanup(listener.Close)
	ap := netip.MustParseAddrPort(listener.Listener.Addr().String())

	cfg := dataplaneConfig()
	cfg.ListenAddress = ap
	cfg.ServiceVIPs = []netip.Addr{ap.Addr()}
	cfg.ServicePort = ap.Port()
	if edit != nil {
		edit(cfg)
	}
	wireTestAgent(t, a, cfg, k)
	return a, ap
}

// wireTestAgent completes a test agent: cfg and its interceptor over the
// fake kernel k, with the kubernetes Service read and matching the
// configuration (TestServiceCheck covers the other cases).
func wireTestAgent(t *testing.T, a *testAgent, cfg *Config, k *fakeKernel) {
	t.Helper()
	a.cfg = cfg
	var err error
	if a.icpt, err = New(cfg, k.kernel(), a.Deps()); err != nil {
		t.Fatal(err)
	}
	a.icpt.service.Store(&serviceCheck{read: true})
}

// TestSync drives the agent's one reconciliation against the stateful fakes:
// it installs address, set, chain and entry only when healthy, repairs what
// was changed behind its back, pulls the entry as soon as the upstream is
// unhealthy, and leaves nothing behind when removed.
func TestSync(t *testing.T) {
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	a, vip := newSyncTestAgent(t, k, ep)
	ctx := context.Background()
	route := func() string {
		t.Helper()
		to, err := k.ipt.Traverse("PREROUTING", fake.Packet{Dst: vip})
		mustDo(t, err)
		return to
	}
	syncOK := func(step string) {
		t.Helper()
		notReady, err := a.icpt.sync(ctx)
		if err != nil || notReady != nil {
			t.Fatalf("%s: sync = %v, %v; want ready", step, notReady, err)
		}
	}
	natBefore := k.ipt.Save("nat")

	// Given a healthy agent, when it syncs, then the VIP goes to it.
	syncOK("first sync")
	if got := route(); got != vip.String() {
		t.Fatalf("VIP goes to %q, want the agent at %s", got, vip)
	}
	if diff := cmp.Diff([]string{"kube-apicache0 " + vip.Addr().String() + "/32"}, k.nl.Addresses()); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	want := k.ipt.Save("nat")
	calls := k.ipt.Calls
	syncOK("second sync")
	if k.ipt.Calls != calls {
		t.Errorf("a sync of a correct state made %d iptables changes", k.ipt.Calls-calls)
	}

	// When someone deletes the jump and the entry, then one sync restores
	// both.
	mustDo(t, k.ipt.Delete("nat", "PREROUTING", "1"))
	mustDo(t, a.icpt.planes[0].clear())
	if got := route(); got == vip.String() {
		t.Fatal("tampering had no effect")
	}
	syncOK("repair")
	if diff := cmp.Diff(want, k.ipt.Save("nat")); diff != "" {
		t.Errorf("not repaired (-want +got):\n%s", diff)
	}
	if got := route(); got != vip.String() {
		t.Errorf("after repair the VIP goes to %q", got)
	}
	if got := testutil.ToFloat64(a.metrics.ruleSyncs.WithLabelValues("repaired")); got != 2 {
		t.Errorf("repaired syncs = %v, want 2 (install, repair)", got)
	}
	if got := testutil.ToFloat64(a.icpt.metrics.selfChecks.WithLabelValues("ok")); got != 3 {
		t.Errorf("self-checks ok = %v, want 3", got)
	}

	// When the upstream fails its health check, then the entry goes at
	// once and the agent says why it is not ready; the rules stay.
	ep.sick.Store(true)
	notReady, err := a.icpt.sync(ctx)
	if err != nil || notReady == nil || !strings.Contains(notReady.Error(), "unhealthy") {
		t.Fatalf("sync with a sick upstream = %v, %v; want not ready (unhealthy)", notReady, err)
	}
	if got := route(); got == vip.String() {
		t.Errorf("unhealthy agent still gets the VIP")
	}
	if !strings.Contains(k.ipt.Save("nat"), "-j KUBE-APICACHE") {
		t.Errorf("rules removed for an unhealthy agent; only its entry should go")
	}
	ep.sick.Store(false)
	syncOK("recovered")

	// When the agent goes away cleanly, then only kube-proxy's rules are
	// left.
	a.icpt.RemoveStale()
	if diff := cmp.Diff(natBefore, k.ipt.Save("nat")); diff != "" {
		t.Errorf("nat after removal (-before +after):\n%s", diff)
	}
	if got := k.ipset.Save(); got != "" {
		t.Errorf("sets left:\n%s", got)
	}
	if got := k.nl.Addresses(); len(got) != 0 {
		t.Errorf("addresses left: %v", got)
	}
}

// stallingIPTables is a fake whose List blocks while stall is open: an
// iptables call stuck behind a huge nat table or someone's xtables lock.
type stallingIPTables struct {
	*fake.IPTables
	stall chan struct{}
}

func (s *stallingIPTables) List(table, chain string) ([]string, error) {
	<-s.stall
	return s.IPTables.List(table, chain)
}

// TestLivenessNotBehindSync checks that a sync stuck in iptables for longer
// than the liveness timeout does not hold back the liveness refresher: the
// entry of a healthy agent keeps being refreshed, so interception does not
// flap while netfilter is slow.
func TestLivenessNotBehindSync(t *testing.T) {
	k, _, a := newLivenessTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("first sync = %v, %v", notReady, err)
	}
	// Given an intercepting agent whose next sync stalls in iptables for
	// three liveness timeouts,
	stall := &stallingIPTables{IPTables: k.ipt, stall: make(chan struct{})}
	d := a.icpt.planes[0]
	ir := d.rules.(*iptablesRules)
	ir.chain = netrules.NewChainSyncer(stall, redirectChain(a.cfg, livenessSetName(a.cfg, d.family), d.vips, d.listen, ir.local, "", ""))
	go a.icpt.runLiveness(ctx)
	synced := make(chan error, 1)
	go func() { synced <- a.icpt.syncAndReport(ctx) }()
	refreshed := a.icpt.metrics.liveness.WithLabelValues("refreshed")
	before := testutil.ToFloat64(refreshed)
	time.Sleep(3 * a.cfg.LivenessTimeout)
	// then the refresher went on meanwhile (about every 250 ms),
	during := testutil.ToFloat64(refreshed) - before
	close(stall.stall)
	if err := <-synced; err != nil {
		t.Fatalf("stalled sync: %v", err)
	}
	if during < 4 {
		t.Errorf("liveness refreshed %v times while a sync stalled for %s, want at least 4", during, 3*a.cfg.LivenessTimeout)
	}
	// and the agent still intercepts.
	if err := a.Intercepting(); err != nil {
		t.Errorf("not ready after the stalled sync: %v", err)
	}
}

// TestReadiness checks what /readyz, /healthz and /intercepting mean: ready
// once the first sync has decided, whether or not the agent intercepts (a
// node where it steps aside must not stop a rollout); not ready while
// starting, shutting down or with a stuck sync loop, which also fails
// /healthz.
func TestReadiness(t *testing.T) {
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	a, _ := newSyncTestAgent(t, k, ep)
	a.icpt.notIntercepting = errors.New("starting")
	a.cfg.SyncPeriod = 10 * time.Second
	ctx := context.Background()
	now := time.Now()
	a.now = func() time.Time { return now }
	a.icpt.now = a.now

	// Given an agent that has not synced yet, it is not ready.
	if err := a.Ready(); err == nil {
		t.Fatal("ready before the first sync")
	}
	// When its upstream is down at the first sync, it steps aside and is
	// ready, not intercepting.
	ep.sick.Store(true)
	a.icpt.syncOrStepAside(ctx)
	if err := a.Ready(); err != nil {
		t.Errorf("not ready after stepping aside: %v", err)
	}
	if err := a.Intercepting(); err == nil || !strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("Intercepting() = %v, want unhealthy", err)
	}
	if got := testutil.ToFloat64(a.metrics.intercepting); got != 0 {
		t.Errorf("kube_apicache_intercepting = %v, want 0", got)
	}
	// When the upstream recovers, it intercepts.
	ep.sick.Store(false)
	a.icpt.syncOrStepAside(ctx)
	if err := errors.Join(a.Ready(), a.Intercepting()); err != nil {
		t.Errorf("after recovery: %v", err)
	}
	// When no sync finishes for three periods and two minutes, the loop
	// is stuck: neither ready nor healthy.
	now = now.Add(a.icpt.syncStuckAfter() + time.Second)
	if err := a.Healthy(); err == nil || !strings.Contains(err.Error(), "sync loop stuck") {
		t.Errorf("Healthy() with a stuck loop = %v", err)
	}
	if err := a.Ready(); err == nil {
		t.Error("ready with a stuck loop")
	}
	a.icpt.syncOrStepAside(ctx)
	if err := a.Healthy(); err != nil {
		t.Errorf("Healthy() after a sync = %v", err)
	}
	// When shutdown begins, it is no longer ready.
	a.icpt.setStopping()
	if err := a.Ready(); err == nil {
		t.Error("ready while shutting down")
	}
	a.icpt.RemoveStale()
}

// TestDetectLocal checks, per --detect-local-mode, that VIP traffic of this
// node's own pods and of the host goes to the agent while VIP traffic
// routed in from elsewhere (a BGP-advertised Service CIDR) keeps going to
// kube-proxy, and that PodIPs follows the node's pods as they come and go.
func TestDetectLocal(t *testing.T) {
	localPod := fake.Packet{Src: netip.MustParseAddr("10.244.1.5"), InIface: "cali1234"}
	bridged := fake.Packet{Src: netip.MustParseAddr("10.244.1.6"), InIface: "cni0"}
	routedIn := fake.Packet{Src: netip.MustParseAddr("192.0.2.9"), InIface: "eth0"}
	for _, tc := range []struct {
		mode string
		edit func(*Config)
		// wantLocal and wantBridged say whether those sources are taken;
		// routed-in traffic never is, except with None.
		wantLocal, wantBridged, wantRoutedIn bool
	}{
		{mode: DetectLocalPodIPs, wantLocal: true},
		{mode: DetectLocalClusterCIDR, edit: func(c *Config) { c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")} }, wantLocal: true, wantBridged: true},
		{mode: DetectLocalNodeCIDR, wantLocal: true, wantBridged: true},
		{mode: DetectLocalBridgeInterface, edit: func(c *Config) { c.PodBridgeInterface = "cni0" }, wantBridged: true},
		{mode: DetectLocalInterfaceNamePrefix, edit: func(c *Config) { c.PodInterfaceNamePrefix = "cali" }, wantLocal: true},
		{mode: DetectLocalNone, wantLocal: true, wantBridged: true, wantRoutedIn: true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			k := newFakeKernel(t)
			ep := newTestEndpoint(t, ok)
			a, vip := newSyncTestAgentWith(t, k, ep, func(c *Config) {
				c.DetectLocalMode = tc.mode
				if tc.edit != nil {
					tc.edit(c)
				}
			})
			mustDo(t, a.cfg.ValidateDetectLocal())
			ctx := context.Background()
			a.icpt.local.set("default/local", []netip.Addr{localPod.Src}, false)
			if tc.mode == DetectLocalNodeCIDR {
				notReady, err := a.icpt.sync(ctx)
				if err != nil || notReady == nil || !strings.Contains(notReady.Error(), "podCIDRs") {
					t.Fatalf("sync before the Node's podCIDRs are known = %v, %v; want not intercepting", notReady, err)
				}
				a.icpt.local.cidrs, a.icpt.local.cidrErr = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, nil
			}
			if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
				t.Fatalf("sync = %v, %v", notReady, err)
			}
			goesToAgent := func(p fake.Packet) bool {
				t.Helper()
				p.Dst = vip
				to, err := k.ipt.Traverse("PREROUTING", p)
				mustDo(t, err)
				return to == vip.String()
			}
			for _, c := range []struct {
				name string
				p    fake.Packet
				want bool
			}{{"local pod", localPod, tc.wantLocal}, {"bridged pod", bridged, tc.wantBridged}, {"routed in", routedIn, tc.wantRoutedIn}} {
				if got := goesToAgent(c.p); got != c.want {
					t.Errorf("%s: to the agent = %v, want %v", c.name, got, c.want)
				}
			}
			if to, err := k.ipt.Traverse("OUTPUT", fake.Packet{Dst: vip}); err != nil || to != vip.String() {
				t.Errorf("host traffic goes to %q (%v), want the agent", to, err)
			}
			if tc.mode != DetectLocalPodIPs {
				return
			}
			// A pod that leaves the node leaves the set; a new one joins.
			a.icpt.local.set("default/local", nil, false)
			a.icpt.local.set("default/new", []netip.Addr{netip.MustParseAddr("10.244.1.7")}, false)
			if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
				t.Fatalf("sync = %v, %v", notReady, err)
			}
			if goesToAgent(localPod) || !goesToAgent(fake.Packet{Src: netip.MustParseAddr("10.244.1.7")}) {
				t.Errorf("the pods set did not follow the node's pods:\n%s", k.ipset.Save())
			}
			// A pod labelled kube-apicache.io/exclude=true leaves the set,
			// and so goes to kube-proxy's path; without the label it is back.
			a.icpt.local.set("default/new", []netip.Addr{netip.MustParseAddr("10.244.1.7")}, true)
			if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
				t.Fatalf("sync = %v, %v", notReady, err)
			}
			if goesToAgent(fake.Packet{Src: netip.MustParseAddr("10.244.1.7")}) || a.icpt.local.excludedCount() != 1 {
				t.Errorf("an excluded pod goes to the agent (%d excluded):\n%s", a.icpt.local.excludedCount(), k.ipset.Save())
			}
			a.icpt.local.set("default/new", []netip.Addr{netip.MustParseAddr("10.244.1.7")}, false)
			if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
				t.Fatalf("sync = %v, %v", notReady, err)
			}
			if !goesToAgent(fake.Packet{Src: netip.MustParseAddr("10.244.1.7")}) || a.icpt.local.excludedCount() != 0 {
				t.Errorf("a pod whose label was removed does not go to the agent:\n%s", k.ipset.Save())
			}
			a.icpt.RemoveStale()
			if got := k.ipset.Save(); got != "" {
				t.Errorf("sets left:\n%s", got)
			}
		})
	}
}

// TestSyncRequestedOnceHealthy checks that an agent a sync found unhealthy
// (its certificate not issued yet, say) intercepts as soon as it is
// healthy, not a sync period later: the liveness loop asks for a sync.
func TestSyncRequestedOnceHealthy(t *testing.T) {
	_, ep, a := newLivenessTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep.sick.Store(true)
	a.icpt.syncOrStepAside(ctx)
	if err := a.Intercepting(); err == nil {
		t.Fatal("intercepting with a sick upstream")
	}
	select {
	case <-a.icpt.syncNow:
	default:
	}
	ep.sick.Store(false)
	go a.icpt.runLiveness(ctx)
	select {
	case <-a.icpt.syncNow:
	case <-time.After(2 * time.Second):
		t.Fatal("no sync asked for once the agent was healthy")
	}
	a.icpt.syncOrStepAside(ctx)
	if err := a.Intercepting(); err != nil {
		t.Errorf("not intercepting after the sync: %v", err)
	}
	cancel()
	a.icpt.RemoveStale()
}

// newLivenessTestAgent is a sync test agent whose liveness loop refreshes
// every 250ms (a one-second timeout).
func newLivenessTestAgent(t *testing.T) (*fakeKernel, *testEndpoint, *testAgent) {
	t.Helper()
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	a, _ := newSyncTestAgent(t, k, ep)
	a.cfg.LivenessTimeout = time.Second
	return k, ep, a
}

// TestHealthReturns: given an agent that cannot stand in for
// kube-apiserver yet (here its pinned resources have not synced), the
// interceptor does not intercept and says why, while it is ready (a
// rollout must not wait for a cache); once the agent's health returns,
// the liveness loop asks for a sync at once and the next sync intercepts.
func TestHealthReturns(t *testing.T) {
	_, _, a := newLivenessTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer a.icpt.RemoveStale()
	a.setHealthErr(errors.New("waiting up to 30s after start-up for the pinned resources to sync: services"))

	a.icpt.syncOrStepAside(ctx)
	err := a.Intercepting()
	if err == nil || !strings.Contains(err.Error(), "pinned resources to sync: services") {
		t.Fatalf("Intercepting() = %v, want the wait for services", err)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready() = %v while the agent's health is pending: a rollout must not wait for the cache", err)
	}
	select {
	case <-a.icpt.syncNow:
	default:
	}
	go a.icpt.runLiveness(ctx)
	a.setHealthErr(nil)
	select {
	case <-a.icpt.syncNow:
	case <-time.After(2 * time.Second):
		t.Fatal("no sync asked for once the agent was healthy")
	}
	a.icpt.syncOrStepAside(ctx)
	if err := a.Intercepting(); err != nil {
		t.Fatalf("not intercepting once healthy: %v", err)
	}
}
