package interception

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// dualStackTestAgent is an agent over the fake kernel with a real TLS
// listener per family, on 127.0.0.1 and ::1 at the same port. The VIPs are
// these listeners' addresses, so the self-check's connections land on them
// without NAT (the fake kernel does not carry packets).
type dualStackTestAgent struct {
	*testAgent
	vip4, vip6 netip.AddrPort
	// srv6 serves the IPv6 listener; stop6 and start6 take it down and up.
	srv6 *httptest.Server
}

func startTLS(t *testing.T, a *testAgent, l net.Listener) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	_ = srv.Listener.Close()
	srv.Listener = l
	srv.TLS = &tls.Config{GetCertificate: a.getCertificate}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func newDualStackTestAgent(t *testing.T, k *fakeKernel, ep *testEndpoint) *dualStackTestAgent {
	t.Helper()
	a := newTestAgent(ep)
	var l4, l6 net.Listener
	for range 20 {
		var err error
		if l4, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		port := l4.Addr().(*net.TCPAddr).Port
		if l6, err = net.Listen("tcp", net.JoinHostPort("::1", strconv.Itoa(port))); err == nil {
			break
		}
		_ = l4.Close()
		l4 = nil
	}
	if l4 == nil {
		t.Skip("no IPv6 loopback listener could share a port with the IPv4 one (IPv6 disabled?)")
	}
	s := &dualStackTestAgent{testAgent: a}
	startTLS(t, a, l4)
	s.srv6 = startTLS(t, a, l6)
	s.vip4 = netip.MustParseAddrPort(l4.Addr().String())
	s.vip6 = netip.MustParseAddrPort(l6.Addr().String())

	cfg := dataplaneConfig()
	cfg.ListenAddress = s.vip4
	cfg.ListenAddressIPv6 = s.vip6
	cfg.ServiceVIPs = []netip.Addr{s.vip4.Addr(), s.vip6.Addr()}
	cfg.ServicePort = s.vip4.Port()
	cfg.LivenessTimeout = 2 * time.Second
	wireTestAgent(t, a, cfg, k)
	return s
}

// stop6 takes the IPv6 listener down, as if its address had gone.
func (s *dualStackTestAgent) stop6() { s.srv6.Close() }

// start6 brings the IPv6 listener back on the same address.
func (s *dualStackTestAgent) start6(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", s.vip6.String())
	if err != nil {
		t.Fatal(err)
	}
	s.srv6 = startTLS(t, s.testAgent, l)
}

// TestSyncDualStack drives the sync and liveness of a dual-stack agent
// against the stateful fakes: each family gets its address, set, chain (in
// iptables or ip6tables) and entry; a family whose listener stops serving
// loses only its own entry, the other family stays intercepted; and removal
// leaves only kube-proxy's rules in both tables.
func TestSyncDualStack(t *testing.T) {
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	s := newDualStackTestAgent(t, k, ep)
	ctx := context.Background()
	route := func(ipt *fake.IPTables, vip netip.AddrPort) string {
		t.Helper()
		to, err := ipt.Traverse("PREROUTING", fake.Packet{Dst: vip})
		mustDo(t, err)
		return to
	}
	nat4, nat6 := k.ipt.Save("nat"), k.ip6t.Save("nat")
	syncOK := func(step string) {
		t.Helper()
		notReady, err := s.syncLocked(ctx)
		if err != nil || notReady != nil {
			t.Fatalf("%s: sync = %v, %v; want ready", step, notReady, err)
		}
		if got := route(k.ipt, s.vip4); got != s.vip4.String() {
			t.Fatalf("%s: IPv4 VIP goes to %q, want the agent at %s", step, got, s.vip4)
		}
		if got := route(k.ip6t, s.vip6); got != s.vip6.String() {
			t.Fatalf("%s: IPv6 VIP goes to %q, want the agent at %s", step, got, s.vip6)
		}
	}

	// Given a healthy dual-stack agent, when it syncs, then each VIP goes
	// to the listener of its family, through its family's set.
	syncOK("first sync")
	if diff := cmp.Diff([]string{"kube-apicache0 127.0.0.1/32", "kube-apicache0 ::1/128"}, k.nl.Addresses()); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	wantSets := "create KUBE-APICACHE-LIVE hash:ip family inet timeout 2\nadd KUBE-APICACHE-LIVE 127.0.0.1\n" +
		"create KUBE-APICACHE-LIVE6 hash:ip family inet6 timeout 2\nadd KUBE-APICACHE-LIVE6 ::1\n"
	if diff := cmp.Diff(wantSets, k.ipset.Save()); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
	rule6 := "-A KUBE-APICACHE -d ::1/128 -p tcp -m tcp --dport " + strconv.Itoa(int(s.vip6.Port())) +
		" -m set --match-set KUBE-APICACHE-LIVE6 dst -m comment --comment \"kube-apicache: kubernetes Service VIP to the node-local agent while it is alive\"" +
		" -j DNAT --to-destination " + s.vip6.String() + "\n"
	if got := k.ip6t.Save("nat"); !strings.Contains(got, rule6) {
		t.Errorf("ip6tables nat lacks\n%s\ngot:\n%s", rule6, got)
	}
	if strings.Contains(k.ipt.Save("nat"), "::1") || strings.Contains(k.ip6t.Save("nat"), "127.0.0.1") {
		t.Errorf("a family's rules went to the other family's table")
	}

	// When the IPv6 listener stops serving, then the liveness loop takes
	// the IPv6 entry out within a few refreshes, and keeps refreshing the
	// IPv4 one.
	loopCtx, stopLoop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.icpt.runLiveness(loopCtx) })
	// The sync the loop requests is the run loop's job; drain requests.
	wg.Go(func() {
		for {
			select {
			case <-loopCtx.Done():
				return
			case <-s.icpt.syncNow:
			}
		}
	})
	s.stop6()
	deadline := time.Now().Add(10 * time.Second)
	for k.ipset.Contains("KUBE-APICACHE-LIVE6", s.vip6.Addr()) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	stopLoop()
	wg.Wait()
	if k.ipset.Contains("KUBE-APICACHE-LIVE6", s.vip6.Addr()) {
		t.Fatal("the IPv6 entry outlived its listener")
	}
	if got := route(k.ip6t, s.vip6); got == s.vip6.String() {
		t.Errorf("IPv6 VIP still goes to a dead listener")
	}
	if got := route(k.ipt, s.vip4); got != s.vip4.String() {
		t.Errorf("IPv4 VIP goes to %q after the IPv6 listener failed; want the agent", got)
	}
	if err := s.Intercepting(); err == nil || !strings.Contains(err.Error(), "IPv6 listener not serving") {
		t.Errorf("Ready() = %v, want the IPv6 listener named", err)
	}

	// And a sync keeps IPv4 intercepted while it reports IPv6 down.
	notReady, err := s.syncLocked(ctx)
	if err != nil || notReady == nil || !strings.Contains(notReady.Error(), "IPv6 listener not serving") || strings.Contains(notReady.Error(), "IPv4") {
		t.Fatalf("sync with the IPv6 listener down = %v, %v; want not ready for IPv6 only", notReady, err)
	}
	if !k.ipset.Contains("KUBE-APICACHE-LIVE", s.vip4.Addr()) || k.ipset.Contains("KUBE-APICACHE-LIVE6", s.vip6.Addr()) {
		t.Errorf("after sync, sets:\n%s", k.ipset.Save())
	}

	// When the IPv6 listener serves again, then the next sync intercepts
	// both families.
	s.start6(t)
	syncOK("IPv6 back")

	// When the agent goes away, then only kube-proxy's rules are left, in
	// both tables, with no set and no address.
	s.icpt.RemoveStale()
	if diff := cmp.Diff(nat4, k.ipt.Save("nat")); diff != "" {
		t.Errorf("iptables nat after removal (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(nat6, k.ip6t.Save("nat")); diff != "" {
		t.Errorf("ip6tables nat after removal (-before +after):\n%s", diff)
	}
	if got := k.ipset.Save(); got != "" {
		t.Errorf("sets left:\n%s", got)
	}
	if got := k.nl.Addresses(); len(got) != 0 {
		t.Errorf("addresses left: %v", got)
	}
}

// syncLocked runs one sync as the run loop does, under syncMu.
func (a *testAgent) syncLocked(ctx context.Context) (error, error) {
	a.icpt.syncMu.Lock()
	defer a.icpt.syncMu.Unlock()
	notReady, err := a.icpt.sync(ctx)
	if err == nil {
		a.icpt.setNotIntercepting(notReady)
	}
	return notReady, err
}
