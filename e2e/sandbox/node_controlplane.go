package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The control plane a real node adds. The emulated node has pods made by
// hand, bound by NewPod; a real node runs what workload controllers create,
// so a cluster with one also runs the controllers for Deployments,
// ReplicaSets and DaemonSets, and kube-scheduler to bind their pods.

// baseControllers are kube-controller-manager's controllers in every
// sandbox.
var baseControllers = []string{
	"serviceaccount-controller", "serviceaccount-token-controller",
	"certificatesigningrequest-signing-controller", "certificatesigningrequest-approving-controller",
	"certificatesigningrequest-cleaner-controller", "root-ca-certificate-publisher-controller",
	"namespace-controller", "garbage-collector-controller", "clusterrole-aggregation-controller",
}

// realNodeControllers are added with a real node: the workload
// controllers, whose pods its kubelet runs, and the node lifecycle
// controller, which lifts the
// node.kubernetes.io/not-ready taint that kube-apiserver's
// TaintNodesByCondition admission puts on a new Node (only pods that
// tolerate it, such as DaemonSet pods, schedule until then).
var realNodeControllers = []string{"deployment-controller", "replicaset-controller", "daemonset-controller", "node-lifecycle-controller"}

// controllers is the value of kube-controller-manager's --controllers.
func (c *Cluster) controllers() string {
	cs := append([]string(nil), baseControllers...)
	if c.opts.RealNode {
		cs = append(cs, realNodeControllers...)
	}
	cs = append(cs, c.opts.Controllers...)
	return strings.Join(cs, ",")
}

// startScheduler runs kube-scheduler in the control-plane namespace, with
// a client certificate for system:kube-scheduler (bound to its bootstrap
// ClusterRoles), no leader election and no serving port. It is stopped
// with the cluster.
func (n *RealNode) startScheduler(ctx context.Context) (*Process, error) {
	c := n.cluster
	kp, err := c.CA.Issue(CertSpec{CommonName: "system:kube-scheduler", Client: true})
	if err != nil {
		return nil, err
	}
	if _, _, err := kp.Write(c.Dir, "kube-scheduler"); err != nil {
		return nil, err
	}
	kubeconfig := c.path("kube-scheduler.kubeconfig")
	if err := c.writeKubeconfig(kubeconfig, "kube-scheduler", c.APIServers()[0].URL); err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", c.CP.Name(), filepath.Join(n.binDir, "kube-scheduler"),
		"--kubeconfig", kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--v", "2",
	)
	cmd.Env = os.Environ()
	p, err := startProcess("kube-scheduler", cmd, c.path("kube-scheduler.log"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	// It has no health port: give it a moment to fail on its flags.
	select {
	case <-p.Done():
		return nil, fmt.Errorf("kube-scheduler exited: %s", tail(p.Log(), 20))
	case <-time.After(500 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p, nil
}
