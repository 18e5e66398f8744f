package sandbox

import (
	"context"
	"fmt"
	"net"
)

// simNodeNet is the /24 of simulated node i: .1 on the control-plane side,
// .2 the node's own address.
const simNodeNet = "10.201.%d.%d"

// MaxSimNodes bounds AddSimNode's index.
const MaxSimNodes = 250

// SimNode is a simulated node for scale scenarios: a network namespace
// linked to the control-plane namespace, with a Ready Node object, the
// simulated kube-proxy's rules for the kubernetes Service, and no pod
// network: its pods (PodSpec.Node) run in its host network, as DaemonSet
// pods often do.
type SimNode struct {
	Name  string
	NetNS NetNS
	// IP is the node's address; its host-network pods have it too.
	IP string
}

// AddSimNode creates simulated node i (1 to MaxSimNodes), named
// sim-node-<i>.
func (c *Cluster) AddSimNode(ctx context.Context, i int) (*SimNode, error) {
	if i < 1 || i > MaxSimNodes {
		return nil, fmt.Errorf("simulated node %d: the index must be 1 to %d", i, MaxSimNodes)
	}
	if c.opts.RealNode {
		return nil, fmt.Errorf("simulated nodes need the emulated node's control plane, not a real node's")
	}
	ns, err := c.newNetNS(ctx, fmt.Sprintf("s%d", i))
	if err != nil {
		return nil, err
	}
	n := &SimNode{Name: fmt.Sprintf("sim-node-%d", i), NetNS: ns, IP: fmt.Sprintf(simNodeNet, i, 2)}
	gw, veth := fmt.Sprintf(simNodeNet, i, 1), fmt.Sprintf("s%d", i)
	for _, s := range [][]string{
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns.Name()},
		{"ip", "addr", "add", gw + "/24", "dev", veth},
		{"ip", "link", "set", veth, "up"},
	} {
		if err := c.CP.Run(ctx, s...); err != nil {
			return nil, err
		}
	}
	for _, s := range [][]string{
		{"ip", "addr", "add", n.IP + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", gw},
	} {
		if err := ns.Run(ctx, s...); err != nil {
			return nil, err
		}
	}
	if err := c.installKubeProxyIn(ctx, ns); err != nil {
		return nil, err
	}
	if err := c.createNode(ctx, n.Name, n.IP); err != nil {
		return nil, err
	}
	return n, nil
}

// NewSimAgentPod is NewAgentPod for a simulated node: the agent's Pod bound
// to node, in its host network, and a serving certificate.
func (c *Cluster) NewSimAgentPod(ctx context.Context, name string, node *SimNode) (*Pod, string, string, error) {
	pod, err := c.NewPod(ctx, PodSpec{Name: name, Namespace: AgentNamespace, ServiceAccount: AgentServiceAccount, HostNetwork: true, Node: node})
	if err != nil {
		return nil, "", "", err
	}
	certFile, keyFile, err := c.agentServingCert(pod, node.Name)
	if err != nil {
		return nil, "", "", err
	}
	return pod, certFile, keyFile, nil
}

// agentServingCert issues the agent's serving certificate for the VIP, the
// listen IP and the kubernetes Service names into pod's directory.
func (c *Cluster) agentServingCert(pod *Pod, node string) (certFile, keyFile string, err error) {
	kp, err := c.CA.Issue(CertSpec{
		CommonName:   "system:node:" + node,
		Organization: []string{"system:nodes"},
		DNSNames:     KubernetesServiceNames(),
		IPs:          []net.IP{net.ParseIP(ServiceVIP), net.ParseIP(AgentListenIP)},
		Server:       true,
	})
	if err != nil {
		return "", "", err
	}
	return kp.Write(pod.Dir, "serving")
}
