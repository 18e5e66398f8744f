package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// approverLease is the Lease the approver replicas elect their leader with.
const approverLease = "kube-apicache-approver"

// startApproverReplica runs one replica of the approver Deployment (leader
// election on, its default flags plus extra) in a pod of its own.
func startApproverReplica(t *testing.T, ctx context.Context, c *sandbox.Cluster, extra ...string) (*sandbox.Pod, *sandbox.Process) {
	t.Helper()
	pod := newSystemPod(t, ctx, c, "approver", "kube-apicache-approver", false)
	proc, err := pod.Start(agentBin, append([]string{"approver", "-v=2"}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "approver "+pod.Spec.Name, 40, 10*time.Second)
	return pod, proc
}

// approverMetricsAddr is the approver's metrics listener, on the pod's
// network (--metrics-bind-address=:10446).
const approverMetricsAddr = "127.0.0.1:10446"

// approverGet fetches path from an approver's metrics listener over HTTPS,
// inside its pod, with token as the bearer token ("" sends none).
func approverGet(ctx context.Context, pod *sandbox.Pod, path, token string) (int, string, error) {
	code, b, err := sandbox.AgentGetWithToken(ctx, pod.NetNS, approverMetricsAddr, path, token, 5*time.Second)
	return code, string(b), err
}

// leaseHolder returns the approver Lease's holder, or "".
func leaseHolder(ctx context.Context, c *sandbox.Cluster) string {
	l, err := c.Admin.CoordinationV1().Leases(sandbox.AgentNamespace).Get(ctx, approverLease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// newAgentCSRs returns the agent's CSRs not in before (names), oldest
// first.
func newAgentCSRs(t *testing.T, ctx context.Context, c *sandbox.Cluster, before map[string]bool) []certificatesv1.CertificateSigningRequest {
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range agentCSRs(t, ctx, c) {
		if !before[csr.Name] {
			out = append(out, csr)
		}
	}
	return out
}

// TestCertificatesAtFleetScale is the fleet-scale certificate scenario on
// one node, in order:
//
//  1. Given two approver replicas, one holds the Lease and decides, the
//     other stands by; both answer /healthz and /readyz, and the leader's
//     metrics say so.
//  2. When an agent with a certificate state directory gets its
//     certificate and is then killed (SIGKILL, as an OOM kill) and
//     restarted, then it serves the same certificate again without a new
//     CSR.
//  3. When the leader stops, the standby takes the Lease and approves the
//     agent's next CSR (SIGHUP).
//  4. Given an approver whose flags do not match the agent's, the agent's
//     CSR is denied and it sends no other, also across a restart, and says
//     why (/intercepting or /readyz); once the approver is fixed, SIGHUP
//     gets the certificate.
func TestCertificatesAtFleetScale(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	before := map[string]bool{}
	for _, csr := range agentCSRs(t, ctx, c) {
		before[csr.Name] = true
	}
	t.Cleanup(func() {
		// Leave no CSR or Lease behind for the other CSR tests.
		for _, csr := range newAgentCSRs(t, context.Background(), c, before) {
			_ = c.Admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
		}
		_ = c.Admin.CoordinationV1().Leases(sandbox.AgentNamespace).Delete(context.Background(), approverLease, metav1.DeleteOptions{})
	})
	client := newClientPod(t, ctx, c, "e2e-fleet-certs", "client")
	pool := podCAPool(t, client)

	// 1. Two replicas, one leader.
	podA, procA := startApproverReplica(t, ctx, c)
	podB, procB := startApproverReplica(t, ctx, c)
	var leaderPod, standbyPod *sandbox.Pod
	var leaderProc, standbyProc *sandbox.Process
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, p := range []*sandbox.Process{procA, procB} {
			if done, err := p.Exited(); done {
				return false, fmt.Errorf("approver exited (%v): %s", err, tailLines(p.Log(), 20))
			}
		}
		// The replicas share the sandbox's hostname, so the Lease's
		// holder (hostname_uuid) does not say which one leads; the log
		// does.
		switch {
		case strings.Contains(procA.Log(), "Approving kube-apicache serving certificates"):
			leaderPod, leaderProc, standbyPod, standbyProc = podA, procA, podB, procB
		case strings.Contains(procB.Log(), "Approving kube-apicache serving certificates"):
			leaderPod, leaderProc, standbyPod, standbyProc = podB, procB, podA, procA
		default:
			return false, nil
		}
		return leaseHolder(ctx, c) != "", nil
	})
	if err != nil {
		t.Fatalf("no approver leads (lease holder %q): %v", leaseHolder(ctx, c), err)
	}
	for name, pod := range map[string]*sandbox.Pod{"leader": leaderPod, "standby": standbyPod} {
		for _, path := range []string{"/healthz", "/readyz"} {
			// The standby may still be starting its health server (a
			// busy machine): wait until it answers, then check what.
			var code int
			var body string
			_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				code, body, err = approverGet(ctx, pod, path, "")
				return err == nil, nil
			})
			if err != nil || code != http.StatusOK {
				t.Errorf("%s %s = %d %q (%v), want 200", name, path, code, body, err)
			}
		}
	}
	scraper, err := c.ScraperToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, leaderMetrics, _ := approverGet(ctx, leaderPod, "/metrics", scraper)
	_, standbyMetrics, _ := approverGet(ctx, standbyPod, "/metrics", scraper)
	if !strings.Contains(leaderMetrics, "kube_apicache_approver_leader 1") || !strings.Contains(standbyMetrics, "kube_apicache_approver_leader 0") {
		t.Errorf("leader gauges: leader's %q, standby's %q; want 1 and 0",
			grepLines(leaderMetrics, "kube_apicache_approver_leader"), grepLines(standbyMetrics, "kube_apicache_approver_leader"))
	}
	if strings.Contains(standbyProc.Log(), "Approving kube-apicache serving certificates") {
		t.Errorf("the standby decides CSRs too")
	}
	figuref(t, "approver HA: %s leads (lease %s), %s stands by; both ready", leaderPod.Spec.Name, leaseHolder(ctx, c), standbyPod.Spec.Name)

	// 2. A restarted agent reuses its certificate.
	agentPod := newHostPod(t, ctx, c, "kube-apicache-fleet", sandbox.AgentServiceAccount)
	stateDir := filepath.Join(agentPod.Dir, "certificate-state")
	args := c.AgentArgs("", "", "--certificate-lifetime=10m", "--certificate-state-dir="+stateDir)
	a, err := c.StartAgent(ctx, agentPod, agentBin, args...)
	if err != nil {
		t.Fatalf("starting the agent: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent (first)", 40, 40*time.Second)
	first, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(newAgentCSRs(t, ctx, c, before)); n != 1 {
		t.Fatalf("agent CSRs = %d, want 1", n)
	}
	if info, err := os.Stat(filepath.Join(stateDir, "serving-certificate.json")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("state file: %v, mode %v; want 0600", err, info.Mode().Perm())
	}
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Process.Wait(10 * time.Second)
	restarted := time.Now()
	a, err = c.StartAgent(ctx, agentPod, agentBin, args...)
	if err != nil {
		t.Fatalf("restarting the agent: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent (restarted)", 40, 40*time.Second)
	readyAfter := time.Since(restarted)
	served, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	if served.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("restarted agent serves serial %s, want the saved %s", served.SerialNumber, first.SerialNumber)
	}
	if n := len(newAgentCSRs(t, ctx, c, before)); n != 1 {
		t.Errorf("agent CSRs after the restart = %d, want still 1", n)
	}
	if m, err := a.Metrics(ctx); err != nil || !strings.Contains(m, `kube_apicache_serving_certificate_renewals_total{result="reused"} 1`) {
		t.Errorf("restarted agent's metrics lack the reuse (%v): %s", err, grepLines(m, "renewals_total"))
	}
	figuref(t, "agent killed (SIGKILL) and restarted with its state directory: ready in %s serving serial %s again, no new CSR",
		readyAfter.Round(time.Millisecond), served.SerialNumber)

	// 3. Failover.
	oldHolder := leaseHolder(ctx, c)
	leaderProc.Stop(10 * time.Second)
	stopped := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		holder := leaseHolder(ctx, c)
		return holder != "" && holder != oldHolder &&
			strings.Contains(standbyProc.Log(), "Approving kube-apicache serving certificates"), nil
	})
	if err != nil {
		t.Fatalf("the standby did not take over (holder %q): %v", leaseHolder(ctx, c), err)
	}
	failover := time.Since(stopped)
	if err := a.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var renewed string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
		if err != nil || s.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return false, nil
		}
		renewed = s.SerialNumber.String()
		return true, nil
	})
	if err != nil {
		t.Fatalf("no renewal approved after the failover: %v", err)
	}
	csrs := newAgentCSRs(t, ctx, c, before)
	if last := csrs[len(csrs)-1]; csrCondition(&last, certificatesv1.CertificateApproved) == nil {
		t.Errorf("CSR %s not approved: %+v", last.Name, last.Status.Conditions)
	}
	figuref(t, "leader stopped: standby took the lease in %s and approved the renewal (serial %s)", failover.Round(time.Millisecond), renewed)

	// 4. A denial is final until the configuration changes.
	standbyProc.Stop(10 * time.Second)
	a.Process.Stop(40 * time.Second)
	_, wrong := startApproverReplica(t, ctx, c, "--cluster-domain=mismatch.example")
	deniedDir := filepath.Join(agentPod.Dir, "certificate-state-denied")
	deniedArgs := c.AgentArgs("", "", "--certificate-lifetime=10m", "--certificate-state-dir="+deniedDir)
	proc, err := agentPod.Start(agentBin, deniedArgs...)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "agent (denied)", 40, 40*time.Second)
	beforeDenial := len(newAgentCSRs(t, ctx, c, before))
	var body string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		body = agentStatus(ctx, c)
		return strings.Contains(body, "was denied ("+approver.ReasonWrongSANs), nil
	})
	if err != nil {
		t.Fatalf("the agent never reported the denial (last %q; approver log %s): %v", body, tailLines(wrong.Log(), 10), err)
	}
	// client-go's manager would have sent four more in this time (2s, 4s,
	// 8s, 16s backoff).
	time.Sleep(20 * time.Second)
	if n := len(newAgentCSRs(t, ctx, c, before)) - beforeDenial; n != 1 {
		t.Errorf("agent sent %d CSRs in 20s after a denial, want 1", n)
	}
	if err := proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = proc.Wait(10 * time.Second)
	proc, err = agentPod.Start(agentBin, deniedArgs...)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "agent (denied, restarted)", 40, 40*time.Second)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		body = agentStatus(ctx, c)
		return strings.Contains(body, "was denied"), nil
	})
	if err != nil {
		t.Fatalf("restarted agent does not report the saved denial (last %q): %v", body, err)
	}
	time.Sleep(5 * time.Second)
	if n := len(newAgentCSRs(t, ctx, c, before)) - beforeDenial; n != 1 {
		t.Errorf("agent sent %d CSRs across a restart after a denial, want 1", n)
	}
	figuref(t, "denied (%s): 1 CSR in 25s and across a restart; agent says: %s", approver.ReasonWrongSANs, strings.TrimSpace(body))

	wrong.Stop(10 * time.Second)
	startApproverReplica(t, ctx, c)
	if err := proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	a = &sandbox.Agent{Pod: agentPod, Process: proc}
	if err := a.WaitReady(ctx); err != nil {
		t.Fatalf("agent not ready after SIGHUP with a fixed approver: %v", err)
	}
	figuref(t, "after the approver was fixed, SIGHUP: certificate issued, agent ready")
}

// agentStatus returns the body of the agent's endpoint that says why it
// does not intercept: /intercepting, or /readyz where there is none.
func agentStatus(ctx context.Context, c *sandbox.Cluster) string {
	for _, path := range []string{"/intercepting", "/readyz"} {
		code, b, err := sandbox.AgentGetWithToken(ctx, c.Node, sandbox.AgentMetricsAddr, path, "", 5*time.Second)
		if err != nil {
			return ""
		}
		if code != http.StatusNotFound {
			return string(b)
		}
	}
	return ""
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
