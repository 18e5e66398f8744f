package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// cachedResources is the agent's --cache-resources in both runs: every
// resource the selected specs read that kube-apiserver serves with get,
// list and watch, so that as many of their reads as possible can be
// answered from the cache. Pods and nodes are this node's only.
var cachedResources = []string{
	"pods", "nodes", "services", "endpoints", "endpointslices.discovery.k8s.io", "namespaces",
	"configmaps", "secrets", "serviceaccounts", "events", "events.events.k8s.io",
	"resourcequotas", "limitranges", "podtemplates", "replicationcontrollers",
	"persistentvolumes", "persistentvolumeclaims",
	"leases.coordination.k8s.io",
	"replicasets.apps", "deployments.apps", "daemonsets.apps", "statefulsets.apps", "controllerrevisions.apps",
	"jobs.batch", "cronjobs.batch",
	"poddisruptionbudgets.policy",
	"ingresses.networking.k8s.io", "ingressclasses.networking.k8s.io", "networkpolicies.networking.k8s.io",
	"servicecidrs.networking.k8s.io", "ipaddresses.networking.k8s.io",
	"runtimeclasses.node.k8s.io",
	"priorityclasses.scheduling.k8s.io",
	"csidrivers.storage.k8s.io", "csinodes.storage.k8s.io", "csistoragecapacities.storage.k8s.io",
	"storageclasses.storage.k8s.io", "volumeattachments.storage.k8s.io", "volumeattributesclasses.storage.k8s.io",
	"certificatesigningrequests.certificates.k8s.io",
	"flowschemas.flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations.flowcontrol.apiserver.k8s.io",
	"validatingadmissionpolicies.admissionregistration.k8s.io", "validatingadmissionpolicybindings.admissionregistration.k8s.io",
	"mutatingadmissionpolicies.admissionregistration.k8s.io", "mutatingadmissionpolicybindings.admissionregistration.k8s.io",
	"validatingwebhookconfigurations.admissionregistration.k8s.io", "mutatingwebhookconfigurations.admissionregistration.k8s.io",
	"deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io", "resourceclaimtemplates.resource.k8s.io", "resourceslices.resource.k8s.io",
	"clusterroles.rbac.authorization.k8s.io", "clusterrolebindings.rbac.authorization.k8s.io",
	"roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io",
}

// controllers are the kube-controller-manager controllers the runs add to
// the sandbox's own, for the specs that need a controller but no kubelet:
// resource quota status, the endpoints of selector-less or pod-less
// Services, workload controllers that create pods (which stay pending),
// PodDisruptionBudget status, the finalizers of PVs, PVCs, ServiceCIDRs and
// VolumeAttributesClasses, and admission policy type checks. The node lifecycle controller stays
// out: with no kubelet it would taint the node unreachable and evict the
// sandbox's own pods.
var controllers = []string{
	"resourcequota-controller",
	"endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller",
	"replicationcontroller-controller", "replicaset-controller", "deployment-controller",
	"statefulset-controller", "daemonset-controller", "job-controller", "cronjob-controller",
	"ttl-after-finished-controller", "disruption-controller",
	"persistentvolume-protection-controller", "persistentvolumeclaim-protection-controller",
	"volumeattributesclass-protection-controller", "service-cidr-controller",
	"validatingadmissionpolicy-status-controller",
}

// The pod e2e.test runs in, and its ServiceAccount, bound to cluster-admin.
const (
	suiteNamespace      = "conformance"
	suitePod            = "e2e"
	suiteServiceAccount = "e2e"
)

// Run is one run of the selected specs against one server.
type Run struct {
	// Name is "agent" or "direct".
	Name string
	// ViaAgent sends the suite to the kubernetes Service VIP, which the
	// agent intercepts; otherwise to kube-apiserver's own address.
	ViaAgent bool
}

// RunConfig is what every run shares.
type RunConfig struct {
	BinDir   string
	AgentBin string
	// OutDir receives a directory per run: the JUnit report, the suite's
	// output, the agent's log.
	OutDir   string
	Selected []string
	Procs    int
	// Timeout bounds the suite (ginkgo --timeout); set-up and teardown
	// come on top.
	Timeout time.Duration
}

// RunResult is what a run measured.
type RunResult struct {
	Results map[string]SpecResult
	// Setup is the time from sandbox start to the suite's start, Suite
	// the suite's wall time.
	Setup, Suite time.Duration
	// ExitCode is ginkgo's.
	ExitCode int
	// Cache sums kube_apicache_cache_requests_total by outcome.
	Cache map[string]float64
	// CacheHits sums the hits by resource, Forwarded the requests the
	// cache forwarded by reason.
	CacheHits, Forwarded map[string]float64
}

// runSuite starts a sandbox with the agent, runs the selected specs from a
// pod through the agent or directly, and stops the sandbox.
func runSuite(ctx context.Context, cfg RunConfig, r Run) (_ *RunResult, err error) {
	dir := filepath.Join(cfg.OutDir, r.Name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := sandbox.Start(startCtx, sandbox.Options{BinDir: cfg.BinDir, APIServers: 1, Logf: logf, Controllers: controllers})
	if err != nil {
		return nil, err
	}
	defer func() {
		if stopErr := c.Stop(); stopErr != nil {
			logf("%s run: teardown: %v", r.Name, stopErr)
		}
	}()

	if err := untaintNode(startCtx, c); err != nil {
		return nil, err
	}
	if err := grantCacheReads(startCtx, c); err != nil {
		return nil, err
	}
	agentPod, certFile, keyFile, err := c.NewAgentPod(startCtx, "kube-apicache")
	if err != nil {
		return nil, fmt.Errorf("creating the agent pod: %w", err)
	}
	args := c.AgentArgs(certFile, keyFile, "--cache-resources="+strings.Join(cachedResources, ","))
	agent, err := c.StartAgent(startCtx, agentPod, cfg.AgentBin, args...)
	if err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	defer func() {
		agent.Process.Stop(30 * time.Second)
		if werr := os.WriteFile(filepath.Join(dir, "kube-apicache.log"), []byte(agent.Process.Log()), 0o644); werr != nil {
			logf("%s run: saving the agent's log: %v", r.Name, werr)
		}
	}()

	pod, err := newSuitePod(startCtx, c)
	if err != nil {
		return nil, err
	}
	token, err := suiteToken(startCtx, c, cfg.Timeout+time.Hour)
	if err != nil {
		return nil, err
	}
	server := c.APIServers()[0].URL
	if r.ViaAgent {
		server = fmt.Sprintf("https://%s:%d", sandbox.ServiceVIP, sandbox.ServicePort)
	}
	kubeconfig := filepath.Join(pod.Dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, server, filepath.Join(c.Dir, "ca.crt"), token); err != nil {
		return nil, err
	}

	res := &RunResult{Setup: time.Since(start)}
	logf("%s run: %d specs against %s, %d processes (sandbox ready in %s; output in %s)",
		r.Name, len(cfg.Selected), server, cfg.Procs, res.Setup.Round(time.Second), dir)
	suiteStart := time.Now()
	res.ExitCode, err = runGinkgo(ctx, pod, cfg, dir, kubeconfig)
	res.Suite = time.Since(suiteStart)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	logf("%s run: suite finished in %s (ginkgo exit code %d)", r.Name, res.Suite.Round(time.Second), res.ExitCode)

	metricsCtx, cancelMetrics := context.WithTimeout(ctx, 30*time.Second)
	defer cancelMetrics()
	text, err := agent.Metrics(metricsCtx)
	if err != nil {
		return nil, fmt.Errorf("reading the agent's metrics: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.txt"), []byte(text), 0o644); err != nil {
		return nil, err
	}
	res.Cache, res.CacheHits, res.Forwarded = cacheOutcomes(text)

	if res.Results, err = ReadJUnit(filepath.Join(dir, "junit_01.xml")); err != nil {
		return nil, fmt.Errorf("%w (suite output: %s)", err, filepath.Join(dir, "e2e.log"))
	}
	return res, nil
}

// untaintNode takes the not-ready taint, which kube-apiserver puts on a new
// Node, off the sandbox's node, as the node lifecycle controller does once
// the node reports Ready: the suite counts only untainted nodes as ready
// and schedulable, and needs one. The sandbox runs no such controller: with
// no kubelet heartbeats it would mark the node unreachable.
func untaintNode(ctx context.Context, c *sandbox.Cluster) error {
	node, err := c.Admin.CoreV1().Nodes().Get(ctx, sandbox.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var kept []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			kept = append(kept, t)
		}
	}
	node.Spec.Taints = kept
	if _, err := c.Admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("untainting node %s: %w", node.Name, err)
	}
	return nil
}

// grantCacheReads lets the agent's ServiceAccount get, list and watch
// every cached resource cluster-wide, beyond what the shipped RBAC grants,
// and checks that kube-apiserver serves each of them.
func grantCacheReads(ctx context.Context, c *sandbox.Cluster) error {
	_, lists, err := c.Admin.Discovery().ServerGroupsAndResources()
	if err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	served := map[string]bool{}
	for _, l := range lists {
		group := ""
		if gv, err := parseGroup(l.GroupVersion); err == nil {
			group = gv
		}
		for _, ar := range l.APIResources {
			served[ar.Name+"."+group] = true
		}
	}
	byGroup := map[string][]string{}
	var groups []string
	for _, spec := range cachedResources {
		resource, group, _ := strings.Cut(spec, ".")
		if !served[resource+"."+group] {
			return fmt.Errorf("kube-apiserver does not serve %s, which the agent is to cache", spec)
		}
		if _, ok := byGroup[group]; !ok {
			groups = append(groups, group)
		}
		byGroup[group] = append(byGroup[group], resource)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kube-apicache:conformance-cache"}}
	for _, g := range groups {
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: byGroup[g], Verbs: []string{"get", "list", "watch"}})
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sandbox.AgentNamespace, Name: sandbox.AgentServiceAccount}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// parseGroup returns the group of "group/version", or "" for "v1".
func parseGroup(groupVersion string) (string, error) {
	group, _, ok := strings.Cut(groupVersion, "/")
	if !ok {
		return "", nil
	}
	if group == "" {
		return "", fmt.Errorf("malformed group version %q", groupVersion)
	}
	return group, nil
}

// newSuitePod creates the pod the suite runs in, with a ServiceAccount
// bound to cluster-admin, as conformance runners such as Sonobuoy run it.
func newSuitePod(ctx context.Context, c *sandbox.Cluster) (*sandbox.Pod, error) {
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: suitePod, Namespace: suiteNamespace, ServiceAccount: suiteServiceAccount})
	if err != nil {
		return nil, fmt.Errorf("creating the suite's pod: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "conformance-e2e"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: suiteNamespace, Name: suiteServiceAccount}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("binding cluster-admin: %w", err)
	}
	if err := pod.WaitAllowed(ctx, "create", "namespaces"); err != nil {
		return nil, fmt.Errorf("waiting for cluster-admin to take effect: %w", err)
	}
	return pod, nil
}

// suiteToken returns a token of the suite's ServiceAccount that outlives
// the run (a pod's own token is good for an hour).
func suiteToken(ctx context.Context, c *sandbox.Cluster, lifetime time.Duration) (string, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(lifetime.Seconds()))}}
	tr, err := c.Admin.CoreV1().ServiceAccounts(suiteNamespace).CreateToken(ctx, suiteServiceAccount, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting the suite's token: %w", err)
	}
	return tr.Status.Token, nil
}

func writeKubeconfig(path, server, caFile, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["sandbox"] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: "e2e"}
	cfg.CurrentContext = "sandbox"
	return clientcmd.WriteToFile(*cfg, path)
}

// runGinkgo runs the selected specs with the ginkgo CLI inside pod and
// returns ginkgo's exit code; its output goes to e2e.log in dir. When ctx
// ends, ginkgo gets SIGINT (it ends the running specs, runs their cleanup
// and writes its reports), and the whole process group SIGKILL a minute
// later.
func runGinkgo(ctx context.Context, pod *sandbox.Pod, cfg RunConfig, dir, kubeconfig string) (int, error) {
	args := []string{
		"--procs=" + strconv.Itoa(cfg.Procs),
		"--timeout=" + cfg.Timeout.String(),
		"-v", "--no-color", "--silence-skips",
		"--focus=" + FocusExpr(cfg.Selected),
		filepath.Join(cfg.BinDir, "e2e.test"),
		"--",
		"--kubeconfig=" + kubeconfig,
		"--provider=skeleton",
		// No kubelet: a namespace that held pods bound to the node never
		// finishes deleting, and each spec would wait for it.
		"--delete-namespace=false",
		// The one node has no kubelet, so no system pods or DaemonSets
		// become ready: do not wait for them.
		"--allowed-not-ready-nodes=-1",
		"--kubectl-path=" + filepath.Join(cfg.BinDir, "kubectl"),
		"--report-dir=" + dir,
		"--e2e-output-dir=" + dir,
		"--disable-log-dump",
	}
	log, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		return -1, err
	}
	defer log.Close()
	cmd := pod.Command(context.Background(), filepath.Join(cfg.BinDir, "ginkgo"), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("starting ginkgo: %w", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		pgid := cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}()
	err = cmd.Wait()
	close(done)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("running ginkgo: %w", err)
	}
	return 0, nil
}

// cacheOutcomes sums the agent's kube_apicache_cache_requests_total by
// outcome, its hits by resource and its forwarded requests by reason.
func cacheOutcomes(metrics string) (byOutcome, hitsByResource, forwardedByReason map[string]float64) {
	byOutcome, hitsByResource, forwardedByReason = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, "kube_apicache_cache_requests_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		outcome := labelValue(labels, "outcome")
		byOutcome[outcome] += v
		switch outcome {
		case "hit":
			hitsByResource[labelValue(labels, "resource")] += v
		case "forwarded":
			forwardedByReason[labelValue(labels, "reason")] += v
		}
	}
	return byOutcome, hitsByResource, forwardedByReason
}

// labelValue returns a label's value in a sample's label list.
func labelValue(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, name+`="`); ok {
			return strings.TrimSuffix(v, `"`)
		}
	}
	return ""
}
