package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The images the real node imports (make image, make e2e-images).
const (
	realAgentImage  = sandbox.RealAgentImage
	realClientImage = sandbox.RealClientImage
)

const (
	// dsClientNS holds the client pods of TestRealNodeDaemonSet, and
	// dsClientSA their ServiceAccount.
	dsClientNS = "rn-clients"
	dsClientSA = "client"
	// dsAgentSelector selects the agent's DaemonSet pods.
	dsAgentSelector = sandbox.DaemonSetAgentSelector
	// dsOOMLimit is the memory limit step 5 patches in: the agent starts
	// and intercepts under it, and is OOM-killed once the services it
	// caches grow past it (dsOOMServiceBytes each).
	dsOOMLimit        = "48Mi"
	dsOOMServiceBytes = 200 << 10
	dsOOMMaxServices  = 400
)

// TestRealNodeDaemonSet: the acceptance scenarios of the real node, with
// the shipped manifests deployed by kubectl onto a kubelet with containerd
// and kube-proxy in iptables mode.
//
//  1. Given a real node, when the manifests are applied with kustomize,
//     then the approver becomes Available, the agent's CSR is approved,
//     the DaemonSet pod becomes Ready, and the node's nat table sends the
//     VIP to the agent ahead of kube-proxy while the liveness set holds it.
//  2. When an ordinary client pod reads through the VIP (kubectl and
//     client-go informers), then the agent answers some reads from its
//     cache and kube-apiserver sees the pod's own ServiceAccount on every
//     request it forwarded. And when a tenant pod with edit attacks the
//     agent (proxy resets, idle connections, answers it never reads:
//     tenantAttacks), the reader's cached reads stay cache hits within
//     twice their quiet p99 and the agent keeps its health and its
//     container.
//     And a pod labelled kube-apicache.io/exclude=true reaches
//     kube-apiserver through kube-proxy's path from its first connection,
//     while an unlabelled pod beside it reaches the agent.
//  3. When the DaemonSet is restarted under load (a new connection per
//     request, and one reused HTTP/2 connection), then no request fails.
//  4. When the agent is SIGKILLed through the runtime, then new
//     connections go to kube-proxy within the liveness timeout, the
//     kubelet's restart intercepts again, and nothing is duplicated.
//  5. When the agent is OOM-killed, the same; and when the limit is
//     restored, it intercepts again.
//  6. When the manifests are deleted, then the node holds nothing of the
//     agent's and pods reach kube-apiserver through kube-proxy.
//
// Between them: kube-proxy restarted 20 times never takes a TLS probe from
// the node past the agent (kube-proxy keeps an existing jump where it is);
// a hung agent (its container frozen, as SIGSTOP) fails open and intercepts
// again once thawed; and after the uninstall, 100 agents started and
// SIGKILLed in the node's network namespace, next to this kube-proxy,
// leave nothing duplicated (cycles).
func TestRealNodeDaemonSet(t *testing.T) {
	images := requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	testStart := time.Now()
	hostBefore := snapshotHost(t)

	c, rn, stop := startRealNodeSandbox(t, ctx, realNodeBinDir(), images, "iptables")
	figuref(t, "real node up in %s (Node Ready at %s)", rn.Timings.KubeProxy, rn.Timings.Ready)

	// The iptables dataplane, next to kube-proxy's iptables mode (auto
	// would pick nftables on this nf_tables-backed node;
	// TestRealNodeNFTables runs that one).
	// Set in the configuration, as an operator would: the overlay changes
	// the image and the ConfigMap, nothing else.
	s := &dsScenario{c: c, node: rn, overlay: writeOverlay(t, "dataplane:\n  mode: iptables\n")}
	steps := []struct {
		name string
		run  func(t *testing.T, ctx context.Context)
	}{
		{"install", s.install},
		{"reads", s.reads},
		{"pod-opt-out", s.podOptOut},
		{"tenant-attacks", s.tenantAttacks},
		{"kube-proxy-restarts", s.kubeProxyRestarts},
		{"rollout", s.rollout},
		{"hang", s.hang},
		{"kill", s.kill},
		{"oom", s.oom},
		{"uninstall", s.uninstall},
		{"cycles", s.cycles},
	}
	for _, step := range steps {
		stepStart := time.Now()
		ok := t.Run(step.name, func(t *testing.T) { step.run(t, ctx) })
		t.Logf("step %s took %s", step.name, time.Since(stepStart).Round(time.Millisecond))
		if !ok {
			s.dumpAgent(t, ctx)
			t.Fatalf("step %s failed; the later steps depend on it", step.name)
		}
	}

	// Then, once the sandbox stops, the machine is as it was.
	if err := stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	hostBefore.checkRestored(t, rn)
	if !t.Failed() {
		figuref(t, "whole scenario %s, teardown included; nothing left on the machine", time.Since(testStart).Round(time.Second))
	}
}

// startRealNodeSandbox starts a sandbox with a real node whose kube-proxy
// runs in proxyMode. stop stops the sandbox and returns its error; if the
// test ends without calling it, a cleanup stops the sandbox, logging its
// logs first if the test failed.
func startRealNodeSandbox(t *testing.T, ctx context.Context, binDir string, images []string, proxyMode string) (c *sandbox.Cluster, rn *sandbox.RealNode, stop func() error) {
	t.Helper()
	c, err := sandbox.Start(ctx, sandbox.Options{BinDir: binDir, APIServers: 1, RealNode: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("starting the sandbox: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if t.Failed() {
				t.Logf("sandbox logs:\n%s", c.Logs(200))
			}
			_ = c.Stop()
		}
	})
	rn, err = c.StartRealNode(ctx, sandbox.RealNodeOptions{Images: images, ProxyMode: proxyMode})
	if err != nil {
		t.Fatalf("starting the real node: %v", err)
	}
	return c, rn, func() error {
		stopped = true
		return c.Stop()
	}
}

// requireRealNode skips unless the real-node scenarios are enabled and
// returns the image archives to import.
func requireRealNode(t *testing.T) []string {
	t.Helper()
	if os.Getenv(realNodeEnabled) != "1" {
		t.Skipf("set %s=1 to run the real-node scenario (make e2e-real-node)", realNodeEnabled)
	}
	claim(t, realNodeGroup)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the real node needs root")
		}
		t.Skip("the real node needs root")
	}
	images, err := sandbox.RealNodeImages(sandbox.RealNodeImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	return images
}

func realNodeBinDir() string {
	if d := os.Getenv("KUBE_APICACHE_BIN_DIR"); d != "" {
		return d
	}
	return sandbox.DefaultBinDir()
}

// writeOverlay writes the kustomization an operator would: the shipped
// manifests, the image, and config added to the shipped configuration.
// kustomize takes a base only by a relative path.
func writeOverlay(t *testing.T, config string) string {
	t.Helper()
	dir := t.TempDir()
	if err := sandbox.WriteOverlay(dir, realAgentImage, config); err != nil {
		t.Fatal(err)
	}
	return dir
}

// dsScenario is the state the steps of TestRealNodeDaemonSet hand on.
type dsScenario struct {
	c       *sandbox.Cluster
	node    *sandbox.RealNode
	overlay string
	// rendered, if set, is the rendered manifest the agent was last
	// applied from (kubectl apply -f), which uninstall deletes instead of
	// the overlay.
	rendered string
	// nft: the agent runs the nftables dataplane (kube-proxy in nftables
	// mode, the shipped --dataplane=auto).
	nft bool
	// reader is the client pod of step 2, kept running to the end.
	reader *nodePod
}

// kubectl runs the machine's kubectl as the sandbox's admin, inside the
// control-plane namespace (where the admin kubeconfig's server is).
func (s *dsScenario) kubectl(ctx context.Context, args ...string) (string, error) {
	return s.c.Kubectl(ctx, args...)
}

func (s *dsScenario) mustKubectl(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := s.kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// agentPod returns the DaemonSet's pod that is not being deleted, if any.
func (s *dsScenario) agentPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := s.c.Admin.CoreV1().Pods(sandbox.AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: dsAgentSelector})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, nil
}

func podReady(p *corev1.Pod) bool {
	if p == nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitAgentReady waits until a DaemonSet pod other than not (by UID) is
// Ready, and returns it.
func (s *dsScenario) waitAgentReady(t *testing.T, ctx context.Context, timeout time.Duration, not types.UID) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := s.agentPod(ctx)
		if err != nil || p == nil {
			return false, nil
		}
		last = p
		return p.UID != not && podReady(p), nil
	})
	if err != nil {
		status := "no pod"
		if last != nil {
			b, _ := json.MarshalIndent(last.Status, "", "  ")
			status = string(b)
		}
		t.Fatalf("agent pod not Ready within %s: %v\n%s", timeout, err, status)
	}
	return last
}

// agentMetrics scrapes the agent's metrics from the node namespace, where
// the DaemonSet's pod listens on loopback.
func (s *dsScenario) agentMetrics(ctx context.Context) (string, error) {
	return s.c.DaemonSetAgentMetrics(ctx)
}

// forwardedCount is the number of requests the running agent forwarded,
// or -1 if it does not answer.
func (s *dsScenario) forwardedCount(t *testing.T, ctx context.Context) float64 {
	text, err := s.agentMetrics(ctx)
	if err != nil {
		return -1
	}
	return sumWhere(parseMetrics(t, text)["kube_apicache_requests_total"], map[string]string{"handler": "forward"})
}

// intercepting reports whether the node sends the VIP to a live agent:
// the liveness set holds the VIP and the agent's forwarded requests grow
// (a load client must be running).
func (s *dsScenario) intercepting(t *testing.T, ctx context.Context) bool {
	if !slices.Contains(liveEntries(t, ctx, s.c), sandbox.ServiceVIP) {
		return false
	}
	before := s.forwardedCount(t, ctx)
	if before < 0 {
		return false
	}
	time.Sleep(200 * time.Millisecond)
	return s.forwardedCount(t, ctx) > before
}

// dumpAgent logs the agent pod's status and log, for failures.
func (s *dsScenario) dumpAgent(t *testing.T, ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	out, _ := s.kubectl(ctx, "-n", sandbox.AgentNamespace, "get", "pods,ds,deploy,csr", "-o", "wide")
	t.Logf("kube-apicache objects:\n%s", out)
	out, _ = s.kubectl(ctx, "get", "events", "-A")
	t.Logf("events:\n%s", out)
	out, _ = s.kubectl(ctx, "-n", sandbox.AgentNamespace, "logs", "daemonset/kube-apicache", "--tail=60")
	t.Logf("agent log:\n%s", out)
	out, _ = s.kubectl(ctx, "-n", sandbox.AgentNamespace, "logs", "daemonset/kube-apicache", "--tail=40", "--previous")
	t.Logf("agent log (previous container):\n%s", out)
	t.Logf("kubelet log:\n%s", tailLines(s.node.Kubelet.Log(), 40))
}

// natOrder returns, for one nat hook, the positions of the first jump to
// the agent's chain and to kube-proxy's KUBE-SERVICES (-1 if absent), and
// how many jumps to the agent's chain it has.
func natOrder(nat, hook string) (agent, services, agentJumps int) {
	agent, services = -1, -1
	i := 0
	for _, l := range strings.Split(nat, "\n") {
		if !strings.HasPrefix(l, "-A "+hook+" ") {
			continue
		}
		if strings.HasSuffix(l, "-j "+sandbox.AgentChain) {
			agentJumps++
			if agent < 0 {
				agent = i
			}
		}
		if strings.HasSuffix(l, "-j KUBE-SERVICES") && services < 0 {
			services = i
		}
		i++
	}
	return agent, services, agentJumps
}

// install: given a real node, when the overlay is applied, then the
// approver is Available, the agent's CSR approved, its pod Ready, and the
// node intercepts the VIP ahead of kube-proxy.
func (s *dsScenario) install(t *testing.T, ctx context.Context) {
	c := s.c
	start := time.Now()
	out := s.mustKubectl(t, ctx, "apply", "-k", s.overlay)
	t.Logf("kubectl apply -k:\n%s", out)

	var available, approved, ready time.Duration
	var csrReason string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if available == 0 {
			d, err := c.Admin.AppsV1().Deployments(sandbox.AgentNamespace).Get(ctx, "kube-apicache-approver", metav1.GetOptions{})
			if err == nil {
				for _, cond := range d.Status.Conditions {
					if cond.Type == "Available" && cond.Status == corev1.ConditionTrue {
						available = time.Since(start)
					}
				}
			}
		}
		if approved == 0 {
			csrs, err := c.Admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, csr := range csrs.Items {
					if csr.Spec.Username != sandbox.AgentUsername() || len(csr.Status.Certificate) == 0 {
						continue
					}
					for _, cond := range csr.Status.Conditions {
						if cond.Type == certificatesv1.CertificateApproved && cond.Status == corev1.ConditionTrue {
							approved, csrReason = time.Since(start), cond.Reason
						}
					}
				}
			}
		}
		if ready == 0 {
			if p, err := s.agentPod(ctx); err == nil && podReady(p) {
				ready = time.Since(start)
			}
		}
		return available > 0 && approved > 0 && ready > 0, nil
	})
	if err != nil {
		t.Fatalf("after kubectl apply -k: approver Available after %s, agent CSR approved and issued after %s, agent pod Ready after %s (0: not yet): %v",
			available, approved, ready, err)
	}
	figuref(t, "install: kubectl apply -k; approver Available %s, agent CSR approved (%s) and issued %s, DaemonSet pod Ready %s after the apply",
		available.Round(time.Millisecond), csrReason, approved.Round(time.Millisecond), ready.Round(time.Millisecond))

	// Ready means decided, not intercepting: wait for interception too.
	took := waitFor(t, time.Minute, "the agent intercepts", func() bool {
		code, _, _ := agentEndpoint(ctx, c, "/intercepting")
		return code == http.StatusOK
	})
	figuref(t, "install: intercepting %s after the pod was Ready", took.Round(time.Millisecond))
	s.checkStatusCommand(t, ctx)

	if s.nft {
		s.assertNFTInstalled(t, ctx)
		return
	}
	// Then the jumps come first, ahead of kube-proxy's, in both hooks, and
	// the liveness set holds the VIP.
	nat, err := c.Node.Output(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		agent, services, jumps := natOrder(nat, hook)
		if agent != 0 || services < 0 || jumps != 1 {
			t.Errorf("%s: agent jump at %d (%d of them), KUBE-SERVICES at %d; want the agent's one jump first, ahead of kube-proxy's:\n%s",
				hook, agent, jumps, services, nat)
		}
	}
	if got := liveEntries(t, ctx, c); !slices.Equal(got, []string{sandbox.ServiceVIP}) {
		t.Errorf("liveness set holds %v, want [%s]", got, sandbox.ServiceVIP)
	}
	_, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	figuref(t, "install: PREROUTING and OUTPUT jump to %s first, then KUBE-SERVICES; %s holds %s; listen address on %s",
		sandbox.AgentChain, sandbox.AgentLivenessSet, sandbox.ServiceVIP, addrLinks(addrs, sandbox.AgentListenIP))
}

// addrLinks names the links that hold ip in `ip -o addr show` output.
func addrLinks(addrs, ip string) string {
	var links []string
	for _, l := range strings.Split(addrs, "\n") {
		if f := strings.Fields(l); len(f) > 3 && strings.Contains(l, " "+ip+"/") {
			links = append(links, f[1])
		}
	}
	if len(links) == 0 {
		return "no link"
	}
	return strings.Join(links, ", ")
}

// nodePod is a client pod on the real node with its log followed from
// its start.
type nodePod struct {
	Pod *corev1.Pod
	log *podLog
}

// podLog follows a container's log through the apiserver and the kubelet.
type podLog struct {
	done chan struct{}

	mu    sync.Mutex // protects the fields below
	lines []string
	err   error
}

func followPodLog(ctx context.Context, c *sandbox.Cluster, ns, name string) *podLog {
	l := &podLog{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		rc, err := c.Admin.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
		if err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			return
		}
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.mu.Unlock()
		}
		l.mu.Lock()
		l.err = sc.Err()
		l.mu.Unlock()
	}()
	return l
}

// matching returns the lines so far that contain substr.
func (l *podLog) matching(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			out = append(out, s)
		}
	}
	return out
}

func (l *podLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.lines, "\n")
	if l.err != nil {
		s += fmt.Sprintf("\n(log stream: %v)", l.err)
	}
	return s
}

// awaitLine waits until a line contains substr.
func (l *podLog) awaitLine(substr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l.mu.Lock()
		found := slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, substr) })
		l.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-l.done:
			return fmt.Errorf("log ended without %q:\n%s", substr, l)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q within %s:\n%s", substr, timeout, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runClient creates a client pod of the client image, scheduled onto the
// real node like any workload: the ServiceAccount dsClientSA, the
// projected token volume and the standard environment, plus NODE_NAME from
// the downward API for the node-local informers. It waits until the pod
// runs and follows its log.
func (s *dsScenario) runClient(t *testing.T, ctx context.Context, name string, args ...string) *nodePod {
	t.Helper()
	return s.runLabelledClient(t, ctx, name, nil, args...)
}

// runLabelledClient is runClient with labels added to the pod's.
func (s *dsScenario) runLabelledClient(t *testing.T, ctx context.Context, name string, labels map[string]string, args ...string) *nodePod {
	t.Helper()
	pods := s.c.Admin.CoreV1().Pods(dsClientNS)
	podLabels := map[string]string{"app": name}
	maps.Copy(podLabels, labels)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: podLabels},
		Spec: corev1.PodSpec{
			ServiceAccountName:            dsClientSA,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			Containers: []corev1.Container{{
				Name: "client", Image: realClientImage, ImagePullPolicy: corev1.PullNever,
				Args: args,
				Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"},
				}}},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	last, err := s.c.WaitPodRunning(ctx, dsClientNS, name)
	if err != nil {
		b, _ := json.MarshalIndent(last, "", "  ")
		t.Fatalf("%v\n%s", err, b)
	}
	return &nodePod{Pod: last, log: followPodLog(ctx, s.c, dsClientNS, name)}
}

// exec runs a command in the client pod through kubectl exec and returns
// what it printed on standard output. Standard error is kept apart: the
// local kubectl's own stream messages (such as a websocket "Unknown stream
// id" line) land there and must not be read as the command's output.
func (s *dsScenario) exec(t *testing.T, ctx context.Context, r *nodePod, args ...string) string {
	t.Helper()
	full := append([]string{"exec", "-n", dsClientNS, r.Pod.Name, "--"}, args...)
	cmd := s.c.KubectlCommand(ctx, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(full, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	if stderr.Len() > 0 {
		t.Logf("kubectl %s wrote on standard error:\n%s", strings.Join(full, " "), stderr.Bytes())
	}
	return stdout.String()
}

// startLoad runs `podclient load` in a new pod and waits until its first
// write succeeded.
func (s *dsScenario) startLoad(t *testing.T, ctx context.Context, name string, newConn bool) *nodePod {
	t.Helper()
	args := []string{"load", "--name", name, "--timeout", "8m", "--interval", "20ms"}
	if newConn {
		args = append(args, "--new-conn")
	}
	r := s.runClient(t, ctx, name, args...)
	if err := r.log.awaitLine("READY", time.Minute); err != nil {
		t.Fatal(err)
	}
	return r
}

// stopLoad deletes a load pod with a grace period: podclient gets SIGTERM,
// prints its RESULT and exits, and the followed log ends with it.
func (s *dsScenario) stopLoad(t *testing.T, ctx context.Context, r *nodePod) loadResult {
	t.Helper()
	err := s.c.Admin.CoreV1().Pods(dsClientNS).Delete(ctx, r.Pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](10)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.log.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("load pod %s: log still open 30s after its deletion:\n%s", r.Pod.Name, tailLines(r.log.String(), 20))
	}
	log := r.log.String()
	m := resultRE.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("load pod %s printed no RESULT:\n%s", r.Pod.Name, tailLines(log, 30))
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	res := loadResult{OK: n(1), Failed: n(2), Reads: n(3), Writes: n(4), FailedReads: n(5), FailedWrites: n(6),
		LongestGap: time.Duration(n(7)) * time.Millisecond}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "FAIL ") {
			res.Failures = append(res.Failures, line)
		}
	}
	return res
}

// waitAllowed waits until RBAC allows the client ServiceAccount verb on
// resource in ns ("" for cluster-wide).
func (s *dsScenario) waitAllowed(t *testing.T, ctx context.Context, ns, verb, res string) {
	t.Helper()
	user := "system:serviceaccount:" + dsClientNS + ":" + dsClientSA
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + dsClientNS, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: res},
		}}
		got, err := s.c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("%s may not %s %s in %q: %v", user, verb, res, ns, err)
	}
}

// setUpClients creates the clients' namespace and ServiceAccount with
// edit in the namespace and list/watch of pods and services cluster-wide.
func (s *dsScenario) setUpClients(t *testing.T, ctx context.Context) {
	t.Helper()
	c := s.c
	if err := c.EnsureNamespace(ctx, dsClientNS); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: dsClientSA}}
	if _, err := c.Admin.CoreV1().ServiceAccounts(dsClientNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: dsClientSA, Namespace: dsClientNS}}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "client-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   subjects,
	}
	if _, err := c.Admin.RbacV1().RoleBindings(dsClientNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cr := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "rn-client-read"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "rn-client-read"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: cr.Name},
		Subjects:   subjects,
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitAllowed(t, ctx, dsClientNS, "patch", "configmaps")
	s.waitAllowed(t, ctx, "", "watch", "pods")
	s.waitAllowed(t, ctx, "", "watch", "services")
}

// reads: when a client pod reads through the VIP with kubectl and
// client-go informers, then the agent answers some reads from its cache,
// and kube-apiserver sees the pod's own ServiceAccount on every request
// it forwarded for the pod.
func (s *dsScenario) reads(t *testing.T, ctx context.Context) {
	c := s.c
	s.setUpClients(t, ctx)
	// Given a client pod running node-local informers (pods on this node,
	// typed and metadata-only, and services).
	s.reader = s.runClient(t, ctx, "reader", "informers", "--timeout", "14m")
	r := s.reader
	if err := r.log.awaitLine("SYNCED", time.Minute); err != nil {
		t.Fatal(err)
	}
	// The reader's first requests may leave before its IP reaches the
	// agent's set of this node's pods (--detect-local-mode=PodIPs, the
	// shipped default): those take kube-proxy's path, by design. What
	// follows counts from the moment its IP is in the set.
	inSet := s.waitPodIPInSet(t, ctx, r.Pod.Status.PodIP)
	handedBackBefore := s.handedBack(t, ctx)
	// When it runs kubectl.
	out := s.exec(t, ctx, r, "kubectl", "get", "configmaps")
	if !strings.Contains(out, "kube-root-ca.crt") {
		t.Errorf("kubectl get configmaps in the pod:\n%s", out)
	}
	raw := s.exec(t, ctx, r, "kubectl", "get", "--raw", "/api/v1/pods?fieldSelector=spec.nodeName%3D"+sandbox.NodeName)
	var list corev1.PodList
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		t.Fatalf("kubectl get --raw pods: %v\n%.500s", err, raw)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if !slices.Contains(names, dsClientNS+"/reader") || !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, sandbox.AgentNamespace+"/kube-apicache-") }) {
		t.Errorf("the node's pods through the VIP: %v; want the reader and the agent among them", names)
	}
	// Then the agent answered reads from its cache. It watches a resource
	// only once the node reads it: the first read of the node's pods
	// started that watch and was forwarded, the next ones are answered
	// once it has synced.
	var byOutcome, hitsBy map[string]float64
	readAgain := 0
	for {
		text, err := s.agentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byOutcome, hitsBy = map[string]float64{}, map[string]float64{}
		for _, m := range parseMetrics(t, text)["kube_apicache_cache_requests_total"] {
			byOutcome[m.labels["outcome"]] += m.value
			if m.labels["outcome"] == "hit" {
				hitsBy[m.labels["verb"]+" "+m.labels["resource"]] += m.value
			}
		}
		if byOutcome["hit"] > 0 || readAgain == 20 {
			break
		}
		readAgain++
		time.Sleep(250 * time.Millisecond)
		s.exec(t, ctx, r, "kubectl", "get", "--raw", "/api/v1/pods?fieldSelector=spec.nodeName%3D"+sandbox.NodeName)
	}
	if byOutcome["hit"] == 0 {
		t.Errorf("no cache hits after %d more reads; outcomes %v", readAgain, byOutcome)
	}
	figuref(t, "reads: %d pods on the node through the VIP; cache outcomes %v (first hit after %d more reads), hits by verb and resource %v",
		len(list.Items), byOutcome, readAgain, hitsBy)

	// And every request kube-apiserver received from the pod (the agent
	// appends the pod's address to X-Forwarded-For) carried the pod's own
	// identity.
	want := "system:serviceaccount:" + dsClientNS + ":" + dsClientSA
	var forwarded, direct, wrong int
	agents := map[string]int{}
	for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool {
		return slices.Contains(ev.SourceIPs, r.Pod.Status.PodIP) && !ev.RequestReceivedTimestamp.Time.Before(inSet)
	}) {
		if slices.Contains(ev.SourceIPs, sandbox.NodeIP) {
			forwarded++
		} else {
			direct++
		}
		if ev.User.Username != want || ev.ImpersonatedUser != nil {
			wrong++
			if wrong <= 3 {
				t.Errorf("request %s %s from the pod reached kube-apiserver as %q (impersonating %v), want %q",
					ev.Verb, ev.RequestURI, ev.User.Username, ev.ImpersonatedUser, want)
			}
		}
		ua, _, _ := strings.Cut(ev.UserAgent, " ")
		agents[ua]++
	}
	if forwarded == 0 {
		t.Errorf("kube-apiserver logged no request forwarded by the agent for the pod (%d direct)", direct)
	}
	// A request around the agent is a bypass, unless the agent handed
	// the VIP back meanwhile: its listener check timed out on a starved
	// machine and it failed open, by design (counted and reported).
	handedBack := s.handedBack(t, ctx) - handedBackBefore
	if direct > 0 && handedBack == 0 {
		t.Errorf("%d requests from the pod reached kube-apiserver around the agent while it intercepted", direct)
	}
	if handedBack > 0 {
		figuref(t, "reads: the agent handed the VIP back to kube-proxy %v times during the reads (listener check failed; fail-open), %d requests went around it", handedBack, direct)
	}
	figuref(t, "reads: kube-apiserver logged %d requests forwarded for the pod (by user agent %v), %d with another identity than %s, %d direct",
		forwarded, agents, wrong, want, direct)
}

// handedBack is the agent's count of liveness ticks that found its
// listener not serving and handed the VIP back to kube-proxy.
func (s *dsScenario) handedBack(t *testing.T, ctx context.Context) float64 {
	t.Helper()
	text, err := s.agentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, m := range parseMetrics(t, text)["kube_apicache_liveness_refreshes_total"] {
		if m.labels["result"] == "unhealthy" {
			n += m.value
		}
	}
	return n
}

// podOptOut: given two client pods started together on the node, one
// labelled kube-apicache.io/exclude=true, when each connects to the VIP
// once a second, then the unlabelled one reaches the agent once its IP is
// in the agent's set of this node's pods, and the labelled one reaches
// kube-apiserver through kube-proxy's path from its first connection on:
// its IP never enters the set.
func (s *dsScenario) podOptOut(t *testing.T, ctx context.Context) {
	const agentCN = "system:node:" + sandbox.NodeName
	in := s.runLabelledClient(t, ctx, "servedby-in", nil, "servedby", "--timeout", "3m")
	out := s.runLabelledClient(t, ctx, "servedby-out", map[string]string{interception.ExcludePodLabel: "true"}, "servedby", "--timeout", "3m")
	defer func() {
		for _, p := range []*nodePod{in, out} {
			_ = s.c.Admin.CoreV1().Pods(dsClientNS).Delete(ctx, p.Pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
	}()
	s.waitPodIPInSet(t, ctx, in.Pod.Status.PodIP)
	if err := in.log.awaitLine("SERVEDBY "+agentCN, 15*time.Second); err != nil {
		t.Fatalf("the unlabelled pod never reached the agent: %v\n%s", err, in.log)
	}
	// Five more seconds of the labelled pod's connections, with the
	// unlabelled one's IP already in the set.
	time.Sleep(5 * time.Second)
	lines := out.log.matching("SERVEDBY ")
	if len(lines) < 5 {
		t.Fatalf("the labelled pod connected %d times, want at least 5:\n%s", len(lines), out.log)
	}
	for _, l := range lines {
		if strings.Contains(l, agentCN) {
			t.Errorf("the labelled pod reached the agent: %q\n%s", l, out.log)
			break
		}
	}
	if s.c.PodIPInAgentSet(ctx, out.Pod.Status.PodIP) {
		t.Errorf("the labelled pod's IP %s is in the agent's set of this node's pods", out.Pod.Status.PodIP)
	}
	metrics, err := s.agentMetrics(ctx)
	if err != nil || !strings.Contains(metrics, "kube_apicache_excluded_pods 1") {
		t.Errorf("kube_apicache_excluded_pods is not 1 (%v)", err)
	}
	figuref(t, "opt-out: the labelled pod reached kube-apiserver on all %d connections (%s); the unlabelled one the agent (%s)",
		len(lines), strings.TrimPrefix(lines[0], "SERVEDBY "), agentCN)
}

// waitPodIPInSet waits until the agent's set of this node's pod IPs holds
// ip, and returns when it saw it there.
func (s *dsScenario) waitPodIPInSet(t *testing.T, ctx context.Context, ip string) time.Time {
	t.Helper()
	took := waitFor(t, 30*time.Second, "the pod's IP in the agent's set of this node's pods", func() bool {
		return s.c.PodIPInAgentSet(ctx, ip)
	})
	figuref(t, "detect-local: the pod's IP %s was in the agent's set of this node's pods %s after the pod was Running", ip, took.Round(time.Millisecond))
	return time.Now()
}

// rollout: given two load clients (a new connection per request, and one
// reused HTTP/2 connection), when the DaemonSet is restarted, then no
// request fails.
func (s *dsScenario) rollout(t *testing.T, ctx context.Context) {
	old, err := s.agentPod(ctx)
	if err != nil || old == nil {
		t.Fatalf("no agent pod: %v", err)
	}
	newConn := s.startLoad(t, ctx, "load-newconn", true)
	reused := s.startLoad(t, ctx, "load-http2", false)
	waitFor(t, 10*time.Second, "the loads go through the agent", func() bool { return s.intercepting(t, ctx) })
	before := s.forwardedCount(t, ctx)

	// The shipped strategy replaces a percentage of the nodes at once,
	// which fail-open makes safe (one node at a time takes days on a
	// large fleet).
	ds, err := s.c.Admin.AppsV1().DaemonSets(sandbox.AgentNamespace).Get(ctx, "kube-apicache", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mu := ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable; mu == nil || mu.Type != intstr.String || !strings.HasSuffix(mu.StrVal, "%") {
		t.Errorf("DaemonSet maxUnavailable = %v, want a percentage", mu)
	}
	start := time.Now()
	s.mustKubectl(t, ctx, "-n", sandbox.AgentNamespace, "rollout", "restart", "daemonset/kube-apicache")
	out := s.mustKubectl(t, ctx, "-n", sandbox.AgentNamespace, "rollout", "status", "daemonset/kube-apicache", "--timeout=3m")
	rolled := time.Since(start)
	t.Logf("rollout status:\n%s", out)
	s.waitAgentReady(t, ctx, time.Minute, old.UID)
	waitFor(t, 30*time.Second, "the new agent intercepts", func() bool { return s.intercepting(t, ctx) })
	intercepting := time.Since(start)
	time.Sleep(time.Second)
	after := s.forwardedCount(t, ctx)

	resNew := s.stopLoad(t, ctx, newConn)
	resReused := s.stopLoad(t, ctx, reused)
	figuref(t, "rollout: restart to rollout status done %s, to the new agent intercepting %s (old agent forwarded %.0f before, the new one %.0f by the end)",
		rolled.Round(time.Millisecond), intercepting.Round(time.Millisecond), before, after)
	figuref(t, "rollout: new connection per request: %s", resNew)
	figuref(t, "rollout: one reused HTTP/2 connection: %s", resReused)
	for name, res := range map[string]loadResult{"new-conn": resNew, "http2": resReused} {
		if res.Failed > 0 {
			t.Errorf("%s load: %d requests failed during the rollout:\n%s", name, res.Failed, res.firstFailures(5))
		}
		if res.OK < minLoadOK {
			t.Errorf("%s load: only %d requests succeeded, want at least %d", name, res.OK, minLoadOK)
		}
	}
}

// runningAgentContainer finds the agent's running container through the
// runtime, by the kubelet's container-name label.
func (s *dsScenario) runningAgentContainer(t *testing.T, ctx context.Context) string {
	t.Helper()
	ids, err := s.node.CtrOutput(ctx, "containers", "ls", "-q", `labels."io.kubernetes.container.name"==kube-apicache`)
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := s.node.CtrOutput(ctx, "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, l := range strings.Split(tasks, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[2] == "RUNNING" {
			running[f[0]] = true
		}
	}
	var found []string
	for _, id := range strings.Fields(ids) {
		if running[id] {
			found = append(found, id)
		}
	}
	if len(found) != 1 {
		t.Fatalf("running agent containers %v (containers %q; tasks:\n%s)", found, ids, tasks)
	}
	return found[0]
}

// agentStatus returns the agent container's status in its current pod.
func (s *dsScenario) agentStatus(t *testing.T, ctx context.Context) (*corev1.Pod, corev1.ContainerStatus) {
	t.Helper()
	p, err := s.agentPod(ctx)
	if err != nil || p == nil || len(p.Status.ContainerStatuses) == 0 {
		return p, corev1.ContainerStatus{}
	}
	return p, p.Status.ContainerStatuses[0]
}

// assertNoDuplicates checks the node holds exactly one of each of the
// agent's objects.
func (s *dsScenario) assertNoDuplicates(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if s.nft {
		st := readNFTState(t, ctx, s.c)
		nat, addrs, err := s.c.NodeNetState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// PodIPs mode: the liveness, pods, skip and seen sets.
		if st.Tables != 1 || st.BaseChains != 2 || st.Chains != 3 || st.Rules != 6 || st.Sets != 4 ||
			!slices.Equal(st.Live, []string{sandbox.ServiceVIP}) || strings.Contains(nat, sandbox.AgentChain) ||
			strings.Count(addrs, " "+sandbox.AgentListenIP+"/") != 1 {
			t.Errorf("%s: nftables state %+v; want one table, its chains and sets, the VIP alive, no iptables chain, one address:\n%s\n%s", when, st, nat, addrs)
		}
		figuref(t, "%s: one table (%d chains, %d rules, %d sets, liveness %v), no iptables chain, one address", when, st.Chains, st.Rules, st.Sets, st.Live)
		return
	}
	st := readNodeState(t, ctx, s.c)
	nat, addrs, err := s.c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pre, _, preJumps := natOrder(nat, "PREROUTING")
	outp, _, outJumps := natOrder(nat, "OUTPUT")
	dnat := 0
	for _, l := range strings.Split(nat, "\n") {
		if strings.HasPrefix(l, "-A "+sandbox.AgentChain+" ") && strings.Contains(l, "-j DNAT") {
			dnat++
		}
	}
	if st.Chains != 1 || preJumps != 1 || outJumps != 1 || pre != 0 || outp != 0 || dnat != 1 || st.ChainRules != 4 ||
		st.Sets != 1 || st.Entries != 1 || st.Addresses != 1 {
		t.Errorf("%s: node state %+v, jumps PREROUTING %d (first at %d) OUTPUT %d (first at %d), DNAT rules %d; want one of each, jumps first:\n%s\n%s",
			when, st, preJumps, pre, outJumps, outp, dnat, nat, addrs)
	}
	figuref(t, "%s: one chain (%d rules, %d DNAT), one jump per hook in first place, one set with %d entry, %d address %s on %s",
		when, st.ChainRules, dnat, st.Entries, st.Addresses, sandbox.AgentListenIP, addrLinks(addrs, sandbox.AgentListenIP))
}

// kill: given a load client opening a connection per request, when the
// agent's container is SIGKILLed through the runtime, then new connections
// take kube-proxy's path within the liveness timeout, the kubelet restarts
// the agent, which intercepts again, and nothing is duplicated.
func (s *dsScenario) kill(t *testing.T, ctx context.Context) {
	load := s.startLoad(t, ctx, "load-kill", true)
	waitFor(t, 10*time.Second, "the load goes through the agent", func() bool { return s.intercepting(t, ctx) })
	_, before := s.agentStatus(t, ctx)
	id := s.runningAgentContainer(t, ctx)
	if want := "containerd://" + id; before.ContainerID != want {
		t.Fatalf("the running container %s is not the pod's (%s)", id, before.ContainerID)
	}

	killed := time.Now()
	if out, err := s.node.CtrOutput(ctx, "tasks", "kill", "-s", "SIGKILL", id); err != nil {
		t.Fatalf("ctr tasks kill: %v %s", err, out)
	}
	// Then the entry expires with no process acting on it, unless the
	// kubelet's restart, which reuses its certificate from the state
	// directory, has taken it over first: an entry still there past the
	// liveness timeout with the container restarted was refreshed by the
	// new agent.
	var expired string
	waitFor(t, 5*time.Second, "liveness entry expiry or a restarted agent holding it", func() bool {
		if !slices.Contains(liveEntries(t, ctx, s.c), sandbox.ServiceVIP) {
			expired = "liveness entry expired " + time.Since(killed).Round(time.Millisecond).String() + " after"
			return true
		}
		if _, st := s.agentStatus(t, ctx); st.RestartCount > before.RestartCount && time.Since(killed) > 2*livenessTimeout {
			expired = "restarted agent took the liveness entry over before it expired"
			return true
		}
		return false
	})
	// And the kubelet's restart intercepts again.
	waitFor(t, 2*time.Minute, "the restarted agent intercepts", func() bool { return s.intercepting(t, ctx) })
	restored := time.Since(killed)
	_, after := s.agentStatus(t, ctx)
	// The load runs at least five seconds past the kill, however fast
	// the restarted agent took over.
	time.Sleep(max(time.Second, 5*time.Second-time.Since(killed)))
	res := s.stopLoad(t, ctx, load)
	reason := ""
	if term := after.LastTerminationState.Terminated; term != nil {
		reason = fmt.Sprintf("%s, exit code %d", term.Reason, term.ExitCode)
	}
	figuref(t, "kill: SIGKILL via ctr; %s; restarted agent (restarts %d, last state %s) intercepting %s after; load: %s",
		expired, after.RestartCount, reason, restored.Round(time.Millisecond), res)
	if after.RestartCount != before.RestartCount+1 {
		t.Errorf("restart count %d, want %d", after.RestartCount, before.RestartCount+1)
	}
	if res.LongestGap > killGapTarget {
		t.Errorf("longest gap %s, want at most %s; failures:\n%s", res.LongestGap, killGapTarget, res.firstFailures(5))
	}
	if res.OK < minLoadOK {
		t.Errorf("only %d requests succeeded, want at least %d", res.OK, minLoadOK)
	}
	s.assertNoDuplicates(t, ctx, "kill")
}

// patchMemory sets the agent container's memory request and limit, and
// appends args to its arguments, in one rollout.
func (s *dsScenario) patchMemory(t *testing.T, ctx context.Context, request, limit string, args ...string) {
	t.Helper()
	var extra string
	for _, a := range args {
		extra += fmt.Sprintf(`,{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":%q}`, a)
	}
	patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/resources/requests/memory","value":%q},`+
		`{"op":"replace","path":"/spec/template/spec/containers/0/resources/limits/memory","value":%q}%s]`, request, limit, extra)
	if _, err := s.c.Admin.AppsV1().DaemonSets(sandbox.AgentNamespace).Patch(ctx, "kube-apicache", types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// oom: given the agent under a memory limit it starts and intercepts
// within, and a load client, when the cluster's services grow past what
// the limit holds, then the kernel OOM-kills the agent and new connections
// take kube-proxy's path within the liveness timeout; when the limit is
// restored, the agent intercepts again.
func (s *dsScenario) oom(t *testing.T, ctx context.Context) {
	c := s.c
	ds, err := c.Admin.AppsV1().DaemonSets(sandbox.AgentNamespace).Get(ctx, "kube-apicache", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res0 := ds.Spec.Template.Spec.Containers[0].Resources
	origRequest, origLimit := res0.Requests.Memory().String(), res0.Limits.Memory().String()
	if text, err := s.agentMetrics(ctx); err == nil {
		t.Logf("agent before: resident %.1f MiB, heap in use %.1f MiB",
			gaugeValue(t, text, "process_resident_memory_bytes")/(1<<20), gaugeValue(t, text, "go_memstats_heap_inuse_bytes")/(1<<20))
	}

	// Given the agent restarted under the low limit, watching services from
	// start-up (it would otherwise cache them only once a pod reads them).
	old, _ := s.agentPod(ctx)
	s.patchMemory(t, ctx, dsOOMLimit, dsOOMLimit, "--cache-pinned-resources=services")
	pod := s.waitAgentReady(t, ctx, 2*time.Minute, old.UID)
	if got := pod.Spec.Containers[0].Resources.Limits.Memory(); got.Cmp(resource.MustParse(dsOOMLimit)) != 0 {
		t.Fatalf("new agent pod's memory limit %s, want %s", got, dsOOMLimit)
	}
	load := s.startLoad(t, ctx, "load-oom", true)
	waitFor(t, 30*time.Second, "the load goes through the agent under the low limit", func() bool { return s.intercepting(t, ctx) })
	if text, err := s.agentMetrics(ctx); err == nil {
		t.Logf("agent under %s: resident %.1f MiB, heap in use %.1f MiB", dsOOMLimit,
			gaugeValue(t, text, "process_resident_memory_bytes")/(1<<20), gaugeValue(t, text, "go_memstats_heap_inuse_bytes")/(1<<20))
	}

	// When services it caches grow past the limit (headless, so kube-proxy
	// programs nothing for them), until the agent's container is killed.
	const ns = "rn-oom"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	filler := strings.Repeat("x", dsOOMServiceBytes)
	var created int
	var killedAt, goneAt time.Time
	var term *corev1.ContainerStateTerminated
	for created < dsOOMMaxServices && term == nil {
		for range 10 {
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("filler-%03d", created), Annotations: map[string]string{"example.com/filler": filler}},
				Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
			}
			if _, err := c.Admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			created++
		}
		deadline := time.Now().Add(time.Second)
		for term == nil && time.Now().Before(deadline) {
			_, st := s.agentStatus(t, ctx)
			if st.RestartCount > 0 {
				term = st.LastTerminationState.Terminated
				if term == nil {
					term = &corev1.ContainerStateTerminated{Reason: "(unknown)"}
				}
				killedAt = time.Now()
			} else if st.State.Terminated != nil {
				term, killedAt = st.State.Terminated, time.Now()
			}
			if goneAt.IsZero() && !slices.Contains(liveEntries(t, ctx, c), sandbox.ServiceVIP) {
				goneAt = time.Now()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if term == nil {
		t.Fatalf("the agent survived %d services of %d KiB under a %s limit", created, dsOOMServiceBytes>>10, dsOOMLimit)
	}
	takenOver := false
	if goneAt.IsZero() {
		// The restarted container reuses its certificate (state directory)
		// and may take the entry over before it expires.
		waitFor(t, 5*time.Second, "liveness entry expiry after the OOM kill, or a restarted agent holding it", func() bool {
			if !slices.Contains(liveEntries(t, ctx, c), sandbox.ServiceVIP) {
				goneAt = time.Now()
				return true
			}
			_, st := s.agentStatus(t, ctx)
			takenOver = st.RestartCount > 0 && time.Since(killedAt) > 2*livenessTimeout
			return takenOver
		})
	}
	order := fmt.Sprintf("%s after", goneAt.Sub(killedAt).Round(time.Millisecond))
	switch {
	case takenOver:
		order = "never: the restarted agent took it over before it expired, and"
	case goneAt.Before(killedAt):
		order = fmt.Sprintf("%s before", killedAt.Sub(goneAt).Round(time.Millisecond))
	}
	figuref(t, "oom: limit %s; the agent was killed after %d headless services of %d KiB (%d MiB) were created; reason %s (exit code %d); liveness entry seen gone %s the kubelet reported the kill (both polled)",
		dsOOMLimit, created, dsOOMServiceBytes>>10, created*dsOOMServiceBytes>>20, term.Reason, term.ExitCode, order)
	if term.Reason != "OOMKilled" {
		t.Errorf("the agent's container ended with reason %q, want OOMKilled", term.Reason)
	}
	// Long enough to see the load on kube-proxy's path (and the restarted
	// agent fail again while the services are there).
	time.Sleep(3 * time.Second)
	_, st := s.agentStatus(t, ctx)
	t.Logf("agent %s after the kill was reported: restarts %d, state %+v", time.Since(killedAt).Round(time.Millisecond), st.RestartCount, st.State)
	res := s.stopLoad(t, ctx, load)
	figuref(t, "oom: load over the OOM kill: %s", res)
	if res.LongestGap > killGapTarget {
		t.Errorf("longest gap %s, want at most %s; failures:\n%s", res.LongestGap, killGapTarget, res.firstFailures(5))
	}
	if res.OK < minLoadOK {
		t.Errorf("only %d requests succeeded, want at least %d", res.OK, minLoadOK)
	}

	// When the services go and the limit is restored.
	for i := range created {
		if err := c.Admin.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("filler-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	load = s.startLoad(t, ctx, "load-restore", true)
	cur, _ := s.agentPod(ctx)
	restore := time.Now()
	s.patchMemory(t, ctx, origRequest, origLimit)
	// Then the agent intercepts again.
	s.waitAgentReady(t, ctx, 2*time.Minute, cur.UID)
	waitFor(t, time.Minute, "the agent intercepts after the limit is restored", func() bool { return s.intercepting(t, ctx) })
	back := time.Since(restore)
	time.Sleep(time.Second)
	res = s.stopLoad(t, ctx, load)
	figuref(t, "oom: services deleted and limit restored to %s; intercepting again %s after the patch; load over the restore: %s",
		origLimit, back.Round(time.Millisecond), res)
	if res.LongestGap > killGapTarget {
		t.Errorf("longest gap %s, want at most %s; failures:\n%s", res.LongestGap, killGapTarget, res.firstFailures(5))
	}
	s.assertNoDuplicates(t, ctx, "oom")
}

// uninstall: when the overlay (or the rendered manifest) is deleted, then
// the node holds no rule, chain, set or address of the agent's, and pods
// reach kube-apiserver through kube-proxy.
func (s *dsScenario) uninstall(t *testing.T, ctx context.Context) {
	c := s.c
	start := time.Now()
	del := []string{"delete", "-k", s.overlay, "--timeout=2m"}
	if s.rendered != "" {
		del = []string{"delete", "-f", s.rendered, "--timeout=2m"}
	}
	out := s.mustKubectl(t, ctx, del...)
	t.Logf("kubectl %s %s:\n%s", del[0], del[1], out)
	waitFor(t, 2*time.Minute, "the agent's pods gone", func() bool {
		pods, err := c.Admin.CoreV1().Pods(sandbox.AgentNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
	gone := time.Since(start)

	nat, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sets, err := c.Node.Output(ctx, "ipset", "list", "-n")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) {
		t.Errorf("nat table still names %s:\n%s", sandbox.AgentChain, nat)
	}
	if slices.Contains(strings.Fields(sets), sandbox.AgentLivenessSet) {
		t.Errorf("set %s left: %s", sandbox.AgentLivenessSet, sets)
	}
	if strings.Contains(addrs, " "+sandbox.AgentListenIP+"/") || strings.Contains(addrs, "kube-apicache0") {
		t.Errorf("listen address or link left:\n%s", addrs)
	}
	if st := readNFTState(t, ctx, c); st.Tables != 0 {
		t.Errorf("the agent's nftables table is left: %+v", st)
	}
	if s.nft {
		if table, err := c.Node.Output(ctx, "nft", "list", "table", "ip", "kube-proxy"); err != nil || !sandbox.HasNFTServiceRule(table, sandbox.ServiceVIP) {
			t.Errorf("kube-proxy's nftables rule for the VIP is gone (%v):\n%s", err, table)
		}
	} else if !sandbox.HasServiceRule(nat, sandbox.ServiceVIP) {
		t.Errorf("kube-proxy's rule for the VIP is gone:\n%s", nat)
	}

	// And a pod's kubectl goes straight to kube-apiserver.
	asked := time.Now()
	o := s.exec(t, ctx, s.reader, "kubectl", "get", "configmaps")
	if !strings.Contains(o, "kube-root-ca.crt") {
		t.Errorf("kubectl get configmaps after the uninstall:\n%s", o)
	}
	var viaAgent, direct int
	for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool {
		return slices.Contains(ev.SourceIPs, s.reader.Pod.Status.PodIP) && strings.HasPrefix(ev.UserAgent, "kubectl") && ev.RequestReceivedTimestamp.After(asked.Add(-time.Second))
	}) {
		if slices.Contains(ev.SourceIPs, sandbox.NodeIP) {
			viaAgent++
		} else {
			direct++
		}
	}
	if direct == 0 || viaAgent > 0 {
		t.Errorf("after the uninstall kubectl's requests reached kube-apiserver %d times directly and %d times through an agent", direct, viaAgent)
	}
	var left []string
	for _, l := range strings.Split(nat, "\n") {
		if strings.HasPrefix(l, "-A PREROUTING") || strings.HasPrefix(l, "-A OUTPUT") {
			left = append(left, l)
		}
	}
	sort.Strings(left)
	figuref(t, "uninstall: kubectl %s %s to pods gone %s; no chain, jump, set or address left (hooks: %q); the pod's kubectl reached kube-apiserver directly (%d requests)",
		del[0], del[1], gone.Round(time.Millisecond), left, direct)
}

// checkStatusCommand runs `kube-apicache status` as an operator would, with
// the admin's kubeconfig, and checks that it reports this node's agent
// intercepting, ready and with a healthy upstream.
func (s *dsScenario) checkStatusCommand(t *testing.T, ctx context.Context) {
	t.Helper()
	out, err := s.c.AdminCommand(ctx, agentBin, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("kube-apicache status: %v\n%s", err, out)
	}
	figuref(t, "install: kube-apicache status:\n%s", out)
	if !strings.Contains(string(out), "1 agents: 1 intercepting, 0 not, 0 not answering") {
		t.Errorf("kube-apicache status does not report one intercepting agent:\n%s", out)
	}
	out, err = s.c.AdminCommand(ctx, agentBin, "status", "-o", "json").Output()
	if err != nil {
		t.Fatalf("kube-apicache status -o json: %v", err)
	}
	var rows []struct {
		Node   string         `json:"node"`
		Status *status.Status `json:"status"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("kube-apicache status -o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Node != sandbox.NodeName || rows[0].Status == nil {
		t.Fatalf("kube-apicache status -o json: %s", out)
	}
	st := rows[0].Status
	healthy := 0
	for _, u := range st.Upstreams {
		if u.Healthy {
			healthy++
		}
	}
	if !st.Intercepting || !st.Ready || healthy == 0 || st.CertificateNotAfter == nil {
		t.Errorf("status of the agent: intercepting %v, ready %v, %d healthy upstreams, certificate until %v; want intercepting, ready, a healthy upstream and a certificate",
			st.Intercepting, st.Ready, healthy, st.CertificateNotAfter)
	}
	// /statusz is not open: kube-apiserver's pods proxy passes on no
	// credentials of the admin who asks, so without status's token the
	// agent sees system:anonymous and refuses.
	pod, err := s.agentPod(ctx)
	if err != nil || pod == nil {
		t.Fatalf("agent pod: %v", err)
	}
	raw := fmt.Sprintf("/api/v1/namespaces/%s/pods/https:%s:%d/proxy%s", sandbox.AgentNamespace, pod.Name, sandbox.DaemonSetMetricsPort, status.StatuszPath)
	if out, err := s.kubectl(ctx, "get", "--raw", raw); err == nil || !strings.Contains(out+err.Error(), "system:anonymous") {
		t.Errorf("kubectl get --raw %s without status's token = %v %.300q, want refused for system:anonymous", raw, err, out)
	}
}
