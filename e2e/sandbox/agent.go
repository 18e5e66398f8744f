package sandbox

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/cache"
)

// Agent defaults, as the DaemonSet runs it.
const (
	AgentNamespace      = "kube-apicache"
	AgentServiceAccount = "kube-apicache"
	AgentListenIP       = "169.254.25.10"
	AgentListenPort     = 10443
	AgentMetricsAddr    = "127.0.0.1:10445"
	AgentChain          = "KUBE-APICACHE"
)

// Agent is a kube-apicache process running as a hostNetwork pod on the
// sandbox node.
type Agent struct {
	Pod      *Pod
	Process  *Process
	CertFile string
	KeyFile  string
}

// NewAgentPod creates the agent's Pod object (hostNetwork, its own
// ServiceAccount) and a serving certificate from the cluster CA for the VIP,
// the listen IP and the kubernetes Service names.
func (c *Cluster) NewAgentPod(ctx context.Context, name string) (*Pod, string, string, error) {
	pod, err := c.NewPod(ctx, PodSpec{Name: name, Namespace: AgentNamespace, ServiceAccount: AgentServiceAccount, HostNetwork: true})
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile, err := c.agentServingCert(pod, NodeName)
	if err != nil {
		return nil, "", "", err
	}
	return pod, certFile, keyFile, nil
}

// AgentArgs are the flags the sandbox runs the agent with. A flag in extra
// replaces the default of the same name (several are slices, where repeating
// would add rather than replace). Every cached resource is pinned (watched
// from start-up, as most scenarios expect a warm cache) unless extra sets
// --cache-pinned-resources itself.
func (c *Cluster) AgentArgs(certFile, keyFile string, extra ...string) []string {
	var ups []string
	for _, as := range c.APIServers() {
		ups = append(ups, as.URL)
	}
	cached := cache.DefaultResources
	for _, e := range extra {
		if v, ok := strings.CutPrefix(e, "--cache-resources="); ok {
			cached = v
		}
	}
	defaults := []string{
		"--node-name=" + NodeName,
		"--upstream=" + strings.Join(ups, ","),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		"--sync-period=1s",
		// The scenarios were written against the iptables dataplane (its
		// chain and ipsets); the nftables ones ask for theirs.
		"--dataplane=iptables",
		// Every emulated pod exists before the scenarios send from it, but
		// not always a second before: the cluster CIDR, not the pods' own
		// IPs (the agent's default), keeps the scenarios free of that race.
		// TestDetectLocalPodIPs covers the default.
		"--detect-local-mode=ClusterCIDR",
		"--cluster-cidr=" + ClusterPodCIDR,
		"--cache-pinned-resources=" + cached,
		"-v=2",
	}
	if c.Minor < ConstrainedImpersonationMinor {
		// What docs/install/requirements.md asks of clusters without constrained
		// impersonation; applyRBAC grants the reads it needs.
		defaults = append(defaults, "--cache-as-node=false")
	}
	var args []string
	for _, d := range defaults {
		name, _, _ := strings.Cut(d, "=")
		overridden := false
		for _, e := range extra {
			if strings.HasPrefix(e, name+"=") {
				overridden = true
			}
		}
		if !overridden {
			args = append(args, d)
		}
	}
	return append(args, extra...)
}

// StartAgent runs binary in pod with args and waits until it reports ready.
func (c *Cluster) StartAgent(ctx context.Context, pod *Pod, binary string, args ...string) (*Agent, error) {
	proc, err := pod.Start(binary, args...)
	if err != nil {
		return nil, err
	}
	a := &Agent{Pod: pod, Process: proc}
	if err := a.WaitReady(ctx); err != nil {
		proc.Stop(5 * time.Second)
		return nil, err
	}
	return a, nil
}

// WaitReady waits until the agent intercepts: /intercepting answers 200
// (anonymously, as the health paths do).
func (a *Agent) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := a.Process.Exited(); done {
			return false, fmt.Errorf("agent exited (%v): %s", err, tail(a.Process.Log(), 20))
		}
		code, _, err := AgentGetWithToken(ctx, a.Pod.NetNS, AgentMetricsAddr, "/intercepting", "", 5*time.Second)
		return err == nil && code == http.StatusOK, nil
	})
}

// Metrics returns the agent's /metrics text, read with the scraper's token.
func (a *Agent) Metrics(ctx context.Context) (string, error) {
	code, b, err := a.Pod.cluster.AgentGet(ctx, a.Pod.NetNS, AgentMetricsAddr, "/metrics", true, 5*time.Second)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("agent metrics: HTTP %d: %.200s", code, b)
	}
	return string(b), err
}

// CollectGarbage makes an agent started with --profiling run a garbage
// collection now (its heap profile endpoint does, with gc=1), so that its
// heap metrics count live memory only.
func (a *Agent) CollectGarbage(ctx context.Context) error {
	code, b, err := a.Pod.cluster.AgentGet(ctx, a.Pod.NetNS, AgentMetricsAddr, "/debug/pprof/heap?gc=1", true, time.Minute)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("heap profile: HTTP %d: %.200s", code, b)
	}
	return nil
}

// NodeNetState returns what the agent can leave on the node: the nat table
// as iptables-save prints it, and the addresses of every link.
func (c *Cluster) NodeNetState(ctx context.Context) (nat, addrs string, err error) {
	if nat, err = c.Node.Output(ctx, "iptables-save", "-t", "nat"); err != nil {
		return "", "", err
	}
	// Without iptables-save's "# Generated ... on <time>" lines, so that
	// two states compare equal when the rules are.
	var rules []string
	for line := range strings.Lines(nat) {
		if !strings.HasPrefix(line, "#") {
			rules = append(rules, line)
		}
	}
	nat = strings.Join(rules, "")
	addrs, err = c.Node.Output(ctx, "ip", "-o", "addr", "show")
	return nat, addrs, err
}

// AgentLivenessSet is the agent's default liveness ipset.
const AgentLivenessSet = "KUBE-APICACHE-LIVE"

// NodeSets returns `ipset list` of the node namespace: every set with its
// members.
func (c *Cluster) NodeSets(ctx context.Context) (string, error) {
	return c.Node.Output(ctx, "ipset", "list")
}

// NodeIP is the node's address on the control-plane link: the source of
// requests the agent relays.
const NodeIP = nodeCPAddr

// AgentUsername is the agent's own identity.
func AgentUsername() string {
	return "system:serviceaccount:" + AgentNamespace + ":" + AgentServiceAccount
}

// NewExternalAgentPod is NewAgentPod for an agent of the external
// dataplane: a pod of its own network namespace (not hostNetwork), as a
// Cilium Local Redirect Policy's backend runs.
func (c *Cluster) NewExternalAgentPod(ctx context.Context, name string) (*Pod, string, string, error) {
	pod, err := c.NewPod(ctx, PodSpec{Name: name, Namespace: AgentNamespace, ServiceAccount: AgentServiceAccount})
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile, err := c.agentServingCert(pod, NodeName)
	if err != nil {
		return nil, "", "", err
	}
	return pod, certFile, keyFile, nil
}
