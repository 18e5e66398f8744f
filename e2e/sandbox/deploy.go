package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// Deploying the shipped manifests onto a real node (StartRealNode), as the
// real-node acceptance test and the demo do.

// The images the real node imports (make image, make e2e-images).
const (
	RealAgentImage  = "docker.io/library/kube-apicache:latest"
	RealClientImage = "docker.io/library/kube-apicache-client:e2e"
	// DaemonSetAgentSelector selects the agent's DaemonSet pods.
	DaemonSetAgentSelector = "app.kubernetes.io/name=kube-apicache"
)

// RealNodeImagesDir is $KUBE_APICACHE_IMAGES_DIR, or the repository's
// _output/images (make image e2e-images).
func RealNodeImagesDir() string {
	if d := os.Getenv("KUBE_APICACHE_IMAGES_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "_output", "images")
}

// RealNodeImages returns the OCI archives in dir to import into the real
// node, and an error if the pause, client or agent image is missing.
func RealNodeImages(dir string) ([]string, error) {
	images, _ := filepath.Glob(filepath.Join(dir, "*.oci.tar"))
	for _, want := range []string{"pause.oci.tar", "client.oci.tar", "kube-apicache.oci.tar"} {
		if !slices.Contains(images, filepath.Join(dir, want)) {
			return nil, fmt.Errorf("no %s in %s (make e2e-images image, or set KUBE_APICACHE_IMAGES_DIR)", want, dir)
		}
	}
	return images, nil
}

// WriteOverlay writes into dir the kustomization an operator would: the
// shipped manifests, the image, the shipped configuration (the ConfigMap
// kube-apicache-config) with config appended to it if config is not empty
// (YAML at the AgentConfiguration's top level), and agentArgs appended to
// the agent's arguments if any. kustomize takes a base only by a relative
// path.
func WriteOverlay(dir, image, config string, agentArgs ...string) error {
	base, err := filepath.Rel(dir, filepath.Join(RepoRoot(), "manifests"))
	if err != nil {
		return err
	}
	name, tag, _ := strings.Cut(image, ":")
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: kube-apicache
    newName: %s
    newTag: %s
`, base, name, tag)
	var patches []string
	if config != "" {
		shipped, err := ShippedConfig()
		if err != nil {
			return err
		}
		cm := map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "kube-apicache-config", "namespace": AgentNamespace},
			"data":     map[string]string{"config.yaml": strings.TrimRight(shipped, "\n") + "\n" + config},
		}
		b, err := yaml.Marshal(cm)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "config-patch.yaml"), b, 0o644); err != nil {
			return err
		}
		patches = append(patches, "  - path: config-patch.yaml\n")
	}
	if len(agentArgs) > 0 {
		p := "  - target:\n      kind: DaemonSet\n      name: kube-apicache\n    patch: |-\n"
		for _, a := range agentArgs {
			p += fmt.Sprintf("      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: %q\n", a)
		}
		patches = append(patches, p)
	}
	if len(patches) > 0 {
		k += "patches:\n" + strings.Join(patches, "")
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// ShippedConfig returns the AgentConfiguration the manifests ship, the
// config.yaml key of manifests/config.yaml.
func ShippedConfig() (string, error) {
	raw, err := os.ReadFile(filepath.Join(RepoRoot(), "manifests", "config.yaml"))
	if err != nil {
		return "", err
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		return "", err
	}
	if cm.Data["config.yaml"] == "" {
		return "", fmt.Errorf("manifests/config.yaml has no config.yaml key")
	}
	return cm.Data["config.yaml"], nil
}

// Kubectl runs the machine's kubectl ($KUBECTL, or kubectl) as the
// sandbox's admin, inside the control-plane namespace (where the admin
// kubeconfig's server is).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	out, err := c.KubectlCommand(ctx, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// KubectlCommand is the command Kubectl runs.
func (c *Cluster) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	bin := os.Getenv("KUBECTL")
	if bin == "" {
		bin = "kubectl"
	}
	return c.AdminCommand(ctx, bin, args...)
}

// AdminCommand runs bin with --kubeconfig of the sandbox's admin, then
// args, inside the control-plane namespace, as an operator's workstation
// would run a kubeconfig-based tool.
func (c *Cluster) AdminCommand(ctx context.Context, bin string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", c.CP.Name(), bin, "--kubeconfig", filepath.Join(c.Dir, "admin.kubeconfig")}, args...)
	return exec.CommandContext(ctx, "ip", full...)
}

// DaemonSetMetricsPort is the DaemonSet's metrics port (manifests/daemonset.yaml).
const DaemonSetMetricsPort = 10445

// DaemonSetAgentMetricsAddr is where the DaemonSet's agent serves its
// metrics: the node's IP (its pod's status.hostIP), DaemonSetMetricsPort.
func (c *Cluster) DaemonSetAgentMetricsAddr(ctx context.Context) (string, error) {
	pods, err := c.Admin.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kube-apicache"})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == NodeName && p.Status.HostIP != "" {
			return net.JoinHostPort(p.Status.HostIP, strconv.Itoa(DaemonSetMetricsPort)), nil
		}
	}
	return "", fmt.Errorf("no kube-apicache pod with a host IP on %s", NodeName)
}

// DaemonSetAgentMetrics scrapes the DaemonSet's agent's metrics from the
// node namespace, over HTTPS with the scraper's token, as Prometheus does.
func (c *Cluster) DaemonSetAgentMetrics(ctx context.Context) (string, error) {
	addr, err := c.DaemonSetAgentMetricsAddr(ctx)
	if err != nil {
		return "", err
	}
	code, b, err := c.AgentGet(ctx, c.Node, addr, "/metrics", true, 2*time.Second)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("metrics: HTTP %d: %.200s", code, b)
	}
	return string(b), err
}

// WaitPodRunning waits (up to a minute) until the pod runs and has an IP,
// and returns it; a pod that ends first is an error.
func (c *Cluster) WaitPodRunning(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s/%s ended: %s", namespace, name, p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	if err != nil {
		if last != nil {
			return last, fmt.Errorf("pod %s/%s not Running: %w (status %+v)", namespace, name, err, last.Status)
		}
		return nil, fmt.Errorf("pod %s/%s not Running: %w", namespace, name, err)
	}
	return last, nil
}

// PodIPInAgentSet reports whether ip is in the agent's set of this node's
// pods (--detect-local-mode=PodIPs), in whichever dataplane holds it: the
// nftables table's set, or the iptables dataplane's ipset. Until it is, the
// pod's connections to the VIP take kube-proxy's path.
func (c *Cluster) PodIPInAgentSet(ctx context.Context, ip string) bool {
	if out, err := c.Node.Output(ctx, "nft", "list", "set", "ip", "kube-apicache", "pods"); err == nil && strings.Contains(out, ip) {
		return true
	}
	out, err := c.Node.Output(ctx, "ipset", "list", AgentLivenessSet+"-PODS")
	return err == nil && slices.Contains(strings.Fields(out), ip)
}
