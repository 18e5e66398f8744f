package sandbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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
// shipped manifests and the image, and agentArgs appended to the agent's
// arguments if any. kustomize takes a base only by a relative path.
func WriteOverlay(dir, image string, agentArgs ...string) error {
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
	if len(agentArgs) > 0 {
		k += "patches:\n  - target:\n      kind: DaemonSet\n      name: kube-apicache\n    patch: |-\n"
		for _, a := range agentArgs {
			k += fmt.Sprintf("      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: %q\n", a)
		}
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
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
	full := append([]string{"netns", "exec", c.CP.Name(), bin, "--kubeconfig", filepath.Join(c.Dir, "admin.kubeconfig")}, args...)
	return exec.CommandContext(ctx, "ip", full...)
}

// DaemonSetAgentMetrics scrapes the agent's metrics from the node
// namespace, where the DaemonSet's pod listens on loopback.
func (c *Cluster) DaemonSetAgentMetrics(ctx context.Context) (string, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.Node.DialContext, DisableKeepAlives: true}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+AgentMetricsAddr+"/metrics", nil)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("metrics: %s", resp.Status)
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
