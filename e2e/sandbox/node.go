package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The real node: containerd, a kubelet and kube-proxy in the node
// namespace, running real containers, beside (and instead of) the
// emulated node. A cluster started with Options.RealNode has no simulated
// kube-proxy rules and no pre-made Node object: the kubelet registers the
// node and kube-proxy programs the Service VIPs.
const (
	// PauseImage is the pod sandbox image; it is never pulled, so one of
	// RealNodeOptions.Images must provide it.
	PauseImage = "registry.k8s.io/pause:3.10"
	// RealPodCIDR is the real node's pod range (its Node's podCIDR), on a
	// bridge of its own; the emulated pods keep 10.244.0.0/24 on cbr0.
	RealPodCIDR    = "10.244.1.0/24"
	realPodGateway = "10.244.1.1"
	realPodBridge  = "cni0"
	// ClusterPodCIDR holds every pod range (kube-proxy's clusterCIDR).
	ClusterPodCIDR = "10.244.0.0/16"
	// CNIBinDir is where Debian's containernetworking-plugins installs.
	CNIBinDir = "/usr/lib/cni"
)

// RealNodeOptions configure a real node.
type RealNodeOptions struct {
	// BinDir holds kubelet and kube-proxy (make node-binaries); empty
	// means the cluster's BinDir.
	BinDir string
	// Images are OCI image archives imported into containerd's k8s.io
	// namespace before the kubelet starts. Nothing is ever pulled.
	Images []string
	// ProxyMode is kube-proxy's --proxy-mode: "iptables" (the default) or
	// "nftables".
	ProxyMode string
}

// RealNode is a running real node. Stop (or the cluster's Stop) undoes
// everything it changed on the machine.
type RealNode struct {
	// Name is the Node's name (NodeName).
	Name string
	// Dir holds containerd's root and state, the kubelet's root dir, the
	// CNI configuration and address state, configs and pod logs.
	Dir string
	// Socket is containerd's CRI socket.
	Socket string
	// CgroupRoot is the cgroup, in every hierarchy, that holds all pods.
	CgroupRoot string
	// Containerd, Kubelet and KubeProxy are the node's daemons.
	Containerd, Kubelet, KubeProxy *Process
	// Scheduler is the kube-scheduler that binds the pods of DaemonSets
	// and Deployments to the node (node_controlplane.go); it runs in the
	// control-plane namespace and stops with the cluster.
	Scheduler *Process
	// Timings of the start, from the call of StartRealNode.
	Timings RealNodeTimings
	// ProxyMode is kube-proxy's mode: iptables or nftables.
	ProxyMode string

	cluster    *Cluster
	binDir     string
	cniNetwork string
	journal    *journal

	mu      sync.Mutex // protects the field below
	stopped bool
}

// RealNodeTimings are the moments a real node's start reached, measured
// from the call of StartRealNode.
type RealNodeTimings struct {
	Containerd time.Duration // containerd answers on its socket
	Images     time.Duration // image archives imported
	Registered time.Duration // the kubelet created the Node
	Ready      time.Duration // the Node is Ready
	KubeProxy  time.Duration // kube-proxy programmed the kubernetes VIP
}

func (n *RealNode) path(name string) string { return filepath.Join(n.Dir, name) }

// StartRealNode starts containerd, the kubelet and kube-proxy in the node
// namespace and kube-scheduler in the control-plane namespace, and returns
// once the Node is Ready and kube-proxy has programmed the kubernetes
// Service. The cluster must have been started with Options.RealNode. On error everything started so far is undone.
//
// It changes the machine outside the sandbox's namespaces (sysctls,
// cgroups, mounts, a few host paths; see node_host.go): the original state
// is recorded first and restored by Stop, by the cluster's Stop, or, if
// this process is killed, by the next sandbox start. One real node runs on
// a machine at a time.
func (c *Cluster) StartRealNode(ctx context.Context, opts RealNodeOptions) (_ *RealNode, err error) {
	if !c.opts.RealNode {
		return nil, errors.New("the cluster was started without Options.RealNode: its simulated kube-proxy and Node would fight the real ones")
	}
	n := &RealNode{
		Name:       NodeName,
		Dir:        c.path("node"),
		CgroupRoot: "/" + c.nsName("node"),
		cluster:    c,
		binDir:     opts.BinDir,
		cniNetwork: c.nsName("pods"),
		ProxyMode:  opts.ProxyMode,
	}
	switch n.ProxyMode {
	case "":
		n.ProxyMode = "iptables"
	case "iptables", "nftables":
	default:
		return nil, fmt.Errorf("kube-proxy mode %q: want iptables or nftables", opts.ProxyMode)
	}
	if n.binDir == "" {
		n.binDir = c.opts.BinDir
	}
	n.Socket = n.path("containerd/containerd.sock")
	if err := n.checkPrerequisites(opts); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.realNode != nil || c.stopped {
		c.mu.Unlock()
		return nil, errors.New("the cluster has a real node already, or is stopped")
	}
	c.realNode = n
	c.mu.Unlock()
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Stop())
		}
	}()
	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }

	// Record the host before changing it: a stale node's changes are
	// undone first, so they are not recorded as the original state.
	if err := cleanStaleRealNodes(true); err != nil {
		return nil, err
	}
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	n.journal = &journal{
		ID: c.id, Pid: os.Getpid(), Dir: n.Dir, Socket: n.Socket,
		CgroupRoot: n.CgroupRoot, CNINetwork: n.cniNetwork,
	}
	if err := recordHost(n.journal); err != nil {
		return nil, fmt.Errorf("recording the host's state: %w", err)
	}
	if err := createCgroupRoot(n.CgroupRoot); err != nil {
		return nil, err
	}
	if err := n.writeFiles(); err != nil {
		return nil, err
	}

	if n.Containerd, err = n.start("containerd", "/usr/bin/containerd", "--config", n.path("containerd/config.toml")); err != nil {
		return nil, err
	}
	if err := n.waitContainerd(ctx); err != nil {
		return nil, err
	}
	n.Timings.Containerd = since()
	for _, img := range opts.Images {
		if err := n.ctr(ctx, "images", "import", img); err != nil {
			return nil, fmt.Errorf("importing %s: %w", img, err)
		}
	}
	ready, err := n.CtrOutput(ctx, "images", "check", "--quiet")
	if err != nil {
		return nil, err
	}
	if !slices.Contains(strings.Fields(ready), PauseImage) {
		return nil, fmt.Errorf("no image archive provides the pod sandbox image %s (unpacked images: %q)", PauseImage, ready)
	}
	n.Timings.Images = since()
	c.logf("real node: containerd up in %s, images imported by %s", n.Timings.Containerd, n.Timings.Images)

	if n.Scheduler, err = n.startScheduler(ctx); err != nil {
		return nil, err
	}
	if n.Kubelet, err = n.start("kubelet", filepath.Join(n.binDir, "kubelet"),
		"--config", n.path("kubelet-config.json"),
		"--kubeconfig", c.path("kubelet.kubeconfig"),
		"--root-dir", n.path("kubelet"),
		"--cert-dir", n.path("kubelet/pki"),
		"--hostname-override", n.Name,
		"--node-ip", nodeCPAddr,
		"--v", "2",
	); err != nil {
		return nil, err
	}
	if err := n.waitNode(ctx, n.Kubelet, "registered", func(*corev1.Node) bool { return true }); err != nil {
		return nil, err
	}
	n.Timings.Registered = since()
	// The podCIDR is what a node IPAM controller would assign; the
	// sandbox runs none.
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, RealPodCIDR, RealPodCIDR)
	if _, err := c.Admin.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("assigning the podCIDR: %w", err)
	}
	if n.KubeProxy, err = n.start("kube-proxy", filepath.Join(n.binDir, "kube-proxy"),
		"--config", n.path("kube-proxy-config.json"), "--v", "2"); err != nil {
		return nil, err
	}
	if err := n.waitNode(ctx, n.Kubelet, "Ready", nodeReady); err != nil {
		return nil, err
	}
	n.Timings.Ready = since()
	if err := n.waitKubeProxy(ctx); err != nil {
		return nil, err
	}
	n.Timings.KubeProxy = since()
	c.logf("real node: registered at %s, Ready at %s, kube-proxy synced at %s",
		n.Timings.Registered, n.Timings.Ready, n.Timings.KubeProxy)
	return n, nil
}

func (n *RealNode) checkPrerequisites(opts RealNodeOptions) error {
	var missing []string
	for _, f := range []string{filepath.Join(n.binDir, "kubelet"), filepath.Join(n.binDir, "kube-proxy"), filepath.Join(n.binDir, "kube-scheduler")} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f+" (make node-binaries)")
		}
	}
	for _, f := range []string{"/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/bin/ctr"} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f+" (make node-deps)")
		}
	}
	// kube-proxy's nftables mode drives the nft binary.
	for _, tool := range []string{"runc", "nsenter", "conntrack", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (make node-deps)")
		}
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(CNIBinDir, p)+" (make node-deps)")
		}
	}
	for _, img := range opts.Images {
		if _, err := os.Stat(img); err != nil {
			missing = append(missing, img)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the real node needs: %s", strings.Join(missing, ", "))
	}
	return nil
}

// writeFiles writes the certificates, kubeconfigs and configurations.
func (n *RealNode) writeFiles() error {
	c := n.cluster
	for name, spec := range map[string]CertSpec{
		"kubelet":         {CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}, Client: true},
		"kubelet-serving": {CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}, DNSNames: []string{n.Name}, IPs: []net.IP{net.ParseIP(nodeCPAddr)}, Server: true},
		"kube-proxy":      {CommonName: "system:kube-proxy", Client: true},
	} {
		kp, err := c.CA.Issue(spec)
		if err != nil {
			return err
		}
		if _, _, err := kp.Write(c.Dir, name); err != nil {
			return err
		}
	}
	server := c.APIServers()[0].URL
	for _, user := range []string{"kubelet", "kube-proxy"} {
		if err := c.writeKubeconfig(c.path(user+".kubeconfig"), user, server); err != nil {
			return err
		}
	}
	cni, err := n.cniConfig()
	if err != nil {
		return err
	}
	kubelet, err := n.kubeletConfig()
	if err != nil {
		return err
	}
	proxy, err := n.kubeProxyConfig()
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{
		"containerd/config.toml":     []byte(n.containerdConfig()),
		"cni/net.d/10-pods.conflist": cni,
		"kubelet-config.json":        kubelet,
		"kube-proxy-config.json":     proxy,
		"resolv.conf":                nil,
	} {
		if err := n.writeFile(name, b); err != nil {
			return err
		}
	}
	return nil
}

// start runs a node daemon in the node namespace. nsenter enters only the
// network namespace: `ip netns exec` would also remount /sys, hiding the
// cgroup hierarchies from the kubelet and runc.
func (n *RealNode) start(name, bin string, args ...string) (*Process, error) {
	c := n.cluster
	cmd := exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + c.Node.Name(), bin}, args...)...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	p, err := startProcess(name, cmd, c.path(name+".log"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// ctr runs containerd's client against the node's containerd, in the k8s.io
// namespace the CRI plugin uses.
func (n *RealNode) ctr(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return run(ctx, "ctr", append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...)
}

// CtrOutput runs ctr against the node's containerd (k8s.io namespace) and
// returns its output.
func (n *RealNode) CtrOutput(ctx context.Context, args ...string) (string, error) {
	return output(ctx, "ctr", append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...)
}

func (n *RealNode) waitContainerd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := n.Containerd.Exited(); done {
			return false, fmt.Errorf("containerd exited (%v): %s", err, tail(n.Containerd.Log(), 20))
		}
		last = run(ctx, "ctr", "--address", n.Socket, "version")
		return last == nil, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("containerd: %w (last: %v)", err, last)
	}
	return err
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitNode waits up to two minutes until the Node exists and cond holds,
// failing early if the kubelet exits.
func (n *RealNode) waitNode(ctx context.Context, kubelet *Process, what string, cond func(*corev1.Node) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := kubelet.Exited(); done {
			return false, fmt.Errorf("kubelet exited (%v): %s", err, tail(kubelet.Log(), 30))
		}
		node, err := n.cluster.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return cond(node), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Node %s %s: %w\n%s", n.Name, what, err, tail(kubelet.Log(), 30))
	}
	return nil
}

// waitKubeProxy waits until kube-proxy has written the kubernetes
// Service's rule into the node namespace's nat table.
func (n *RealNode) waitKubeProxy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := n.KubeProxy.Exited(); done {
			return false, fmt.Errorf("kube-proxy exited (%v): %s", err, tail(n.KubeProxy.Log(), 30))
		}
		if n.ProxyMode == "nftables" {
			rules, err := n.cluster.Node.Output(ctx, "nft", "list", "table", "ip", "kube-proxy")
			return err == nil && HasNFTServiceRule(rules, ServiceVIP), nil
		}
		rules, err := n.cluster.Node.Output(ctx, "iptables-save", "-t", "nat")
		return err == nil && HasServiceRule(rules, ServiceVIP), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-proxy's rules: %w\n%s", err, tail(n.KubeProxy.Log(), 30))
	}
	return nil
}

// HasServiceRule reports whether an iptables-save nat table sends vip to a
// service chain from KUBE-SERVICES, as kube-proxy's iptables mode does.
func HasServiceRule(natRules, vip string) bool {
	for _, l := range strings.Split(natRules, "\n") {
		if strings.HasPrefix(l, "-A KUBE-SERVICES ") && strings.Contains(l, "-d "+vip+"/32") && strings.Contains(l, "-j KUBE-SVC-") {
			return true
		}
	}
	return false
}

// RestartKubeProxy stops kube-proxy (SIGTERM) and starts it again, as a
// rollout of its DaemonSet or a crash would, and waits until the new
// process has completed a full sync of its rules (in nftables mode, the
// first sync deletes and re-creates its base chains). It returns how long
// that took.
func (n *RealNode) RestartKubeProxy(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	n.KubeProxy.Stop(10 * time.Second)
	// The log file is appended to: the new process's lines start here.
	offset := len(n.KubeProxy.Log())
	p, err := n.start("kube-proxy", filepath.Join(n.binDir, "kube-proxy"),
		"--config", n.path("kube-proxy-config.json"), "--v", "2")
	if err != nil {
		return 0, err
	}
	n.KubeProxy = p
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("kube-proxy exited (%v): %s", err, tail(p.Log(), 30))
		}
		log := p.Log()
		return len(log) > offset && strings.Contains(log[offset:], "SyncProxyRules complete"), nil
	})
	if err != nil {
		return 0, fmt.Errorf("waiting for the restarted kube-proxy's sync: %w", err)
	}
	if err := n.waitKubeProxy(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// HasNFTServiceRule reports whether kube-proxy's nftables table (as `nft
// list table ip kube-proxy` prints it) maps vip's TCP port 443 to a
// service chain, as its nftables mode does.
func HasNFTServiceRule(table, vip string) bool {
	for _, l := range strings.Split(table, "\n") {
		if strings.Contains(l, vip+" . tcp . 443 : goto service-") {
			return true
		}
	}
	return false
}

// Stop takes the node down and undoes every change it made to the
// machine: kube-proxy and the kubelet stop (kube-proxy's rules stay in the
// node namespace, which goes with the cluster; `kube-proxy --cleanup`
// removes them when the cluster lives on), the containers are killed,
// containerd and its shims stop, everything under Dir is unmounted, the
// cgroups are removed, the sysctls restored, the host paths the node
// created removed, and the Node object deleted. It is safe to call more
// than once; the cluster's Stop calls it.
func (n *RealNode) Stop() error {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		return nil
	}
	n.stopped = true
	n.mu.Unlock()
	c := n.cluster
	var errs []error
	if n.KubeProxy != nil {
		if err := n.KubeProxy.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if out, err := output(ctx, "nsenter", "--net=/var/run/netns/"+c.Node.Name(),
			filepath.Join(n.binDir, "kube-proxy"), "--config", n.path("kube-proxy-config.json"), "--cleanup"); err != nil {
			c.logf("real node: kube-proxy --cleanup: %v %s", err, out)
		}
		cancel()
	}
	if n.Kubelet != nil {
		if err := n.Kubelet.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if n.journal != nil {
		// Containers first, while containerd still runs (it reaps its
		// shims' tasks), then containerd itself.
		if err := killCgroupTree(n.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Containerd != nil {
		if err := n.Containerd.Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if n.journal != nil {
		if err := undoHost(n.journal); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.Admin.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			c.logf("real node: deleting Node %s: %v", n.Name, err)
		}
		cancel()
	}
	return errors.Join(errs...)
}

// Leftovers lists what the node left on the machine after Stop: node
// programs naming its Dir, mounts under its Dir, its cgroups, sysctls that
// differ from the recorded originals, host paths it created, and its
// journal. Empty means the machine is as it was.
func (n *RealNode) Leftovers() []string {
	var out []string
	for _, pid := range pidsReferencing(n.Dir) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	for _, m := range MountsUnder(n.cluster.Dir) {
		out = append(out, "mount "+m)
	}
	for _, d := range cgroupDirs(n.CgroupRoot) {
		out = append(out, "cgroup "+d)
	}
	if n.journal != nil {
		now := ReadHostSysctls()
		for k, v := range n.journal.Sysctls {
			if now[k] != v {
				out = append(out, fmt.Sprintf("sysctl %s=%s (was %s)", k, now[k], v))
			}
		}
		for _, p := range n.journal.Absent {
			if _, err := os.Lstat(p); err == nil {
				out = append(out, "path "+p)
			}
		}
		if _, err := os.Stat(journalPath(n.journal.ID)); err == nil {
			out = append(out, "journal "+journalPath(n.journal.ID))
		}
	}
	return out
}

// writeKubeletClientPKI issues the apiserver's client certificate for
// kubelets (logs, exec, port-forward), as kubeadm's
// apiserver-kubelet-client: the kubelet authenticates it against the
// cluster CA and authorizes it with a SubjectAccessReview.
func (c *Cluster) writeKubeletClientPKI() error {
	kp, err := c.CA.Issue(CertSpec{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}, Client: true})
	if err != nil {
		return err
	}
	_, _, err = kp.Write(c.Dir, "apiserver-kubelet-client")
	return err
}

// kubeletClientArgs are the apiserver's flags for talking to a real
// kubelet; none without a real node.
func (c *Cluster) kubeletClientArgs() []string {
	if !c.opts.RealNode {
		return nil
	}
	return []string{
		"--kubelet-client-certificate", c.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", c.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority", c.path("ca.crt"),
	}
}
