package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ServiceAccountDir is where a pod sees its ServiceAccount volume.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// PodSpec describes a sandbox pod.
type PodSpec struct {
	Name           string
	Namespace      string
	ServiceAccount string
	// HostNetwork pods run in the node namespace; others get a namespace
	// of their own on the pod bridge.
	HostNetwork bool
	// Node, when set, binds the pod to a simulated node (AddSimNode)
	// instead of the sandbox node; such pods run in its host network.
	Node *SimNode
}

// Pod is a real Pod object bound to the sandbox node, plus the network and
// mount namespaces its processes run in. Its ServiceAccount token comes from
// the TokenRequest API, bound to the Pod object, so it carries the pod and
// node claims a kubelet-issued token would.
type Pod struct {
	Spec   PodSpec
	Object *corev1.Pod
	// NetNS is the pod's network namespace (the node's for HostNetwork).
	NetNS NetNS
	// IP is the pod's address.
	IP string
	// Dir holds the ServiceAccount volume's files and a home directory.
	Dir string
	// Token is the pod's ServiceAccount token.
	Token string

	cluster *Cluster
}

// NewPod creates the namespace and ServiceAccount if needed, the Pod object,
// its token and volume files, and its network.
func (c *Cluster) NewPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	if spec.ServiceAccount == "" {
		spec.ServiceAccount = "default"
	}
	realNode := c.opts.RealNode
	if spec.Node != nil && !spec.HostNetwork {
		return nil, fmt.Errorf("pod %s/%s: pods of a simulated node run in its host network", spec.Namespace, spec.Name)
	}
	nodeName := NodeName
	if spec.Node != nil {
		nodeName = spec.Node.Name
	}
	if realNode && !spec.HostNetwork {
		return nil, fmt.Errorf("pod %s/%s: on the real node only host-network sandbox pods exist; the kubelet runs the others", spec.Namespace, spec.Name)
	}
	if err := c.EnsureNamespace(ctx, spec.Namespace); err != nil {
		return nil, err
	}
	image, pull := "sandbox.invalid/process:latest", corev1.PullPolicy("")
	if realNode {
		// The kubelet runs the Pod: a pause container in the node's
		// network, beside the processes the test starts there itself.
		image, pull = PauseImage, corev1.PullNever
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: spec.ServiceAccount, Namespace: spec.Namespace}}
	if _, err := c.Admin.CoreV1().ServiceAccounts(spec.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ServiceAccount: %w", err)
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: spec.Namespace, Labels: map[string]string{"app": spec.Name}},
		Spec: corev1.PodSpec{
			NodeName:                     nodeName,
			ServiceAccountName:           spec.ServiceAccount,
			HostNetwork:                  spec.HostNetwork,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: pull}},
		},
	}
	obj, err := c.Admin.CoreV1().Pods(spec.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Pod: %w", err)
	}
	p := &Pod{Spec: spec, Object: obj, cluster: c}
	p.Dir = filepath.Join(c.Dir, "pods", spec.Namespace+"_"+spec.Name)
	if err := os.MkdirAll(filepath.Join(p.Dir, "serviceaccount"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(p.Dir, "home"), 0o755); err != nil {
		return nil, err
	}
	if err := p.refreshVolume(ctx); err != nil {
		return nil, err
	}
	hostIP := nodeCPAddr
	switch {
	case spec.Node != nil:
		p.NetNS, p.IP, hostIP = spec.Node.NetNS, spec.Node.IP, spec.Node.IP
	case spec.HostNetwork:
		p.NetNS, p.IP = c.Node, nodeCPAddr
	default:
		err = c.attachPod(ctx, p)
	}
	if err != nil {
		return nil, err
	}
	if realNode {
		return p, nil // the kubelet reports its status
	}
	obj.Status.Phase = corev1.PodRunning
	obj.Status.PodIP = p.IP
	obj.Status.PodIPs = []corev1.PodIP{{IP: p.IP}}
	obj.Status.HostIP = hostIP
	if p.Object, err = c.Admin.CoreV1().Pods(spec.Namespace).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("updating Pod status: %w", err)
	}
	return p, nil
}

// EnsureNamespace creates ns if needed and waits until it has its default
// ServiceAccount and kube-root-ca.crt.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	return c.waitForNamespaceReady(ctx, ns)
}

// refreshVolume writes token, ca.crt and namespace as the kubelet would:
// the token from TokenRequest bound to the Pod, ca.crt from the namespace's
// kube-root-ca.crt ConfigMap.
func (p *Pod) refreshVolume(ctx context.Context) error {
	c, spec := p.cluster, p.Spec
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3607),
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: p.Object.Name, UID: p.Object.UID,
		},
	}}
	tr, err := c.Admin.CoreV1().ServiceAccounts(spec.Namespace).CreateToken(ctx, spec.ServiceAccount, tr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting token: %w", err)
	}
	cm, err := c.Admin.CoreV1().ConfigMaps(spec.Namespace).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading kube-root-ca.crt: %w", err)
	}
	p.Token = tr.Status.Token
	files := map[string]string{"token": tr.Status.Token, "ca.crt": cm.Data["ca.crt"], "namespace": spec.Namespace}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(p.Dir, "serviceaccount", name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// attachPod gives the pod a network namespace on the pod bridge with a
// default route through the node.
func (c *Cluster) attachPod(ctx context.Context, p *Pod) error {
	c.mu.Lock()
	n := c.nextPodIP
	c.nextPodIP++
	c.mu.Unlock()
	if n > 250 {
		return fmt.Errorf("pod network full")
	}
	ns, err := c.newNetNS(ctx, "p"+strconv.Itoa(n))
	if err != nil {
		return err
	}
	p.NetNS, p.IP = ns, fmt.Sprintf(podNet, n)
	veth := "vp" + strconv.Itoa(n)
	for _, s := range [][]string{
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns.Name()},
		{"ip", "link", "set", veth, "master", "cbr0"},
		{"ip", "link", "set", veth, "up"},
	} {
		if err := c.Node.Run(ctx, s...); err != nil {
			return err
		}
	}
	for _, s := range [][]string{
		{"ip", "addr", "add", p.IP + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", podGateway},
	} {
		if err := ns.Run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// podWrapper runs inside the pod's network namespace, in the private mount
// namespace `ip netns exec` creates: it mounts a fresh /run and the
// ServiceAccount volume at the path every in-cluster client reads, then
// execs the command.
const podWrapper = `set -e
mount -t tmpfs -o size=4m,mode=755 tmpfs /run
mkdir -p ` + ServiceAccountDir + `
mount --bind -o ro "$KAC_SA_DIR" ` + ServiceAccountDir + `
unset KAC_SA_DIR
exec "$@"`

// Command returns a command that runs inside the pod exactly as a container
// process would see it: the pod's network, the ServiceAccount volume, and
// the kubernetes Service environment, with no kubeconfig.
func (p *Pod) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", p.NetNS.Name(), "/bin/sh", "-c", podWrapper, "sh", name}, args...)
	cmd := exec.CommandContext(ctx, "ip", full...)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(p.Dir, "home"),
		"KUBERNETES_SERVICE_HOST=" + ServiceVIP,
		"KUBERNETES_SERVICE_PORT=" + strconv.Itoa(ServicePort),
		"KUBERNETES_SERVICE_PORT_HTTPS=" + strconv.Itoa(ServicePort),
		"POD_NAME=" + p.Spec.Name,
		"POD_NAMESPACE=" + p.Spec.Namespace,
		"NODE_NAME=" + p.Object.Spec.NodeName,
		"KAC_SA_DIR=" + filepath.Join(p.Dir, "serviceaccount"),
	}
	return cmd
}

// Start runs a long-lived command in the pod; its output goes to a log file
// in the pod's directory.
func (p *Pod) Start(name string, args ...string) (*Process, error) {
	cmd := p.Command(context.Background(), name, args...)
	proc, err := startProcess(filepath.Base(name), cmd, filepath.Join(p.Dir, filepath.Base(name)+".log"))
	if err != nil {
		return nil, err
	}
	c := p.cluster
	c.mu.Lock()
	c.procs = append(c.procs, proc)
	c.mu.Unlock()
	return proc, nil
}
