package agent

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// newSyncTestAgent returns an agent over the fake kernel k whose listener
// is a real TLS server on loopback. The "VIP" is that listener's address, so
// the self-check's connection lands on it without NAT (the fake kernel does
// not carry packets), and the upstream is ep.
func newSyncTestAgent(t *testing.T, k *fakeKernel, ep *testEndpoint) (*Agent, netip.AddrPort) {
	t.Helper()
	a := &Agent{probes: newProbes(), metrics: newMetrics(), syncNow: make(chan struct{}, 1), now: time.Now}
	cert := ep.srv.TLS.Certificates[0]
	a.cert = probeTestCert{&cert}
	listener := httptest.NewUnstartedServer(http.NotFoundHandler())
	listener.TLS = &tls.Config{GetCertificate: probingCert{certSource: a.cert, probes: a.probes}.GetCertificate}
	listener.StartTLS()
	t.Cleanup(listener.Close)
	ap := netip.MustParseAddrPort(listener.Listener.Addr().String())

	cfg := dataplaneConfig()
	cfg.ListenAddress = ap
	cfg.ServiceVIPs = []netip.Addr{ap.Addr()}
	cfg.ServicePort = ap.Port()
	wireTestAgent(t, a, cfg, k, ep)
	return a, ap
}

// wireTestAgent completes a test agent: cfg, its dataplanes over the fake
// kernel k, and ep as its one upstream, already health-checked.
func wireTestAgent(t *testing.T, a *Agent, cfg *Config, k *fakeKernel, ep *testEndpoint) {
	t.Helper()
	a.cfg = cfg
	var err error
	if a.planes, err = newDataplanes(cfg, k.kernel()); err != nil {
		t.Fatal(err)
	}
	a.up = newTestUpstreams(ep)
	a.up.checkAll(context.Background(), time.Second)
	a.interception = newInterceptionMetrics(a.metrics.registry, a.up)
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
		notReady, err := a.sync(ctx)
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
	mustDo(t, a.planes[0].clear())
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
	if got := testutil.ToFloat64(a.interception.selfChecks.WithLabelValues("ok")); got != 3 {
		t.Errorf("self-checks ok = %v, want 3", got)
	}

	// When the upstream fails its health check, then the entry goes at
	// once and the agent says why it is not ready; the rules stay.
	ep.sick.Store(true)
	a.up.checkAll(ctx, time.Second)
	notReady, err := a.sync(ctx)
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
	a.up.checkAll(ctx, time.Second)
	syncOK("recovered")

	// When the agent goes away cleanly, then only kube-proxy's rules are
	// left.
	a.removeStale()
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
