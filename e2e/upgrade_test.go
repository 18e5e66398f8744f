package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The objects an upgrade applies apart from the others, in the order of
// docs/operations/upgrade.md.
func isApprover(o sandbox.ManifestObject) bool {
	return o.Kind == "Deployment" && o.Name == "kube-apicache-approver"
}

func isAgents(o sandbox.ManifestObject) bool {
	return o.Kind == "DaemonSet" && o.Name == "kube-apicache"
}

func isConfig(o sandbox.ManifestObject) bool {
	return o.Kind == "ConfigMap" && o.Name == "kube-apicache-config"
}

// TestRealNodeUpgrade: the upgrade from the previous commit (make
// upgrade-images: its own agent image and its own manifests) to this
// tree's, and the rollback, on the real node with kube-proxy in nftables
// mode and the shipped configuration of each release.
//
//  1. Given the previous release installed (kubectl apply of its rendered
//     manifests) and intercepting.
//  2. When two load clients read and write through the VIP (a new
//     connection per request, and one reused HTTP/2 connection), and this
//     tree's manifests are applied in the upgrade page's order (the approver,
//     then the agents, then the configuration, restarting both if it
//     changed), and then the previous ones in the reverse order (the
//     configuration first, then the agents, then the approver), then no
//     request fails, and the agent serving the load is the previous
//     release's before the upgrade and after the rollback and this one's
//     in between (its forwarded requests grow; kube_apicache_build_info
//     names the commit).
//  3. When the manifests are deleted, then the node holds nothing of the
//     agent's.
func TestRealNodeUpgrade(t *testing.T) {
	images := requireRealNode(t)
	prev := requirePreviousRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	testStart := time.Now()
	hostBefore := snapshotHost(t)

	current := filepath.Join(t.TempDir(), "current.yaml")
	rendered, err := sandbox.RenderOverlay(ctx, writeOverlay(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(current, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	c, rn, stop := startRealNodeSandbox(t, ctx, realNodeBinDir(), append(images, prev.Image), "nftables")
	figuref(t, "real node up in %s; upgrading from %s", rn.Timings.KubeProxy, prev.Revision)

	u := &upgradeScenario{
		dsScenario: &dsScenario{c: c, node: rn, nft: true, rendered: prev.Manifests},
		prev:       prev,
		previous:   loadManifest(t, prev.Manifests),
		current:    loadManifest(t, current),
	}
	for _, step := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context)
	}{
		{"install-previous", u.installPrevious},
		{"upgrade-and-rollback", u.upgradeAndRollback},
		{"uninstall", u.uninstall},
	} {
		stepStart := time.Now()
		ok := t.Run(step.name, func(t *testing.T) { step.run(t, ctx) })
		t.Logf("step %s took %s", step.name, time.Since(stepStart).Round(time.Millisecond))
		if !ok {
			u.dumpAgent(t, ctx)
			t.Fatalf("step %s failed; the later steps depend on it", step.name)
		}
	}

	if err := stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	hostBefore.checkRestored(t, rn)
	if !t.Failed() {
		figuref(t, "whole scenario %s, teardown included; nothing left on the machine", time.Since(testStart).Round(time.Second))
	}
}

// requirePreviousRelease returns what make upgrade-images built. It skips
// when the clone lacks the previous revision (a shallow clone; CI=true
// fails instead), and fails when the artefacts are missing or were built
// from another revision than the one wanted now.
func requirePreviousRelease(t *testing.T) *sandbox.PreviousRelease {
	t.Helper()
	prev, err := sandbox.LoadPreviousRelease(sandbox.UpgradeDir())
	if errors.Is(err, sandbox.ErrNoPreviousRevision) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	want, err := sandbox.WantedPreviousRevision(context.Background())
	switch {
	case err != nil:
		t.Logf("cannot tell whether %s is still the previous revision: %v", prev.Revision, err)
	case want != prev.Revision:
		t.Fatalf("the previous release in %s is %s, but the previous revision is now %s: make upgrade-images", sandbox.UpgradeDir(), prev.Revision, want)
	}
	return prev
}

func loadManifest(t *testing.T, path string) []sandbox.ManifestObject {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := sandbox.SplitManifest(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, want := range []func(sandbox.ManifestObject) bool{isApprover, isAgents, isConfig} {
		found := false
		for _, o := range objs {
			found = found || want(o)
		}
		if !found {
			t.Fatalf("%s lacks the approver's Deployment, the agents' DaemonSet or their ConfigMap", path)
		}
	}
	return objs
}

// upgradeScenario is the state the steps of TestRealNodeUpgrade hand on.
type upgradeScenario struct {
	*dsScenario
	prev              *sandbox.PreviousRelease
	previous, current []sandbox.ManifestObject
	// agentLogs follow each agent pod the scenario replaces, so that a
	// failed request can be read against its shutdown (the pod and its
	// log are gone once the rollout is over).
	agentLogs []*followedAgent
}

type followedAgent struct {
	name string
	log  *podLog
}

// apply applies the objects of objs that keep selects with kubectl apply,
// from a file named after what they are.
func (u *upgradeScenario) apply(t *testing.T, ctx context.Context, name string, objs []sandbox.ManifestObject, keep func(sandbox.ManifestObject) bool) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	n, err := sandbox.JoinManifest(path, objs, keep)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatalf("%s: no objects to apply", name)
	}
	t.Logf("kubectl apply (%s):\n%s", name, u.mustKubectl(t, ctx, "apply", "-f", path))
}

// rolloutStatus waits for a workload's rollout, and returns how long the
// rollout took since start.
func (u *upgradeScenario) rolloutStatus(t *testing.T, ctx context.Context, workload string, start time.Time) time.Duration {
	t.Helper()
	u.mustKubectl(t, ctx, "-n", sandbox.AgentNamespace, "rollout", "status", workload, "--timeout=3m")
	return time.Since(start)
}

// rollAgents waits, after the DaemonSet was changed at start, for its
// rollout, a new pod Ready and intercepting the load, and checks that it
// runs the commit wantPrevious says. It returns the time to intercepting.
func (u *upgradeScenario) rollAgents(t *testing.T, ctx context.Context, start time.Time, old types.UID, wantPrevious bool) time.Duration {
	t.Helper()
	u.rolloutStatus(t, ctx, "daemonset/kube-apicache", start)
	u.waitAgentReady(t, ctx, time.Minute, old)
	waitFor(t, 30*time.Second, "the new agent intercepts the load", func() bool { return u.intercepting(t, ctx) })
	took := time.Since(start)
	commit := u.agentCommit(t, ctx)
	if (commit == u.prev.Revision) != wantPrevious {
		t.Errorf("the agent runs commit %q; previous release %s, want it to be the previous release: %v", commit, u.prev.Revision, wantPrevious)
	}
	return took
}

// agentCommit is the commit the running agent was built from
// (kube_apicache_build_info).
func (u *upgradeScenario) agentCommit(t *testing.T, ctx context.Context) string {
	t.Helper()
	text, err := u.agentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range parseMetrics(t, text)["kube_apicache_build_info"] {
		return m.labels["git_commit"]
	}
	return ""
}

// replacing returns the UID of the agent pod a rollout is about to
// replace, and follows its log until it ends.
func (u *upgradeScenario) replacing(t *testing.T, ctx context.Context) types.UID {
	t.Helper()
	p, err := u.agentPod(ctx)
	if err != nil || p == nil {
		t.Fatalf("no agent pod: %v", err)
	}
	u.agentLogs = append(u.agentLogs, &followedAgent{name: p.Name, log: followPodLog(ctx, u.c, sandbox.AgentNamespace, p.Name)})
	return p.UID
}

// checkFlowsForgotten checks that the agent the rollback replaced, this
// tree's, deleted at shutdown the conntrack flows its redirect left: the
// connection-per-request load leaves some, and a reused one would be
// refused.
func (u *upgradeScenario) checkFlowsForgotten(t *testing.T) {
	t.Helper()
	a := u.agentLogs[len(u.agentLogs)-1]
	select {
	case <-a.log.done:
	case <-time.After(30 * time.Second):
		t.Errorf("the log of the replaced agent %s is still open", a.name)
		return
	}
	lines := a.log.matching("Deleted the conntrack flows the redirect left")
	if len(lines) == 0 {
		t.Errorf("the replaced agent %s did not log the flows it deleted at shutdown; its log ends:\n%s", a.name, tailLines(a.log.String(), 25))
		return
	}
	figuref(t, "rollback: the replaced agent deleted the flows its redirect left:\n%s", strings.Join(lines, "\n"))
}

// logReplacedAgents logs the end of each replaced agent's log: its
// shutdown.
func (u *upgradeScenario) logReplacedAgents(t *testing.T) {
	t.Helper()
	for _, a := range u.agentLogs {
		t.Logf("replaced agent %s, end of its log:\n%s", a.name, tailLines(a.log.String(), 25))
	}
}

// installPrevious: given the previous release's rendered manifests
// applied, then its approver is Available, its agent Ready and
// intercepting.
func (u *upgradeScenario) installPrevious(t *testing.T, ctx context.Context) {
	start := time.Now()
	t.Logf("kubectl apply -f:\n%s", u.mustKubectl(t, ctx, "apply", "-f", u.prev.Manifests))
	approver := u.rolloutStatus(t, ctx, "deployment/kube-apicache-approver", start)
	agents := u.rolloutStatus(t, ctx, "daemonset/kube-apicache", start)
	u.waitAgentReady(t, ctx, time.Minute, "")
	took := waitFor(t, time.Minute, "the previous agent intercepts", func() bool {
		code, _, _ := agentEndpoint(ctx, u.c, "/intercepting")
		return code == http.StatusOK
	})
	if commit := u.agentCommit(t, ctx); commit != u.prev.Revision {
		t.Errorf("the previous agent reports commit %q, want %s", commit, u.prev.Revision)
	}
	figuref(t, "install-previous: approver rolled out %s, DaemonSet %s after the apply, intercepting %s later",
		approver.Round(time.Millisecond), agents.Round(time.Millisecond), took.Round(time.Millisecond))
}

// upgradeAndRollback: when two load clients run through the VIP and the
// current manifests are rolled out in the upgrade page's order, then the
// previous ones in the reverse order, then no request fails.
func (u *upgradeScenario) upgradeAndRollback(t *testing.T, ctx context.Context) {
	u.setUpClients(t, ctx)
	// The uninstall step checks a pod's kubectl through this one.
	u.reader = u.runClient(t, ctx, "reader", "informers", "--timeout", "9m")
	if err := u.reader.log.awaitLine("SYNCED", time.Minute); err != nil {
		t.Fatal(err)
	}
	flows := recordConntrack(t, ctx, u.c)
	newConn := u.startLoad(t, ctx, "load-newconn", true)
	reused := u.startLoad(t, ctx, "load-http2", false)
	waitFor(t, 30*time.Second, "the loads go through the previous agent", func() bool { return u.intercepting(t, ctx) })
	window := time.Now()
	configChanged := !bytes.Equal(configYAML(u.previous), configYAML(u.current))

	// Upgrade. The approver first: everything but the agents and the
	// configuration.
	start := time.Now()
	u.apply(t, ctx, "upgrade-approver", u.current, func(o sandbox.ManifestObject) bool { return !isAgents(o) && !isConfig(o) })
	upApprover := u.rolloutStatus(t, ctx, "deployment/kube-apicache-approver", start)
	// Then the agents, with the configuration unchanged.
	old := u.replacing(t, ctx)
	start = time.Now()
	u.apply(t, ctx, "upgrade-agents", u.current, func(o sandbox.ManifestObject) bool { return !isConfig(o) })
	upAgents := u.rollAgents(t, ctx, start, old, false)
	// Then the configuration, and a restart of what reads it if it
	// changed: the approver, then the agents.
	var upConfig time.Duration
	if configChanged {
		start = time.Now()
		u.apply(t, ctx, "upgrade-config", u.current, func(sandbox.ManifestObject) bool { return true })
		u.mustKubectl(t, ctx, "-n", sandbox.AgentNamespace, "rollout", "restart", "deployment/kube-apicache-approver")
		u.rolloutStatus(t, ctx, "deployment/kube-apicache-approver", start)
		old = u.replacing(t, ctx)
		u.mustKubectl(t, ctx, "-n", sandbox.AgentNamespace, "rollout", "restart", "daemonset/kube-apicache")
		upConfig = u.rollAgents(t, ctx, start, old, false)
	}

	// Rollback, in the reverse order. The previous configuration first, so
	// that the previous release can decode it.
	var downConfig time.Duration
	if configChanged {
		start = time.Now()
		u.apply(t, ctx, "rollback-config", u.previous, isConfig)
		downConfig = time.Since(start)
	}
	// Then the agents.
	old = u.replacing(t, ctx)
	start = time.Now()
	u.apply(t, ctx, "rollback-agents", u.previous, func(o sandbox.ManifestObject) bool { return !isApprover(o) })
	downAgents := u.rollAgents(t, ctx, start, old, true)
	u.checkFlowsForgotten(t)
	// Then the approver.
	start = time.Now()
	u.apply(t, ctx, "rollback-approver", u.previous, func(sandbox.ManifestObject) bool { return true })
	downApprover := u.rolloutStatus(t, ctx, "deployment/kube-apicache-approver", start)
	// And the previous agent still serves the load afterwards.
	waitFor(t, 30*time.Second, "the previous agent intercepts the load after the rollback", func() bool { return u.intercepting(t, ctx) })
	whole := time.Since(window)

	resNew := u.stopLoad(t, ctx, newConn)
	resReused := u.stopLoad(t, ctx, reused)
	upConfigText, downConfigText := "unchanged", "unchanged"
	if configChanged {
		upConfigText = "applied, approver and agents restarted, intercepting after " + upConfig.Round(time.Millisecond).String()
		downConfigText = "applied in " + downConfig.Round(time.Millisecond).String()
	}
	figuref(t, "upgrade: approver rolled out %s; agents rolled out and intercepting %s; configuration %s",
		upApprover.Round(time.Millisecond), upAgents.Round(time.Millisecond), upConfigText)
	figuref(t, "rollback: configuration %s; agents rolled out and intercepting %s; approver rolled out %s",
		downConfigText, downAgents.Round(time.Millisecond), downApprover.Round(time.Millisecond))
	figuref(t, "upgrade and rollback: %s from the first apply to the previous agent intercepting again", whole.Round(time.Millisecond))
	figuref(t, "upgrade and rollback: new connection per request: %s", resNew)
	figuref(t, "upgrade and rollback: one reused HTTP/2 connection: %s", resReused)
	for name, res := range map[string]loadResult{"new-conn": resNew, "http2": resReused} {
		if res.Failed > 0 {
			t.Errorf("%s load: %d requests failed during the upgrade and rollback:\n%s", name, res.Failed, res.firstFailures(5))
		}
		if res.OK < minLoadOK {
			t.Errorf("%s load: only %d requests succeeded, want at least %d", name, res.OK, minLoadOK)
		}
	}
	if resNew.Failed+resReused.Failed > 0 {
		u.logReplacedAgents(t)
		for _, at := range append(failedAt(resNew), failedAt(resReused)...) {
			t.Logf("the node's conntrack events for %s within 300ms of the failure at %s:\n%s",
				sandbox.ServiceVIP, at.Format(time.RFC3339Nano), strings.Join(flows.around(at, 300*time.Millisecond), "\n"))
		}
	}
}

// configYAML is the agents' ConfigMap as rendered, or nil.
func configYAML(objs []sandbox.ManifestObject) []byte {
	for _, o := range objs {
		if isConfig(o) {
			return o.YAML
		}
	}
	return nil
}

// conntrackEvents records the node's connection-tracking events for the
// Service VIP (conntrack -E) while a scenario runs, so that a failed
// connection can be read against what the kernel did with it: which NAT
// target it got, and whether it reused a tracked flow.
type conntrackEvents struct {
	mu    sync.Mutex // protects lines
	lines []string
}

func recordConntrack(t *testing.T, ctx context.Context, c *sandbox.Cluster) *conntrackEvents {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.Node.Name(),
		"conntrack", "-E", "-p", "tcp", "--orig-dst", sandbox.ServiceVIP, "-o", "timestamp")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Logf("conntrack -E: %v; no connection-tracking events recorded", err)
		cancel()
		return &conntrackEvents{}
	}
	e := &conntrackEvents{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			e.mu.Lock()
			e.lines = append(e.lines, sc.Text())
			e.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return e
}

// around returns the events within d of at (conntrack's timestamps are
// "[seconds.microseconds]" at the start of each line).
func (e *conntrackEvents) around(at time.Time, d time.Duration) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, l := range e.lines {
		end := strings.IndexByte(l, ']')
		if !strings.HasPrefix(l, "[") || end < 0 {
			continue
		}
		secs, err := strconv.ParseFloat(l[1:end], 64)
		if err != nil {
			continue
		}
		ts := time.Unix(0, int64(secs*float64(time.Second)))
		if ts.After(at.Add(-d)) && ts.Before(at.Add(d)) {
			out = append(out, l)
		}
	}
	return out
}

// failedAt is the start time of each of a load's failed requests.
func failedAt(res loadResult) []time.Time {
	var out []time.Time
	for _, f := range res.Failures {
		for _, field := range strings.Fields(f) {
			if v, ok := strings.CutPrefix(field, "at="); ok {
				if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
					out = append(out, ts)
				}
			}
		}
	}
	return out
}
