package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/agent"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// livenessTimeout is the switch's timeout in these tests: the default.
const livenessTimeout = agent.DefaultLivenessTimeout

// killGapTarget bounds the longest gap between a client's successful
// requests when the agent is killed: the entry expires at most
// livenessTimeout after the last refresh, and new connections then take
// kube-proxy's path.
const killGapTarget = 1500 * time.Millisecond

// minLoadOK is the fewest successful requests a load run over a scenario
// (five seconds or more, a request every 20ms on an idle machine) must
// count for its longest gap to mean something. It is not a rate: on a
// machine the rest of the suite keeps busy each request takes several
// times longer, and the gap is what the scenarios bound.
const minLoadOK = 30

// loadResult is what a podclient load run reports.
type loadResult struct {
	OK, Failed, Reads, Writes, FailedReads, FailedWrites int
	LongestGap                                           time.Duration
	Failures                                             []string
}

var resultRE = regexp.MustCompile(`RESULT ok=(\d+) failed=(\d+) reads=(\d+) writes=(\d+) failed_reads=(\d+) failed_writes=(\d+) longest_gap_ms=(\d+)`)

// loadRun is a pod client reading and writing a ConfigMap through the VIP
// in a loop.
type loadRun struct {
	t    *testing.T
	proc *sandbox.Process
}

// startLoad starts the load client in pod and waits until its first write
// succeeded. newConn makes every request open its own connection, so each
// request meets the node's current redirect state; without it the client
// behaves like any client-go program (one HTTP/2 connection, reused).
func startLoad(t *testing.T, pod *sandbox.Pod, name string, newConn bool) *loadRun {
	t.Helper()
	args := []string{"load", "--name", name, "--timeout", "4m", "--interval", "20ms"}
	if newConn {
		args = append(args, "--new-conn")
	}
	// The process log is named after the binary: one name per run.
	bin := filepath.Join(t.TempDir(), "podclient-"+name)
	if err := os.Symlink(podclientBin, bin); err != nil {
		t.Fatal(err)
	}
	proc, err := pod.Start(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	l := &loadRun{t: t, proc: proc}
	t.Cleanup(func() { proc.Stop(10 * time.Second) })
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(proc.Log(), "READY") {
		if done, _ := proc.Exited(); done || time.Now().After(deadline) {
			t.Fatalf("load client not ready:\n%s", proc.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return l
}

// stop ends the run and returns its figures.
func (l *loadRun) stop() loadResult {
	l.t.Helper()
	l.proc.Stop(10 * time.Second)
	log := l.proc.Log()
	m := resultRE.FindStringSubmatch(log)
	if m == nil {
		l.t.Fatalf("load client printed no RESULT:\n%s", log)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	r := loadResult{OK: n(1), Failed: n(2), Reads: n(3), Writes: n(4), FailedReads: n(5), FailedWrites: n(6),
		LongestGap: time.Duration(n(7)) * time.Millisecond}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "FAIL ") {
			r.Failures = append(r.Failures, line)
		}
	}
	return r
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d requests (%d reads, %d writes): %d failed (%d reads, %d writes), longest gap between successes %s",
		r.OK+r.Failed, r.Reads, r.Writes, r.Failed, r.FailedReads, r.FailedWrites, r.LongestGap)
}

// firstFailures returns up to n failure lines, for logs.
func (r loadResult) firstFailures(n int) string {
	if len(r.Failures) < n {
		n = len(r.Failures)
	}
	return strings.Join(r.Failures[:n], "\n")
}

// liveEntries returns the members of the agent's liveness set, or nil if
// the set does not exist.
func liveEntries(t *testing.T, ctx context.Context, c *sandbox.Cluster) []string {
	t.Helper()
	// Whichever dataplane runs: the nftables table's set, if there is one.
	if st := readNFTState(t, ctx, c); st.Tables > 0 {
		return st.Live
	}
	out, err := c.Node.Output(ctx, "ipset", "list", sandbox.AgentLivenessSet)
	if err != nil {
		return nil
	}
	_, members, _ := strings.Cut(out, "Members:\n")
	var ips []string
	for _, line := range strings.Split(strings.TrimSpace(members), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			ips = append(ips, f[0])
		}
	}
	return ips
}

// forwarded returns the number of requests the agent has forwarded.
func forwarded(t *testing.T, ctx context.Context, a *sandbox.Agent) float64 {
	t.Helper()
	var n float64
	for _, v := range agentRequests(t, ctx, a) {
		n += v
	}
	return n
}

// cleanNode removes what a killed agent left, the way the product does: a
// successor that cannot start removes a dead predecessor's state.
func cleanNode(t *testing.T, ctx context.Context, c *sandbox.Cluster) {
	t.Helper()
	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	cmd := pod.Command(ctx, agentBin, c.AgentArgs(certFile, keyFile, "--upstream=https://10.250.0.99:6443", "--upstream-check-timeout=1s")...)
	_ = cmd.Run()
	assertNoAgentState(t, ctx, c)
}

// doTestAgentDies: given an agent serving a pod's continuous reads and
// writes through the VIP, when the agent is stopped by sig without a chance
// to clean up, then the kernel expires the liveness entry and new
// connections reach kube-apiserver through kube-proxy within the switch's
// timeout.
func doTestAgentDies(t *testing.T, ns string, sig syscall.Signal, maxGap time.Duration, args ...string) time.Duration {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, ns, "client")
	a := startAgent(t, ctx, c, args...)
	load := startLoad(t, pod, "load", true)
	// The load goes through the agent: wait for its requests there (a
	// busy machine takes longer than an idle one to send them).
	var before float64
	waitFor(t, time.Minute, "20 of the load's requests forwarded by the agent", func() bool {
		before = forwarded(t, ctx, a)
		return before >= 20
	})
	if got := liveEntries(t, ctx, c); len(got) != 1 || got[0] != sandbox.ServiceVIP {
		t.Fatalf("liveness set members = %v, want [%s]", got, sandbox.ServiceVIP)
	}

	killed := time.Now()
	if err := a.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	// The entry must be gone within the timeout, without any process
	// acting on it.
	for len(liveEntries(t, ctx, c)) > 0 {
		if time.Since(killed) > livenessTimeout+time.Second {
			t.Fatalf("liveness entry still there %s after %s", time.Since(killed), sig)
		}
		time.Sleep(100 * time.Millisecond)
	}
	expired := time.Since(killed)
	// Long enough after the expiry to see the load run on kube-proxy's
	// path (a hung agent's requests time out after 3s).
	time.Sleep(5 * time.Second)
	res := load.stop()
	figuref(t, "%s: liveness entry expired %s after the signal; load: %s", ns, expired.Round(time.Millisecond), res)
	if res.Failed > 0 {
		t.Logf("first failures:\n%s", res.firstFailures(3))
	}
	if res.LongestGap > maxGap {
		t.Errorf("longest gap %s, want at most %s", res.LongestGap, maxGap)
	}
	if res.OK < minLoadOK {
		t.Errorf("only %d successful requests, want at least %d", res.OK, minLoadOK)
	}
	if nat, _, _ := c.NodeNetState(ctx); !strings.Contains(nat, sandbox.AgentChain) && readNFTState(t, ctx, c).BaseChains == 0 {
		t.Errorf("the rules are gone; the scenario is meant to leave them to the switch:\n%s", nat)
	}
	if sig == syscall.SIGSTOP {
		// Resumed, the agent finds itself healthy and intercepts again.
		if err := a.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := a.WaitReady(ctx); err != nil {
			t.Fatalf("resumed agent not ready: %v", err)
		}
		waitFor(t, 10*time.Second, "liveness entry back after SIGCONT", func() bool { return len(liveEntries(t, ctx, c)) == 1 })
		a.Process.Stop(40 * time.Second)
		assertNoAgentState(t, ctx, c)
		return res.LongestGap
	}
	cleanNode(t, ctx, c)
	return res.LongestGap
}

// TestKilledAgentFailsOpen: kill -9, five times. The agent's sockets die
// with it, so requests on new connections fail fast (connection refused)
// until the entry expires; the longest gap a client opening a connection
// every 20ms sees is at most killGapTarget.
func TestKilledAgentFailsOpen(t *testing.T) {
	requireCluster(t)
	var gaps []time.Duration
	for i := range 5 {
		t.Run(fmt.Sprintf("kill-%d", i+1), func(t *testing.T) {
			gaps = append(gaps, doTestAgentDies(t, fmt.Sprintf("e2e-sigkill-%d", i+1), syscall.SIGKILL, killGapTarget))
		})
	}
	figuref(t, "SIGKILL x%d: longest gaps %v (target %v, liveness timeout %v)", len(gaps), gaps, killGapTarget, livenessTimeout)
}

// TestHungAgentFailsOpen: SIGSTOP. The kernel still accepts connections
// for the hung agent, so requests time out (3s in the client) until the
// entry expires.
func TestHungAgentFailsOpen(t *testing.T) {
	doTestAgentDies(t, "e2e-sigstop", syscall.SIGSTOP, livenessTimeout+4*time.Second)
}

// TestGracefulHandoff: given pods reading and writing through the agent,
// one with a client-go default client (one reused HTTP/2 connection) and
// one opening a connection per request, when the agent gets SIGTERM and a
// new agent starts after it (a DaemonSet rolling update), then no request
// fails, the old agent exits 0, and the new one intercepts.
func TestGracefulHandoff(t *testing.T) {
	doTestGracefulHandoff(t, "e2e-handoff")
}

// doTestGracefulHandoff runs the hand-off scenario with agents started
// with args.
func doTestGracefulHandoff(t *testing.T, ns string, args ...string) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, ns, "client")
	old := startAgent(t, ctx, c, args...)
	reused := startLoad(t, pod, "load-reused", false)
	fresh := startLoad(t, pod, "load-fresh", true)
	waitFor(t, time.Minute, "20 of the loads' requests forwarded by the old agent", func() bool { return forwarded(t, ctx, old) >= 20 })

	start := time.Now()
	if err := old.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, old.Process, 40*time.Second); code != 0 {
		t.Errorf("old agent exited %d, want 0", code)
	}
	exited := time.Since(start)
	time.Sleep(time.Second) // requests meanwhile go through kube-proxy
	next := startAgent(t, ctx, c, args...)
	// The loads keep running until the new agent has forwarded some of
	// their requests (up to a minute on a busy machine).
	var n float64
	waitFor(t, time.Minute, "10 of the loads' requests forwarded by the new agent", func() bool {
		n = forwarded(t, ctx, next)
		return n >= 10
	})
	for _, l := range []struct {
		name string
		run  *loadRun
	}{{"reused connection", reused}, {"connection per request", fresh}} {
		res := l.run.stop()
		figuref(t, "rolling replacement, %s: %s", l.name, res)
		if res.Failed != 0 {
			t.Errorf("%s: %d requests failed:\n%s", l.name, res.Failed, res.firstFailures(5))
		}
	}
	figuref(t, "old agent exited %s after SIGTERM; new agent forwarded %v requests", exited.Round(time.Millisecond), n)
	if n < 10 {
		t.Errorf("new agent forwarded only %v requests", n)
	}
}

// nodeState counts what the agent may leave on the node.
type nodeState struct {
	Chains, ChainRules, Jumps, Sets, Entries, Addresses int
	JumpFirst                                           bool
	ReturnFirst                                         bool
}

func readNodeState(t *testing.T, ctx context.Context, c *sandbox.Cluster) nodeState {
	t.Helper()
	nat, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var s nodeState
	firstOf := map[string]string{}
	var chainRules []string
	for _, line := range strings.Split(nat, "\n") {
		switch {
		case line == ":"+sandbox.AgentChain+" - [0:0]":
			s.Chains++
		case strings.HasPrefix(line, "-A "+sandbox.AgentChain+" "):
			chainRules = append(chainRules, line)
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if _, ok := firstOf[f[1]]; !ok {
				firstOf[f[1]] = line
			}
			if strings.HasSuffix(line, "-j "+sandbox.AgentChain) {
				s.Jumps++
			}
		}
	}
	s.ChainRules = len(chainRules)
	s.ReturnFirst = len(chainRules) > 0 && strings.Contains(chainRules[0], "--mark 0x1000/0x1000 -j RETURN")
	s.JumpFirst = strings.HasSuffix(firstOf["PREROUTING"], "-j "+sandbox.AgentChain) && strings.HasSuffix(firstOf["OUTPUT"], "-j "+sandbox.AgentChain)
	sets, err := c.Node.Output(ctx, "ipset", "list", "-n")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Fields(sets) {
		if name == sandbox.AgentLivenessSet {
			s.Sets++
		}
	}
	s.Entries = len(liveEntries(t, ctx, c))
	s.Addresses = strings.Count(addrs, " "+sandbox.AgentListenIP+"/")
	return s
}

// TestStartKillCycles: given 100 agents started one after the other, each
// killed with SIGKILL at a random point of its start-up or while serving,
// when a last agent starts, then the node holds exactly one chain with its
// four rules (the RETURN for marked traffic first, then the one for
// skipped sources, the record of redirected attempts and the DNAT), one
// jump per hook in first position, one set with one entry and one address, and requests
// through the VIP are answered by the agent, not looped back to it.
func TestStartKillCycles(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	startKillCycles(t, ctx, c, "iptables dataplane", func(i int) { checkCycleIPTables(t, ctx, c, i) })

	a := startAgent(t, ctx, c)
	want := checkFinalIPTables(t, ctx, c)
	client := newClientPod(t, ctx, c, "e2e-cycles", "client")
	before := forwarded(t, ctx, a)
	quick, cancelQuick := context.WithTimeout(ctx, 20*time.Second)
	defer cancelQuick()
	mustKubectl(t, quick, client, "get", "configmaps")
	if after := forwarded(t, ctx, a); after <= before {
		t.Errorf("request through the VIP not forwarded by the agent (%v -> %v)", before, after)
	}
	if active := activeUpstream(t, ctx, a); !strings.HasPrefix(active, "10.250.0.") {
		t.Errorf("active upstream %q is not an apiserver endpoint", active)
	}
	figuref(t, "final state: %+v", want)
}

// startKillCycles starts 100 agents with args one after the other, each
// killed with SIGKILL at a random point of its start-up or, every fourth,
// once it serves; after each, check looks at the node.
func startKillCycles(t *testing.T, ctx context.Context, c *sandbox.Cluster, what string, check func(i int), args ...string) {
	t.Helper()
	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	full := c.AgentArgs(certFile, keyFile, args...)
	const cycles = 100
	readyKills := 0
	start := time.Now()
	for i := range cycles {
		proc, err := pod.Start(agentBin, full...)
		if err != nil {
			t.Fatal(err)
		}
		a := &sandbox.Agent{Pod: pod, Process: proc}
		if i%4 == 0 {
			if err := a.WaitReady(ctx); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
			readyKills++
		} else {
			time.Sleep(time.Duration(rand.IntN(600)) * time.Millisecond)
		}
		_ = proc.Signal(syscall.SIGKILL)
		_ = proc.Wait(10 * time.Second)
		if done, _ := proc.Exited(); !done {
			t.Fatalf("cycle %d: agent did not die", i)
		}
		check(i)
	}
	figuref(t, "%s: %d start/kill cycles (%d killed while serving) in %s", what, cycles, readyKills, time.Since(start).Round(time.Second))
}

// checkCycleIPTables fails the test if the iptables dataplane's state was
// duplicated by cycle i: more than one chain with its four rules, jump per
// hook, set, entry or address.
func checkCycleIPTables(t *testing.T, ctx context.Context, c *sandbox.Cluster, i int) {
	t.Helper()
	if s := readNodeState(t, ctx, c); s.Chains > 1 || s.Jumps > 2 || s.ChainRules > 4 || s.Sets > 1 || s.Entries > 1 || s.Addresses > 1 {
		t.Fatalf("cycle %d: duplicated state: %+v", i, s)
	}
}

// checkFinalIPTables fails the test unless the node holds exactly one
// running agent's iptables dataplane, and returns that state.
func checkFinalIPTables(t *testing.T, ctx context.Context, c *sandbox.Cluster) nodeState {
	t.Helper()
	want := nodeState{Chains: 1, ChainRules: 4, Jumps: 2, Sets: 1, Entries: 1, Addresses: 1, JumpFirst: true, ReturnFirst: true}
	if got := readNodeState(t, ctx, c); got != want {
		nat, addrs, _ := c.NodeNetState(ctx)
		t.Fatalf("node state after the cycles = %+v, want %+v\n%s\n%s", got, want, nat, addrs)
	}
	return want
}

// activeUpstream returns the endpoint the agent sends requests to, from its
// metrics.
func activeUpstream(t *testing.T, ctx context.Context, a *sandbox.Agent) string {
	t.Helper()
	for ep, v := range upstreamGauge(t, ctx, a, "kube_apicache_upstream_endpoint_active") {
		if v == 1 {
			return ep
		}
	}
	return ""
}

// upstreamGauge returns a per-endpoint gauge of the agent.
func upstreamGauge(t *testing.T, ctx context.Context, a *sandbox.Agent, name string) map[string]float64 {
	t.Helper()
	return sumBy(scrapeAgent(t, ctx, a)[name], "endpoint")
}

// waitFor polls cond every 50ms until it holds, failing after timeout. It
// returns how long it took.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestRulesRestored: given a running agent with --sync-period=2s, when
// someone deletes or reorders its jumps, deletes its DNAT rule, empties its
// liveness set or removes its address, then each is put back within one
// sync period.
func TestRulesRestored(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const period = 2 * time.Second
	startAgent(t, ctx, c, "--sync-period="+period.String())
	want := readNodeState(t, ctx, c)
	if !want.JumpFirst || want.Chains != 1 || want.Entries != 1 || want.Addresses != 1 {
		t.Fatalf("unexpected initial state %+v", want)
	}
	jump := []string{"-m", "comment", "--comment", "kube-apicache: redirect the kubernetes Service VIP", "-j", sandbox.AgentChain}
	// The PREROUTING jump carries the sandbox's detect-local match.
	preJump := append([]string{"-s", sandbox.ClusterPodCIDR}, jump...)
	ipt := func(args ...string) {
		t.Helper()
		if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-t", "nat"}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		change func()
	}{
		{"jump deleted from PREROUTING", func() { ipt(append([]string{"-D", "PREROUTING"}, preJump...)...) }},
		{"jump moved behind kube-proxy in OUTPUT", func() {
			ipt(append([]string{"-D", "OUTPUT"}, jump...)...)
			ipt(append([]string{"-A", "OUTPUT"}, jump...)...)
		}},
		{"DNAT rule deleted", func() { ipt("-D", sandbox.AgentChain, "4") }},
		{"marked-traffic RETURN moved last", func() {
			ipt("-D", sandbox.AgentChain, "1")
			ipt("-A", sandbox.AgentChain, "-m", "mark", "--mark", "0x1000/0x1000", "-j", "RETURN")
		}},
		{"liveness set flushed", func() {
			if err := c.Node.Run(ctx, "ipset", "flush", sandbox.AgentLivenessSet); err != nil {
				t.Fatal(err)
			}
		}},
		{"listen address deleted", func() {
			link := "lo"
			if _, addrs, _ := c.NodeNetState(ctx); strings.Contains(addrs, "kube-apicache0") {
				link = "kube-apicache0"
			}
			if err := c.Node.Run(ctx, "ip", "addr", "del", sandbox.AgentListenIP+"/32", "dev", link); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		changed := time.Now()
		tc.change()
		if readNodeState(t, ctx, c) == want {
			// The liveness loop can win the race with the look that
			// follows the change.
			figuref(t, "%s: restored within %s, before it could be seen", tc.name, time.Since(changed).Round(10*time.Millisecond))
			continue
		}
		took := waitFor(t, period+2*time.Second, tc.name+" restored", func() bool { return readNodeState(t, ctx, c) == want })
		figuref(t, "%s: restored after %s (sync period %s)", tc.name, took.Round(10*time.Millisecond), period)
		// took includes the polling (three commands per look).
		if took > period+time.Second {
			t.Errorf("%s: restored after %s, more than one sync period", tc.name, took)
		}
	}
}

// TestAPIServerEndpointStopped: given two apiservers, an agent that learnt
// both from the kubernetes EndpointSlice and sends to the second, and a pod
// reading and writing through it, when the second apiserver dies, then
// the agent fails over and every read keeps succeeding through the agent.
func TestAPIServerEndpointStopped(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ass := c.APIServers()
	if len(ass) < 2 {
		t.Fatalf("the sandbox runs %d apiserver(s); this needs 2", len(ass))
	}
	victim, other := ass[1], ass[0]
	pod := newClientPod(t, ctx, c, "e2e-apiserver-down", "client")
	// Bootstrapped with the victim only: it becomes the active endpoint, and
	// the other is learnt from the EndpointSlice.
	a := startAgent(t, ctx, c, "--upstream="+victim.URL)
	waitFor(t, 30*time.Second, "both endpoints learnt from the EndpointSlice", func() bool {
		return len(upstreamGauge(t, ctx, a, "kube_apicache_upstream_endpoint_healthy")) == 2
	})
	if got := activeUpstream(t, ctx, a); got != strings.TrimPrefix(victim.URL, "https://") {
		t.Fatalf("active upstream %s, want %s", got, victim.URL)
	}
	before := forwarded(t, ctx, a)
	load := startLoad(t, pod, "load", true)
	time.Sleep(2 * time.Second)

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.StartAPIServer(ctx, victim); err != nil {
			t.Errorf("restarting %s: %v", victim.Addr, err)
		}
	})
	// Killed rather than stopped gracefully: it fails its requests in
	// flight and gives no notice (a graceful stop first fails /readyz).
	stopStart := time.Now()
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Process.Wait(10 * time.Second)
	stopped := time.Since(stopStart)
	time.Sleep(8 * time.Second)
	res := load.stop()
	after := forwarded(t, ctx, a)
	active := activeUpstream(t, ctx, a)
	figuref(t, "apiserver %s killed (exited after %s); load: %s; agent forwarded %v requests meanwhile; active upstream now %s",
		victim.Addr, stopped.Round(time.Millisecond), res, after-before, active)
	if res.FailedReads != 0 {
		t.Errorf("%d reads failed:\n%s", res.FailedReads, res.firstFailures(5))
	}
	if res.FailedWrites != 0 {
		// A write in flight on the killed apiserver may have been applied:
		// it is answered with an error, never sent again.
		t.Logf("writes that failed (in flight at the kill):\n%s", res.firstFailures(5))
	}
	if active != strings.TrimPrefix(other.URL, "https://") {
		t.Errorf("active upstream %s, want %s", active, other.URL)
	}
	// The load's requests plus its initial create, all through the agent.
	if after-before < float64(res.OK+res.Failed) {
		t.Errorf("the agent forwarded %v of %d requests: reads did not go through it", after-before, res.OK+res.Failed)
	}
}

// TestSelfCheckKeepsAgentOut: given a node where the redirect cannot take
// effect for the node's own connections (here a raw-table NOTRACK rule
// keeps them out of NAT, as a socket-level load balancer keeps them out of
// netfilter), when the agent starts, then its self-check fails, it removes
// its redirect, reports not-ready with the reason, and takes over once the
// obstacle is gone.
func TestSelfCheckKeepsAgentOut(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	notrack := []string{"OUTPUT", "-d", sandbox.ServiceVIP + "/32", "-p", "tcp", "--dport", strconv.Itoa(sandbox.ServicePort), "-j", "NOTRACK"}
	if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-t", "raw", "-I"}, notrack...)...); err != nil {
		t.Fatal(err)
	}
	removed := false
	removeObstacle := func() {
		if !removed {
			removed = true
			if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-t", "raw", "-D"}, notrack...)...); err != nil {
				t.Error(err)
			}
		}
	}
	defer removeObstacle()

	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	proc, err := pod.Start(agentBin, c.AgentArgs(certFile, keyFile, "--sync-period=2s")...)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "agent", 0, 40*time.Second)
	var code int
	var body string
	waitFor(t, 30*time.Second, "/intercepting reporting the failed self-check", func() bool {
		code, body, _ = agentEndpoint(ctx, c, "/intercepting")
		return strings.Contains(body, "self-check failed")
	})
	figuref(t, "/intercepting with the obstacle: %d %s", code, body)
	if code != http.StatusServiceUnavailable {
		t.Errorf("/intercepting = %d, want 503", code)
	}
	// The agent stepped aside deliberately: it is ready, so a DaemonSet
	// rollout goes on past this node.
	if code, body, err := agentEndpoint(ctx, c, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz while stepped aside = %d %q (%v), want 200", code, body, err)
	}
	// Between two attempts (the next one waits at least a sync period), no
	// redirect is left in place.
	if s := readNodeState(t, ctx, c); s.Jumps != 0 || s.Entries != 0 {
		t.Errorf("redirect in force while the self-check fails: %+v", s)
	}
	if !strings.Contains(proc.Log(), "self-check failed") {
		t.Errorf("the agent did not log why it stays out")
	}

	removeObstacle()
	took := waitFor(t, 30*time.Second, "agent ready once the obstacle is gone", func() bool {
		code, _, _ := agentEndpoint(ctx, c, "/intercepting")
		return code == http.StatusOK
	})
	figuref(t, "intercepting %s after the obstacle was removed (sync period 2s, retries back off)", took.Round(10*time.Millisecond))
	if s := readNodeState(t, ctx, c); !s.JumpFirst || s.Entries != 1 {
		t.Errorf("node state once ready: %+v", s)
	}
}

// TestDetectLocalPodIPs: given an agent in the default detect-local mode,
// which intercepts only the IPs of the pods the API places on this node,
// when a pod is created, then its VIP connections reach the agent once its
// IP is in the agent's set; and when the Pod object is deleted while its
// network stays (standing for VIP traffic routed in from elsewhere: a
// source that is no pod of this node), then its connections go to
// kube-apiserver through kube-proxy again, while the host is still
// intercepted.
func TestDetectLocalPodIPs(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	startAgent(t, ctx, c, "--detect-local-mode=PodIPs")
	ns := "detect-local"
	created := time.Now()
	pod := newClientPod(t, ctx, c, ns, "local-pod")
	pool := podCAPool(t, pod)
	agentCN := "system:node:" + sandbox.NodeName
	servedBy := func() string {
		leaf, err := servedLeaf(ctx, pod, pool, "kubernetes.default.svc")
		if err != nil {
			return "error: " + err.Error()
		}
		if leaf.Subject.CommonName == agentCN {
			return "agent"
		}
		return "apiserver"
	}
	took := waitFor(t, 20*time.Second, "the new pod's VIP connections reach the agent", func() bool { return servedBy() == "agent" })
	figuref(t, "detect-local PodIPs: a new pod intercepted %s after its creation began (%s after the pod was set up)",
		time.Since(created).Round(time.Millisecond), took.Round(time.Millisecond))

	if err := c.Admin.CoreV1().Pods(ns).Delete(ctx, "local-pod", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 20*time.Second, "a source that is no pod of this node goes to kube-proxy's path", func() bool { return servedBy() == "apiserver" })
	figuref(t, "detect-local PodIPs: %s after its Pod object went, the same source reaches kube-apiserver through kube-proxy", took.Round(time.Millisecond))
	if code, body, err := agentEndpoint(ctx, c, "/intercepting"); code != http.StatusOK {
		t.Errorf("/intercepting = %d %q (%v): the host must stay intercepted", code, body, err)
	}
}

// TestPodPathBlocked: given an intercepting agent and a pod whose traffic
// to the agent's listen address a filter drops (as Calico applies a pod's
// egress policy to pod-to-host traffic, or a host firewall that drops
// INPUT except on lo) while the node's own path, which the self-check
// tests, is fine, when the pod opens a connection to the VIP, then it
// reaches kube-apiserver through kube-proxy within TCP's second SYN retry
// (the first and the retry after it both unanswered: no single packet
// decides),
// and the agent says why on /intercepting and in its metrics, while other
// sources stay intercepted.
func TestPodPathBlocked(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	a := startAgent(t, ctx, c)
	pod := newClientPod(t, ctx, c, "pod-path", "blocked-pod")
	pool := podCAPool(t, pod)
	servedByAgent := func() bool {
		leaf, err := servedLeaf(ctx, pod, pool, "kubernetes.default.svc")
		return err == nil && leaf.Subject.CommonName == "system:node:"+sandbox.NodeName
	}
	waitFor(t, 10*time.Second, "the pod is intercepted", servedByAgent)

	drop := []string{"-s", pod.IP, "-d", sandbox.AgentListenIP, "-p", "tcp", "--dport", strconv.Itoa(sandbox.AgentListenPort), "-j", "DROP"}
	if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-I", "INPUT"}, drop...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Node.Run(context.Background(), append([]string{"iptables", "-w", "-D", "INPUT"}, drop...)...)
	})

	client := vipClient(t, pod, false)
	start := time.Now()
	resp, err := client.Get(vipURL("/version"))
	took := time.Since(start)
	if err != nil {
		text, _ := a.Metrics(ctx)
		nat, _, _ := c.NodeNetState(ctx)
		sets, _ := c.NodeSets(ctx)
		ct, _ := c.Node.Output(ctx, "conntrack", "-L", "-d", sandbox.ServiceVIP)
		t.Fatalf("GET /version from the blocked pod: %v (after %s)\n%s\n%s\n%s\n%s", err, took, grepLines(text, "pod_path"), nat, sets, ct)
	}
	resp.Body.Close()
	figuref(t, "pod-path: a pod whose traffic to the agent is dropped reached kube-apiserver through kube-proxy %s after its request began (TCP retries its SYN after 1s, then 2s; 3s before Linux 6.5)", took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("the blocked pod took %s to reach kube-apiserver, want about two SYN retries (2s, 3s before Linux 6.5)", took)
	}
	if servedByAgent() {
		t.Error("the blocked pod is still sent to the agent")
	}
	code, body, err := agentEndpoint(ctx, c, "/intercepting")
	if code != http.StatusOK || !strings.Contains(body, "dropped on the way") || !strings.Contains(body, pod.IP) {
		t.Errorf("/intercepting = %d %q (%v), want ok with the blocked source", code, body, err)
	}
	figuref(t, "pod-path: /intercepting: %s", body)
	text, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `kube_apicache_pod_path_blocked_total{family="IPv4"} 1`) {
		t.Errorf("metrics lack one blocked connection:\n%s", grepLines(text, "pod_path"))
	}
	// Another pod is still intercepted.
	other := newClientPod(t, ctx, c, "pod-path", "other-pod")
	otherPool := podCAPool(t, other)
	servedOther := func() bool {
		leaf, err := servedLeaf(ctx, other, otherPool, "kubernetes.default.svc")
		return err == nil && leaf.Subject.CommonName == "system:node:"+sandbox.NodeName
	}
	waitFor(t, 10*time.Second, "another pod is still intercepted", servedOther)
	// and stays so, connection after connection, over several scans: an
	// answered connection is never taken for a blocked one.
	for i := range 8 {
		time.Sleep(300 * time.Millisecond)
		if !servedOther() {
			t.Fatalf("connection %d of the other pod did not reach the agent", i+1)
		}
	}
	if text, err := a.Metrics(ctx); err != nil || !strings.Contains(text, `kube_apicache_pod_path_blocked_total{family="IPv4"} 1`) {
		t.Errorf("blocked connections other than the filtered pod's:\n%s", grepLines(text, "pod_path"))
	}
}

// TestCleanupAfterKill: given an agent SIGKILLed while intercepting, which
// leaves its address, sets and rules on the node (inert: the liveness entry
// expires, and the VIP goes to kube-proxy), when `kube-apicache cleanup`
// runs on the node, then it reports and removes all of it, and a second
// run finds nothing.
func TestCleanupAfterKill(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	a := startAgent(t, ctx, c)
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(t, a.Process, 10*time.Second)
	if s := readNodeState(t, ctx, c); s.Chains != 1 || s.Addresses != 1 || s.Sets != 1 {
		t.Fatalf("state after SIGKILL: %+v, want the chain, address and set left behind", s)
	}
	out, err := a.Pod.Command(ctx, agentBin, "cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("kube-apicache cleanup: %v\n%s", err, out)
	}
	for _, want := range []string{
		"removed chain nat/" + sandbox.AgentChain + " and its jumps",
		"removed ipset " + sandbox.AgentLivenessSet,
		"removed address " + sandbox.AgentListenIP,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cleanup output lacks %q:\n%s", want, out)
		}
	}
	figuref(t, "cleanup after SIGKILL:\n%s", strings.TrimSpace(string(out)))
	assertNoAgentState(t, ctx, c)
	out, err = a.Pod.Command(ctx, agentBin, "cleanup").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nothing of kube-apicache found") {
		t.Errorf("second cleanup: %v\n%s", err, out)
	}
}
