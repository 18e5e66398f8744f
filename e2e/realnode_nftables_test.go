package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// kubeProxyRestarts is how often TestRealNodeNFTables restarts kube-proxy,
// which deletes and re-registers its base chains each time.
const kubeProxyRestarts = 20

// TestRealNodeNFTables: the real node with kube-proxy v1.36.3 in nftables
// mode and the shipped manifests, whose --dataplane=auto picks the
// nftables dataplane there.
//
//  1. The DaemonSet installs; the agent says on /readyz that it runs the
//     nftables dataplane because kube-proxy's table exists, and its table
//     has prerouting and output at dstnat-1 with the VIP alive.
//  2. A client pod's kubectl and informers read through it (prerouting).
//  3. Restarting kube-proxy 20 times, which deletes and re-registers its
//     nat chains at dstnat each time, never takes a connection past the
//     agent: every TLS probe from the node reaches it.
//  4. The same restarts with the agent switched to the iptables
//     dataplane, whose nat chains (iptables-nft) tie with kube-proxy's at
//     dstnat: kube-proxy's re-registered chains run first, and probes
//     reach kube-apiserver instead (until the self-check steps aside);
//     switching back removes the iptables redirect.
//  5. The DaemonSet restarts under load without a failed request; a hung
//     agent (its container frozen, as SIGSTOP) and SIGKILL both fail open,
//     and the agent intercepts again, with nothing duplicated; the
//     uninstall leaves nothing of the agent.
//  6. After the uninstall, 100 agents started and SIGKILLed in the node's
//     network namespace next to this kube-proxy leave nothing duplicated
//     (cycles): processes of a host-network pod, as the DaemonSet's
//     container is, since through the kubelet, whose restart back-off
//     doubles up to five minutes, they would take hours.
func TestRealNodeNFTables(t *testing.T) {
	images := requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	hostBefore := snapshotHost(t)
	c, rn, stop := startRealNodeSandbox(t, ctx, realNodeBinDir(), images, "nftables")
	figuref(t, "nftables real node up in %s, kube-proxy in nftables mode", rn.Timings.KubeProxy)

	s := &dsScenario{c: c, node: rn, overlay: writeOverlay(t, ""), nft: true}
	for _, step := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context)
	}{
		{"install", s.install},
		{"reads", s.reads},
		{"kube-proxy-restarts", s.kubeProxyRestarts},
		{"iptables-tie", s.iptablesTie},
		{"rollout", s.rollout},
		{"hang", s.hang},
		{"kill", s.kill},
		{"uninstall", s.uninstall},
		{"cycles", s.cycles},
	} {
		stepStart := time.Now()
		ok := t.Run(step.name, func(t *testing.T) { step.run(t, ctx) })
		t.Logf("step %s took %s", step.name, time.Since(stepStart).Round(time.Millisecond))
		if !ok {
			s.dumpAgent(t, ctx)
			if ruleset, err := c.Node.Output(ctx, "nft", "list", "ruleset"); err == nil {
				t.Logf("nft ruleset:\n%s", ruleset)
			}
			t.Fatalf("step %s failed; the later steps depend on it", step.name)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	hostBefore.checkRestored(t, rn)
}

// assertNFTInstalled: the agent runs the nftables dataplane and says why,
// and its table runs ahead of kube-proxy's with the VIP alive.
func (s *dsScenario) assertNFTInstalled(t *testing.T, ctx context.Context) {
	t.Helper()
	code, body, err := agentEndpoint(ctx, s.c, "/readyz")
	if code != http.StatusOK || !strings.Contains(body, "dataplane nftables (auto: kube-proxy's nftables table ip kube-proxy exists)") {
		t.Errorf("/readyz = %d %q (%v), want the nftables dataplane because of kube-proxy's table", code, body, err)
	}
	st := readNFTState(t, ctx, s.c)
	if st.BaseChains != 2 || !slices.Equal(st.Priorities, []int{-101, -101}) || !slices.Equal(st.Live, []string{sandbox.ServiceVIP}) {
		ruleset, _ := s.c.Node.Output(ctx, "nft", "list", "ruleset")
		t.Errorf("nftables state %+v, want two base chains at -101 and the VIP alive:\n%s", st, ruleset)
	}
	proxy, err := s.c.Node.Output(ctx, "nft", "list", "table", "ip", "kube-proxy")
	if err != nil || !strings.Contains(proxy, "priority dstnat") {
		t.Errorf("kube-proxy's table (%v):\n%s", err, proxy)
	}
	figuref(t, "install: /readyz %q; table ip kube-apicache: prerouting and output at %v (kube-proxy's at dstnat, -100), liveness %v",
		body, st.Priorities, st.Live)
}

// nodeProbe opens a TLS connection from the node to the VIP, as a host
// client would (nat output), and reports whether the agent answered (its
// CSR-issued certificate names the node) rather than kube-apiserver.
func (s *dsScenario) nodeProbe(ctx context.Context) (agent bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	raw, err := s.c.Node.DialContext(ctx, "tcp", net.JoinHostPort(sandbox.ServiceVIP, strconv.Itoa(sandbox.ServicePort)))
	if err != nil {
		return false, err
	}
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, ServerName: "kubernetes.default.svc"})
	defer conn.Close()
	if err := conn.HandshakeContext(ctx); err != nil {
		return false, err
	}
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName == "system:node:"+s.node.Name, nil
}

// probeCounts are the outcomes of the probes of one run. live counts the
// probes that reached kube-apiserver although the redirect was live (the
// VIP in the liveness set just before and just after the probe): those
// bypassed an installed redirect, as opposed to probes sent after the
// agent had stepped aside. perRestart[i] is live for the probes sent after
// restart i+1 (before the next one).
type probeCounts struct {
	agent, apiserver, failed, live int
	perRestart                     []int
	firstFailure                   error
}

func (p probeCounts) String() string {
	return fmt.Sprintf("%d probes: %d reached the agent, %d kube-apiserver (%d of them while the redirect was live), %d failed",
		p.agent+p.apiserver+p.failed, p.agent, p.apiserver, p.live, p.failed)
}

// restartKubeProxyProbing restarts kube-proxy n times while probing the
// VIP from the node, and returns the probes' outcomes. live, if not nil,
// reports whether the agent's redirect is live; probes that reach
// kube-apiserver are then classified by it.
func (s *dsScenario) restartKubeProxyProbing(t *testing.T, ctx context.Context, n int, live func() bool) (probeCounts, []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	counts := probeCounts{perRestart: make([]int, n)}
	restart := -1 // the last restart begun; guarded by mu
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			liveBefore := live != nil && live()
			agent, err := s.nodeProbe(ctx)
			bypassed := err == nil && !agent && liveBefore && live()
			mu.Lock()
			switch {
			case err != nil:
				counts.failed++
				if counts.firstFailure == nil {
					counts.firstFailure = err
				}
			case agent:
				counts.agent++
			default:
				counts.apiserver++
				if bypassed {
					counts.live++
					if restart >= 0 {
						counts.perRestart[restart]++
					}
				}
			}
			mu.Unlock()
		}
	}()
	var took []time.Duration
	// In nftables mode kube-proxy re-creates its base chains on start: a
	// new handle each time. (In iptables mode it keeps existing rules.)
	handles := map[string]bool{}
	if s.nft {
		handles[s.kubeProxyNATHandle(t, ctx)] = true
	}
	for i := range n {
		mu.Lock()
		restart = i
		mu.Unlock()
		d, err := s.node.RestartKubeProxy(ctx)
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("restart %d of kube-proxy: %v", i+1, err)
		}
		took = append(took, d.Round(time.Millisecond))
		if s.nft {
			handles[s.kubeProxyNATHandle(t, ctx)] = true
		}
		time.Sleep(300 * time.Millisecond)
	}
	close(stop)
	<-done
	// Each restart re-registered kube-proxy's nat prerouting chain (a new
	// handle), or the restarts tested nothing.
	if s.nft && len(handles) != n+1 {
		t.Errorf("kube-proxy's nat prerouting chain had %d handles over %d restarts, want a new one each time", len(handles), n)
	}
	return counts, took
}

// kubeProxyNATHandle returns the handle of kube-proxy's nat prerouting
// base chain, which changes whenever kube-proxy re-creates it.
func (s *dsScenario) kubeProxyNATHandle(t *testing.T, ctx context.Context) string {
	t.Helper()
	out, err := s.c.Node.Output(ctx, "nft", "-a", "list", "table", "ip", "kube-proxy")
	if err != nil {
		t.Fatalf("nft list table ip kube-proxy: %v", err)
	}
	chain := ""
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "chain ") {
			chain = l
		}
		if strings.Contains(l, "type nat hook prerouting") {
			if _, h, ok := strings.Cut(chain, "# handle "); ok {
				return h
			}
		}
	}
	t.Fatalf("no nat prerouting chain in kube-proxy's table:\n%s", out)
	return ""
}

// kubeProxyRestarts: while kube-proxy restarts, whatever order its
// re-registered chains take, no probe bypasses the agent's live redirect
// and none fails. A probe may reach kube-apiserver only while the
// redirect is not live: the agent, starved of CPU by a busy machine,
// missed a liveness refresh and stepped aside, which is fail-open doing
// its job; that must stay rare (a tenth of the probes at most).
func (s *dsScenario) kubeProxyRestarts(t *testing.T, ctx context.Context) {
	// The redirect is live while the VIP is in the liveness set of the
	// dataplane in use.
	live := func() bool {
		if s.nft {
			_, err := s.c.Node.Output(ctx, "nft", "get", "element", "ip", "kube-apicache", "liveness", "{", sandbox.ServiceVIP, "}")
			return err == nil
		}
		_, err := s.c.Node.Output(ctx, "ipset", "test", sandbox.AgentLivenessSet, sandbox.ServiceVIP)
		return err == nil
	}
	counts, took := s.restartKubeProxyProbing(t, ctx, kubeProxyRestarts, live)
	mode := "iptables dataplane, kube-proxy in iptables mode"
	if s.nft {
		mode = "nftables dataplane"
	}
	figuref(t, "kube-proxy restarts (%s): %d restarts (each %v); %s", mode, kubeProxyRestarts, took, counts)
	if counts.live > 0 || counts.failed > 0 || counts.agent < 100 || counts.apiserver > (counts.agent+counts.apiserver)/10 {
		t.Errorf("%s across kube-proxy restarts: %s (first failure: %v); want no probe past the live redirect, none failed, and at most a tenth at kube-apiserver while the agent stepped aside",
			mode, counts, counts.firstFailure)
	}
	s.assertNoDuplicates(t, ctx, "kube-proxy restarts")
}

// iptablesTie switches the agent to the iptables dataplane, whose
// iptables-nft nat chains run at dstnat like kube-proxy's, restarts
// kube-proxy the same number of times and counts what the probes reached;
// then switches back to the shipped default.
func (s *dsScenario) iptablesTie(t *testing.T, ctx context.Context) {
	s.setAgentArgs(t, ctx, "--dataplane=iptables")
	if !waitForCond(time.Minute, func() bool {
		code, _, _ := agentEndpoint(ctx, s.c, "/intercepting")
		return code == http.StatusOK
	}) {
		_, body, _ := agentEndpoint(ctx, s.c, "/intercepting")
		t.Fatalf("the iptables dataplane never intercepted before the restarts: %q", body)
	}
	_, before, _ := agentEndpoint(ctx, s.c, "/intercepting")
	// The redirect is live while the VIP is in the liveness ipset.
	live := func() bool {
		_, err := s.c.Node.Output(ctx, "ipset", "test", sandbox.AgentLivenessSet, sandbox.ServiceVIP)
		return err == nil
	}
	counts, _ := s.restartKubeProxyProbing(t, ctx, kubeProxyRestarts, live)
	_, after, _ := agentEndpoint(ctx, s.c, "/intercepting")
	tied := 0
	for _, n := range counts.perRestart {
		if n > 0 {
			tied++
		}
	}
	figuref(t, "kube-proxy restarts (iptables dataplane, tied at dstnat): intercepting at the start (%q); %s; restarts after which a probe bypassed the live redirect: %d of %d (bypassing probes per restart %v); /intercepting after: %q",
		before, counts, tied, kubeProxyRestarts, counts.perRestart, after)
	// The tie: kube-proxy's re-registered chains run ahead of
	// iptables-nft's at the same priority, so connections bypass the
	// agent's live redirect until its self-check notices and steps aside.
	if counts.live == 0 {
		t.Errorf("no probe bypassed the live iptables redirect across %d kube-proxy restarts (%s): the tie did not show", kubeProxyRestarts, counts)
	}
	if counts.failed > 0 {
		t.Errorf("probes failed: %s (first failure: %v)", counts, counts.firstFailure)
	}
	if st := readNFTState(t, ctx, s.c); st.Tables != 0 {
		t.Errorf("the nftables table is still there next to the iptables redirect: %+v", st)
	}

	// Back to the shipped default: the iptables redirect goes.
	s.setAgentArgs(t, ctx)
	waitFor(t, time.Minute, "the agent intercepts with the nftables dataplane", func() bool {
		code, body, _ := agentEndpoint(ctx, s.c, "/intercepting")
		return code == http.StatusOK && strings.Contains(body, "dataplane nftables")
	})
	nat, _, err := s.c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) {
		t.Errorf("the iptables redirect is still there after switching back:\n%s", nat)
	}
	s.assertNoDuplicates(t, ctx, "back to nftables")
}

// setAgentArgs rolls the DaemonSet out with the shipped arguments plus
// extra, and waits for the new pod to be Ready.
func (s *dsScenario) setAgentArgs(t *testing.T, ctx context.Context, extra ...string) {
	t.Helper()
	old, err := s.agentPod(ctx)
	if err != nil || old == nil {
		t.Fatalf("the agent pod: %v", err)
	}
	if err := sandbox.WriteOverlay(s.overlay, realAgentImage, "", extra...); err != nil {
		t.Fatal(err)
	}
	s.mustKubectl(t, ctx, "apply", "-k", s.overlay)
	waitFor(t, 3*time.Minute, "the new agent pod Ready", func() bool {
		p, err := s.agentPod(ctx)
		if err != nil || p == nil || p.UID == old.UID {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				return true
			}
		}
		return false
	})
}

// waitForCond polls cond every 200ms for up to timeout and reports
// whether it held.
func waitForCond(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// hang: given a load client opening a connection per request, when the
// agent's container is frozen (the cgroup freezer: a hung agent, as
// SIGSTOP), then the liveness element expires and new connections take
// kube-proxy's path; when it thaws, it intercepts again.
func (s *dsScenario) hang(t *testing.T, ctx context.Context) {
	load := s.startLoad(t, ctx, "load-hang", true)
	waitFor(t, 10*time.Second, "the load goes through the agent", func() bool { return s.intercepting(t, ctx) })
	id := s.runningAgentContainer(t, ctx)
	frozen := time.Now()
	if out, err := s.node.CtrOutput(ctx, "tasks", "pause", id); err != nil {
		t.Fatalf("ctr tasks pause: %v %s", err, out)
	}
	waitFor(t, livenessTimeout+2*time.Second, "the liveness element expires", func() bool {
		return !slices.Contains(liveEntries(t, ctx, s.c), sandbox.ServiceVIP)
	})
	expired := time.Since(frozen)
	time.Sleep(3 * time.Second) // the load runs on kube-proxy's path meanwhile
	if out, err := s.node.CtrOutput(ctx, "tasks", "resume", id); err != nil {
		t.Fatalf("ctr tasks resume: %v %s", err, out)
	}
	waitFor(t, 2*time.Minute, "the thawed agent intercepts", func() bool { return s.intercepting(t, ctx) })
	res := s.stopLoad(t, ctx, load)
	figuref(t, "hang: container frozen; liveness element expired %s after; thawed agent intercepting again; load: %s",
		expired.Round(time.Millisecond), res)
	if maxGap := livenessTimeout + 4*time.Second; res.LongestGap > maxGap {
		t.Errorf("longest gap %s, want at most %s; failures:\n%s", res.LongestGap, maxGap, res.firstFailures(5))
	}
	s.assertNoDuplicates(t, ctx, "hang")
}
