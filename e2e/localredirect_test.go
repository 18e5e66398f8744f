package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// TestExternalDataplaneLocalRedirect runs the agent with
// --dataplane=external in a pod of its own network namespace, as the
// backend of a Cilium Local Redirect Policy runs, and stands in for
// Cilium with a rule of the test's own: a DNAT of the Service VIP to the
// agent's pod IP in the client pod's namespace (Cilium translates at the
// pod's socket or veth, before the node's netfilter). Cilium itself is not
// run: what it does when the backend turns not ready is stood in for by
// the test withdrawing its rule.
//
//   - Given the agent ready and the stand-in redirect, when a pod reads
//     through the VIP, then the agent answers from its cache.
//   - The agent programs no netfilter: the node's nat table and sets, and
//     its own namespace's rules, are as before it started.
//   - When the agent stops (readiness fails first) and the redirect is
//     withdrawn, then the pod reaches kube-apiserver directly.
func TestExternalDataplaneLocalRedirect(t *testing.T) {
	c := requireCluster(t)
	ctx := context.Background()
	natBefore, _, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	setsBefore, err := c.NodeSets(ctx)
	if err != nil {
		t.Fatal(err)
	}

	agentPod, certFile, keyFile, err := c.NewExternalAgentPod(ctx, "apicache-external")
	if err != nil {
		t.Fatal(err)
	}
	args := c.AgentArgs(certFile, keyFile, "--dataplane=external", "--external-drain-delay=1s", "--pod-path-check-interval=0")
	a, err := c.StartAgent(ctx, agentPod, agentBin, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Process.Stop(10 * time.Second)
	code, body, err := sandbox.AgentGetWithToken(ctx, agentPod.NetNS, sandbox.AgentMetricsAddr, "/readyz", "", 5*time.Second)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/readyz = %d %s, %v; want ready", code, body, err)
	}

	// The agent's own namespace holds no rule of its.
	for _, cmd := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
		out, err := agentPod.NetNS.Output(ctx, cmd...)
		if err != nil {
			continue // that tool has nothing to list here
		}
		if strings.Contains(out, "KUBE-APICACHE") || strings.Contains(out, "kube-apicache") {
			t.Errorf("%s in the agent's namespace shows the agent's rules:\n%s", strings.Join(cmd, " "), out)
		}
	}

	client := newClientPod(t, ctx, c, "default", "lrp-client")
	redirect := []string{"OUTPUT", "-d", sandbox.ServiceVIP + "/32", "-p", "tcp", "--dport", strconv.Itoa(sandbox.ServicePort),
		"-j", "DNAT", "--to-destination", agentPod.IP + ":" + strconv.Itoa(sandbox.AgentListenPort)}
	if err := client.NetNS.Run(ctx, append([]string{"iptables", "-t", "nat", "-I"}, redirect...)...); err != nil {
		t.Fatalf("stand-in redirect: %v", err)
	}
	withdraw := func() {
		_ = client.NetNS.Run(ctx, append([]string{"iptables", "-t", "nat", "-D"}, redirect...)...)
	}
	defer withdraw()

	// Given the redirect, when the pod reads through the VIP, then the
	// agent answers from its cache.
	viaVIP, _ := podClients(t, c, client)
	before := readCacheMetrics(t, ctx, a)
	path := "/api/v1/namespaces/default/services?resourceVersion=0"
	for i := 0; i < 5; i++ {
		if r := viaVIP.do(t, ctx, http.MethodGet, path, "application/json", "lrp-test", nil); r.code != http.StatusOK {
			t.Fatalf("read through the redirect: HTTP %d: %.300s", r.code, r.body)
		}
	}
	after := readCacheMetrics(t, ctx, a)
	if hits := after.outcomes["hit"] - before.outcomes["hit"]; hits < 5 {
		t.Errorf("cache hits %v for 5 reads through the redirect, want 5", hits)
	}

	// The node's netfilter is as before: the agent programmed nothing.
	natAfter, _, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if natAfter != natBefore {
		t.Errorf("the node's nat table changed while the external agent ran:\nbefore:\n%s\nafter:\n%s", natBefore, natAfter)
	}
	if setsAfter, err := c.NodeSets(ctx); err != nil || setsAfter != setsBefore {
		t.Errorf("the node's ipsets changed (%v):\nbefore:\n%s\nafter:\n%s", err, setsBefore, setsAfter)
	}
	if out, err := c.Node.Output(ctx, "nft", "list", "tables"); err == nil && strings.Contains(out, "kube-apicache") {
		t.Errorf("the node has the agent's nftables table:\n%s", out)
	}

	// When the agent stops, then it turns not ready before it closes; the
	// stand-in for Cilium then withdraws its redirect, and the pod reaches
	// kube-apiserver directly.
	stopped := make(chan struct{})
	go func() { a.Process.Stop(10 * time.Second); close(stopped) }()
	notReady := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		code, _, err := sandbox.AgentGetWithToken(ctx, agentPod.NetNS, sandbox.AgentMetricsAddr, "/readyz", "", time.Second)
		return err == nil && code != http.StatusOK, nil
	})
	if notReady != nil {
		t.Errorf("the stopping agent never answered not ready on /readyz before it closed: %v", notReady)
	}
	withdraw()
	<-stopped
	// The client's connection to the agent is gone (reset, as Cilium's
	// would be); a new connection to the VIP goes to kube-apiserver.
	fresh, _ := podClients(t, c, client)
	if r := fresh.do(t, ctx, http.MethodGet, path, "application/json", "lrp-test", nil); r.code != http.StatusOK {
		t.Fatalf("read after the redirect was withdrawn: HTTP %d: %.300s", r.code, r.body)
	}
	if natEnd, _, err := c.NodeNetState(ctx); err != nil || natEnd != natBefore {
		t.Errorf("the node's nat table after the agent stopped (%v) differs:\n%s", err, fmt.Sprint(natEnd))
	}
}
