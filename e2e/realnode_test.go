package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// realNodeEnabled gates the real-node scenarios until the real node is the
// sandbox's default (`make e2e-real-node` sets it).
const realNodeEnabled = "KUBE_APICACHE_REAL_NODE"

// realNodeGroup is the claim (see claim) of every scenario that starts a
// real node: one machine runs one at a time, so a sharded run gives them
// all to one shard.
const realNodeGroup = "real-node"

// TestRealNode: given a sandbox whose node is a real kubelet with
// containerd and kube-proxy, when a pod is created on it, then the kubelet
// runs it, kube-proxy routes the kubernetes Service VIP, the apiserver
// reaches the kubelet, and after the pod is deleted and the sandbox
// stopped, the machine is as it was: no processes, mounts, cgroups, netns,
// host paths or root-namespace iptables changes, sysctls restored.
func TestRealNode(t *testing.T) {
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
	binDir := os.Getenv("KUBE_APICACHE_BIN_DIR")
	if binDir == "" {
		binDir = sandbox.DefaultBinDir()
	}
	imagesDir := os.Getenv("KUBE_APICACHE_IMAGES_DIR")
	if imagesDir == "" {
		imagesDir = filepath.Join(sandbox.RepoRoot(), "_output", "images")
	}
	images, _ := filepath.Glob(filepath.Join(imagesDir, "*.oci.tar"))
	if !slices.Contains(images, filepath.Join(imagesDir, "pause.oci.tar")) {
		t.Fatalf("no pause.oci.tar in %s (go run ./hack/image, or set KUBE_APICACHE_IMAGES_DIR)", imagesDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	hostBefore := snapshotHost(t)

	// Given a real node.
	c, rn, stop := startRealNodeSandbox(t, ctx, binDir, images, "iptables")
	tm := rn.Timings
	figuref(t, "real node: containerd %s, images %s, registered %s, Ready %s, kube-proxy synced %s",
		tm.Containerd, tm.Images, tm.Registered, tm.Ready, tm.KubeProxy)

	// When a pod is created on it.
	pods := c.Admin.CoreV1().Pods("default")
	podStart := time.Now()
	running := runPausePod(t, ctx, c, "real-pause")
	figuref(t, "real node: pod Running %s after its creation", time.Since(podStart).Round(time.Millisecond))
	// (A second pod stays until the sandbox stops: Stop must kill it.)
	runPausePod(t, ctx, c, "real-pause-kept")

	// Then it has an address from the node's pod range.
	_, podNet, _ := net.ParseCIDR(sandbox.RealPodCIDR)
	if ip := net.ParseIP(running.Status.PodIP); ip == nil || !podNet.Contains(ip) {
		t.Errorf("pod IP %q, want one in %s", running.Status.PodIP, sandbox.RealPodCIDR)
	}
	// And kube-proxy sends the kubernetes VIP to the apiserver.
	rules, err := c.Node.Output(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !sandbox.HasServiceRule(rules, sandbox.ServiceVIP) {
		t.Errorf("no KUBE-SERVICES rule for %s in the node namespace:\n%s", sandbox.ServiceVIP, rules)
	}
	if err := getReadyzThroughVIP(ctx, c); err != nil {
		t.Errorf("GET /readyz through the VIP from the node: %v", err)
	}
	// And the apiserver reaches the kubelet (authenticated and authorized
	// by webhook), as kubectl logs does.
	if _, err := pods.GetLogs(running.Name, &corev1.PodLogOptions{}).DoRaw(ctx); err != nil {
		t.Errorf("pod logs through the apiserver: %v", err)
	}

	// When the pod is deleted, the kubelet stops it and removes it.
	delStart := time.Now()
	if err := pods.Delete(ctx, running.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, running.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod not gone: %v", err)
	}
	figuref(t, "real node: pod gone %s after its deletion", time.Since(delStart).Round(time.Millisecond))

	// When the sandbox stops (with a pod still running), then the machine
	// is as it was.
	stopStart := time.Now()
	if err := stop(); err != nil {
		t.Errorf("stopping: %v", err)
	}
	figuref(t, "real node: teardown %s", time.Since(stopStart).Round(time.Millisecond))
	hostBefore.checkRestored(t, rn)
	if os.Getenv("KUBE_APICACHE_KEEP_SANDBOX") == "" {
		if _, err := os.Stat(c.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox dir %s left (%v)", c.Dir, err)
		}
	}
}

// runPausePod creates a pod of the pause image on the real node and waits
// until it runs.
func runPausePod(t *testing.T, ctx context.Context, c *sandbox.Cluster, name string) *corev1.Pod {
	t.Helper()
	pods := c.Admin.CoreV1().Pods("default")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      sandbox.NodeName,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "pause", Image: sandbox.PauseImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		status := "never read"
		if last != nil {
			status = fmt.Sprintf("%+v", last.Status)
		}
		t.Fatalf("pod %s not Running: %v; status: %s", name, err, status)
	}
	return last
}

// getReadyzThroughVIP dials the kubernetes VIP from the node namespace, as
// a hostNetwork pod would: only kube-proxy's DNAT leads anywhere.
func getReadyzThroughVIP(ctx context.Context, c *sandbox.Cluster) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA.CertPEM)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     c.Node.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:%d/readyz", sandbox.ServiceVIP, sandbox.ServicePort), nil)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// hostState is what a real node must leave on the machine as it found it.
type hostState struct {
	sysctls   map[string]string
	netns     []string
	rootRules string
}

func snapshotHost(t *testing.T) hostState {
	t.Helper()
	return hostState{sysctls: sandbox.ReadHostSysctls(), netns: listNetNS(t), rootRules: rootIptables(t)}
}

// checkRestored checks, after the sandbox stopped, that rn left nothing and
// the machine is as it was before.
func (before hostState) checkRestored(t *testing.T, rn *sandbox.RealNode) {
	t.Helper()
	if left := rn.Leftovers(); len(left) > 0 {
		t.Errorf("left on the machine:\n%s", strings.Join(left, "\n"))
	}
	now := sandbox.ReadHostSysctls()
	for k, v := range before.sysctls {
		if now[k] != v {
			t.Errorf("sysctl %s=%s, was %s", k, now[k], v)
		}
	}
	for _, ns := range listNetNS(t) {
		if !slices.Contains(before.netns, ns) {
			t.Errorf("network namespace %s left", ns)
		}
	}
	if rules := rootIptables(t); rules != before.rootRules {
		t.Errorf("the root namespace's iptables changed:\nbefore:\n%s\nafter:\n%s", before.rootRules, rules)
	}
}

// listNetNS lists the named network namespaces, less the sandboxes of
// other processes (kac-<pid>-*: the other shards of a sharded run, a
// conformance run beside it), which come and go on their own.
func listNetNS(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/var/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ours := fmt.Sprintf("kac-%d-", os.Getpid())
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "kac-") && !strings.HasPrefix(e.Name(), ours) {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

// chainCounters are the packet and byte counters of iptables-save's chain
// lines.
var chainCounters = regexp.MustCompile(`\[\d+:\d+\]$`)

// rootIptables reads the root namespace's rules (iptables-save only reads),
// without comments and counters.
func rootIptables(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "#") {
			continue // generation comments carry a timestamp
		}
		keep = append(keep, chainCounters.ReplaceAllString(l, ""))
	}
	return strings.Join(keep, "\n")
}
