package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// cycles runs after the uninstall, on the real node with its real
// kube-proxy: given a node that holds nothing of the agent, when 100
// agents of the scenario's dataplane are started one after the other in
// the node's network namespace (a host-network pod's process, as the
// DaemonSet's container is, without the kubelet's restart back-off), each
// SIGKILLed at a random point of its start-up or while serving, then no
// cycle leaves a second chain, table, set, entry or address; a last agent
// holds exactly one dataplane and a TLS connection from the node to the
// VIP reaches it; and once it is stopped (SIGTERM), the node holds nothing
// of the agent and kube-proxy's rule for the VIP is intact.
func (s *dsScenario) cycles(t *testing.T, ctx context.Context) {
	c := s.c
	// The uninstall deleted the agent's namespace and RBAC: the agents
	// here run with the same ServiceAccount and rights, granted again.
	waitFor(t, 2*time.Minute, "the agent's namespace deleted", func() bool {
		_, err := c.Admin.CoreV1().Namespaces().Get(ctx, sandbox.AgentNamespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := c.ApplyRBAC(ctx); err != nil {
		t.Fatalf("granting the agent's rights again: %v", err)
	}

	what, dataplane := "iptables dataplane, real kube-proxy in iptables mode", "--dataplane=iptables"
	check := func(i int) { checkCycleIPTables(t, ctx, c, i) }
	if s.nft {
		what, dataplane = "nftables dataplane, real kube-proxy in nftables mode", nftDataplane
		check = func(i int) { checkCycleNFT(t, ctx, c, i) }
	}
	startKillCycles(t, ctx, c, what, check, dataplane)

	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	a, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, dataplane)...)
	if err != nil {
		t.Fatalf("starting the last agent: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent", 0, 40*time.Second)
	var final any
	if s.nft {
		final = checkFinalNFT(t, ctx, c)
	} else {
		final = checkFinalIPTables(t, ctx, c)
	}
	if agent, err := s.nodeProbe(ctx); err != nil || !agent {
		t.Errorf("a TLS connection from the node to the VIP did not reach the last agent (agent %v, err %v)", agent, err)
	}

	a.Process.Stop(30 * time.Second)
	waitFor(t, 10*time.Second, "the node holds nothing of the agent", func() bool {
		return nodeClean(t, ctx, c, s.nft) == ""
	})
	if !waitForCond(10*time.Second, func() bool {
		agent, err := s.nodeProbe(ctx)
		return err == nil && !agent
	}) {
		t.Errorf("after the last agent stopped, a TLS connection from the node to the VIP did not reach kube-apiserver")
	}
	figuref(t, "real node, %s: final state %+v; after SIGTERM nothing of the agent left and the VIP reaches kube-apiserver", what, final)
}

// nodeClean returns what the agent left on the node, and kube-proxy's rule
// for the VIP if it is missing; "" when the node is clean.
func nodeClean(t *testing.T, ctx context.Context, c *sandbox.Cluster, nftProxy bool) string {
	t.Helper()
	nat, addrs, err := c.NodeNetState(ctx)
	if err != nil {
		return err.Error()
	}
	var left []string
	if strings.Contains(nat, sandbox.AgentChain) {
		left = append(left, "chain "+sandbox.AgentChain)
	}
	if sets, err := c.Node.Output(ctx, "ipset", "list", "-n"); err == nil && strings.Contains(sets, sandbox.AgentLivenessSet) {
		left = append(left, "set "+sandbox.AgentLivenessSet)
	}
	if strings.Contains(addrs, " "+sandbox.AgentListenIP+"/") {
		left = append(left, "address "+sandbox.AgentListenIP)
	}
	if st := readNFTState(t, ctx, c); st.Tables != 0 {
		left = append(left, "nftables table")
	}
	if nftProxy {
		if table, err := c.Node.Output(ctx, "nft", "list", "table", "ip", "kube-proxy"); err != nil || !sandbox.HasNFTServiceRule(table, sandbox.ServiceVIP) {
			left = append(left, "kube-proxy's nftables rule for the VIP missing")
		}
	} else if !sandbox.HasServiceRule(nat, sandbox.ServiceVIP) {
		left = append(left, "kube-proxy's iptables rule for the VIP missing")
	}
	return strings.Join(left, ", ")
}
