package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// agentPodsReader is the ClusterRole (and binding) the test gives the
// agent's own ServiceAccount: list and watch of pods cluster-wide, as
// --cache-as-node=false asks for, which the shipped RBAC does not grant.
const agentPodsReader = "e2e-impersonation-agent-pods"

// TestNodeImpersonationRefused is the scenario of a kube-apiserver that
// refuses the agent's node impersonation, whatever the reason: before
// Kubernetes 1.36 (the ConstrainedImpersonation gate off, as on a 1.35
// control plane from KUBE_APICACHE_BIN_DIR) or, on 1.36 and later, the
// kube-apicache:node-impersonation binding removed, which the test does in
// both cases. The agent runs with the defaults that depend on it:
// --cache-as-node and --detect-local-mode=PodIPs.
//
//  1. Given the agent's ServiceAccount allowed to list and watch pods, when
//     the agent starts, then it lists this node's pods as itself (source
//     agent, in /statusz, /intercepting and the metric, with the node's
//     refusal as the reason) and a pod's VIP connections reach it.
//  2. Given that permission removed as well, when an agent starts, then it
//     intercepts host-network traffic only and says so: /intercepting and
//     /statusz show source none with both refusals and claim no pod, the
//     metric says none, and a pod's VIP connections reach kube-apiserver
//     through kube-proxy.
func TestNodeImpersonationRefused(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Given: no node impersonation. The binding goes (restored when the
	// test ends); where the gate is off it would be refused anyway.
	// Before 1.36 the sandbox also grants the agent the pods and nodes
	// its --cache-as-node=false needs: the test grants its own.
	for _, name := range []string{nodeImpersonationBinding, sandbox.CacheWithoutImpersonation} {
		if crb, err := c.Admin.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{}); err == nil {
			if err := c.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { restoreBinding(t, c, crb) })
		} else if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	// The agent's pod comes first: its token checks what kube-apiserver
	// answers before the agent runs. Every kube-apiserver of the sandbox
	// is asked, for both verbs the agent uses (its reflector opens a
	// watch-list first): each keeps an allowed impersonation for 10s, per
	// verb, and the agent may reach either.
	agentPod, certFile, keyFile := newAgentPod(t, ctx, c)
	token := &sandbox.Agent{Pod: agentPod}
	nodePods := "/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName
	waitAnswer := func(what string, hdr map[string][]string, want int) {
		t.Helper()
		var got rawResponse
		for _, as := range c.APIServers() {
			for _, path := range []string{nodePods, nodePods + "&watch=true&timeoutSeconds=1"} {
				err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
					got, _ = asAgentAt(t, ctx, as.URL, token, path, hdr)
					return got.code == want, nil
				})
				if err != nil {
					t.Fatalf("%s (%s from %s): %d %s, want %d", what, path, as.URL, got.code, statusMessage(got.body), want)
				}
			}
		}
		t.Logf("%s: %d %s", what, got.code, statusMessage(got.body))
	}
	waitAnswer("this node's pods as the node", asNode(sandbox.NodeName), http.StatusForbidden)
	grantAgentPods(t, ctx, c)
	waitAnswer("this node's pods as the agent", nil, http.StatusOK)

	client := newClientPod(t, ctx, c, "impersonation-refused", "client")
	pool := podCAPool(t, client)
	servedBy := func() string {
		leaf, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
		switch {
		case err != nil:
			return "error: " + err.Error()
		case leaf.Subject.CommonName == "system:node:"+sandbox.NodeName:
			return "agent"
		}
		return "apiserver"
	}
	statusToken, err := c.StatusToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	statusz := func() status.Status {
		t.Helper()
		code, body, err := agentEndpointAs(ctx, c, status.StatuszPath, statusToken)
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s = %d %q (%v)", status.StatuszPath, code, body, err)
		}
		var s status.Status
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatalf("%s: %v: %q", status.StatuszPath, err, body)
		}
		return s
	}
	sourceMetric := func(a *sandbox.Agent) map[string]float64 {
		return sumBy(scrapeAgent(t, ctx, a)["kube_apicache_local_pods_source"], "source")
	}
	// The defaults that depend on listing this node's pods, whatever the
	// sandbox's own defaults are.
	args := func(certFile, keyFile string) []string {
		return c.AgentArgs(certFile, keyFile, "--detect-local-mode=PodIPs", "--cache-as-node=true")
	}

	t.Run("the agent's identity feeds the pods set", func(t *testing.T) {
		// When: the agent starts.
		a, err := c.StartAgent(ctx, agentPod, agentBin, args(certFile, keyFile)...)
		if err != nil {
			t.Fatalf("starting agent: %v", err)
		}
		stopOnCleanup(t, a.Process, "agent", 60, 40*time.Second)

		// Then: it lists this node's pods as itself, says why, and the
		// client pod is intercepted.
		took := waitFor(t, time.Minute, "the pods source to be the agent", func() bool { return statusz().PodsSource == "agent" })
		s := statusz()
		figuref(t, "node impersonation refused: listing this node's pods as the agent %s after the agent was ready; reason: %s",
			took.Round(time.Millisecond), s.PodsSourceReason)
		if !s.Intercepting || s.HostNetworkOnly || s.PodsSourceReason == "" {
			t.Errorf("/statusz: intercepting %v, host-network only %v, reason %q; want intercepting pods, with the node's refusal",
				s.Intercepting, s.HostNetworkOnly, s.PodsSourceReason)
		}
		waitFor(t, 30*time.Second, "the client pod's VIP connections reach the agent", func() bool { return servedBy() == "agent" })
		if code, body, err := agentEndpoint(ctx, c, "/intercepting"); code != http.StatusOK || !strings.Contains(body, "pods source agent") {
			t.Errorf("/intercepting = %d %q (%v), want 200 naming the agent as the pods source", code, body, err)
		}
		if m := sourceMetric(a); m["agent"] != 1 || m["node"] != 0 || m["none"] != 0 {
			t.Errorf("kube_apicache_local_pods_source = %v, want agent only", m)
		}
		if !strings.Contains(a.Process.Log(), "Listing this node's pods as the agent") {
			t.Errorf("the agent's log does not report the fallback:\n%s", tailLines(a.Process.Log(), 30))
		}
		a.Process.Stop(40 * time.Second)
	})

	t.Run("refused both, no pod is claimed", func(t *testing.T) {
		// Given: the agent's own permission removed too.
		if err := c.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, agentPodsReader, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		waitAnswer("this node's pods as the agent, without the grant", nil, http.StatusForbidden)

		// When: an agent starts, in a pod of its own as the other
		// scenarios' agents do.
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		a, err := c.StartAgent(ctx, pod, agentBin, args(certFile, keyFile)...)
		if err != nil {
			t.Fatalf("starting agent: %v", err)
		}
		stopOnCleanup(t, a.Process, "agent", 60, 40*time.Second)

		// Then: it intercepts host-network traffic only, and every
		// report says so with both refusals.
		waitFor(t, time.Minute, "a refusal as the agent in the pods source's reason", func() bool {
			return strings.Contains(statusz().PodsSourceReason, "as the agent")
		})
		s := statusz()
		figuref(t, "node impersonation and the agent refused: /statusz podsSource %q, hostNetworkOnly %v, reason: %s",
			s.PodsSource, s.HostNetworkOnly, s.PodsSourceReason)
		if s.PodsSource != "none" || !s.Intercepting || !s.HostNetworkOnly {
			t.Errorf("/statusz: source %q, intercepting %v, host-network only %v; want none, intercepting host-network traffic only",
				s.PodsSource, s.Intercepting, s.HostNetworkOnly)
		}
		code, body, err := agentEndpoint(ctx, c, "/intercepting")
		t.Logf("/intercepting: %d %s", code, body)
		if code != http.StatusOK || !strings.Contains(body, "pods not intercepted, host-network traffic only: pods source none") {
			t.Errorf("/intercepting = %d %q (%v), want 200 saying no pod is intercepted", code, body, err)
		}
		if strings.Contains(body, "pods source node") || strings.Contains(body, "pods source agent") {
			t.Errorf("/intercepting claims a pods source: %q", body)
		}
		if code, body, _ := agentEndpoint(ctx, c, "/readyz"); !strings.Contains(body, "pods not intercepted") {
			t.Errorf("/readyz = %d %q, want it to say no pod is intercepted", code, body)
		}
		if m := sourceMetric(a); m["none"] != 1 || m["agent"] != 0 || m["node"] != 0 {
			t.Errorf("kube_apicache_local_pods_source = %v, want none only", m)
		}
		if got := servedBy(); got != "apiserver" {
			t.Errorf("the client pod's VIP connection went to %s, want kube-apiserver through kube-proxy", got)
		}
		if !strings.Contains(a.Process.Log(), "Cannot list this node's pods") {
			t.Errorf("the agent's log does not report the refusals:\n%s", tailLines(a.Process.Log(), 30))
		}
	})
}

// grantAgentPods lets the agent's ServiceAccount list and watch pods
// cluster-wide until the test ends.
func grantAgentPods(t *testing.T, ctx context.Context, c *sandbox.Cluster) {
	t.Helper()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: agentPodsReader},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: agentPodsReader},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, err := range []error{
			c.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, agentPodsReader, metav1.DeleteOptions{}),
			c.Admin.RbacV1().ClusterRoles().Delete(ctx, agentPodsReader, metav1.DeleteOptions{}),
		} {
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("removing %s: %v", agentPodsReader, err)
			}
		}
	})
}
