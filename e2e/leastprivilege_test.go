package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const (
	leastPrivNS = "e2e-leastpriv"
	// otherNode is a node the sandbox does not run: pods bound to it are
	// another node's.
	otherNode = "other-node"
	// nodeImpersonationBinding is manifests/rbac.yaml's binding of the
	// agent to the associated-node impersonation rights.
	nodeImpersonationBinding = "kube-apicache:node-impersonation"
	uaLeastPriv              = "kube-apicache-e2e/least-privilege"
)

// asAgent sends a GET straight to kube-apiserver with the agent's own
// token, from the node, with extra headers (Impersonate-*). It returns the
// answer and its headers.
func asAgent(t *testing.T, ctx context.Context, c *sandbox.Cluster, a *sandbox.Agent, path string, hdr map[string][]string) (rawResponse, http.Header) {
	t.Helper()
	return asAgentAt(t, ctx, c.APIServers()[0].URL, a, path, hdr)
}

// asAgentAt is asAgent against the kube-apiserver at base.
func asAgentAt(t *testing.T, ctx context.Context, base string, a *sandbox.Agent, path string, hdr map[string][]string) (rawResponse, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.Pod.Token)
	req.Header.Set("Accept", acceptJSON)
	req.Header.Set("User-Agent", uaLeastPriv)
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := vipClient(t, a.Pod, true).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResponse{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}, resp.Header
}

// asNode is the one impersonation header the agent sends.
func asNode(node string) map[string][]string {
	return map[string][]string{"Impersonate-User": {cache.NodeUsername(node)}}
}

// TestLeastPrivilege is the agent's-own-identity scenario: given the shipped
// RBAC (manifests/rbac.yaml, no pods or nodes for the agent) and an agent
// with the default --cache-as-node, when the agent's own token is used
// directly, then it cannot list all pods nor another node's pods, even
// impersonating its node; the cache still syncs this node's pods and serves
// them to a pod; kube-apiserver's audit log shows the agent's pod watch as
// its node, through the associated-node constraint; and when the
// impersonation grant is missing, the agent says why and forwards the reads.
func TestLeastPrivilege(t *testing.T) {
	c := requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Given: this node's pods and another node's, and a pod allowed to
	// list pods cluster-wide.
	if err := c.EnsureNamespace(ctx, leastPrivNS); err != nil {
		t.Fatal(err)
	}
	for name, node := range map[string]string{"here-1": sandbox.NodeName, "here-2": sandbox.NodeName, "there": otherNode} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest",
				Env: []corev1.EnvVar{{Name: "SECRET_IN_ENV", Value: "not-for-other-nodes"}}}}},
		}
		if _, err := c.Admin.CoreV1().Pods(leastPrivNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	reader := newPodReader(t, ctx, c)

	start := time.Now()
	a := startAgent(t, ctx, c)
	waitCacheSynced(t, ctx, a)

	t.Run("the agent's token cannot list all pods or nodes", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			path string
			hdr  map[string][]string
		}{
			{"all pods as the agent", "/api/v1/pods", nil},
			{"all nodes as the agent", "/api/v1/nodes", nil},
			{"a namespace's pods as the agent", "/api/v1/namespaces/" + leastPrivNS + "/pods", nil},
			{"all pods as its node", "/api/v1/pods", asNode(sandbox.NodeName)},
			{"all nodes as its node", "/api/v1/nodes", asNode(sandbox.NodeName)},
			{"a pod by name as its node (get is not granted)", "/api/v1/namespaces/" + leastPrivNS + "/pods/here-1", asNode(sandbox.NodeName)},
		} {
			got, _ := asAgent(t, ctx, c, a, tc.path, tc.hdr)
			t.Logf("%s: %d %s", tc.name, got.code, statusMessage(got.body))
			if got.code != http.StatusForbidden {
				t.Errorf("%s (GET %s): %d, want 403", tc.name, tc.path, got.code)
			}
		}
	})

	t.Run("the agent's token cannot list another node's pods", func(t *testing.T) {
		there := "/api/v1/pods?fieldSelector=spec.nodeName%3D" + otherNode
		for _, tc := range []struct {
			name string
			hdr  map[string][]string
		}{
			{"as the agent", nil},
			{"as its own node", asNode(sandbox.NodeName)},
			{"as the other node", asNode(otherNode)},
			{"as its own node with the nodes group", map[string][]string{
				"Impersonate-User": {cache.NodeUsername(sandbox.NodeName)}, "Impersonate-Group": {"system:nodes"}}},
		} {
			got, _ := asAgent(t, ctx, c, a, there, tc.hdr)
			t.Logf("%s: %d %s", tc.name, got.code, statusMessage(got.body))
			if got.code != http.StatusForbidden {
				t.Errorf("%s: %d, want 403: %s", tc.name, got.code, got.body)
			}
		}
		// The control: its own node's pods, as its node, as the cache
		// lists them; kube-apiserver classifies the request as a node's
		// (APF FlowSchema system-nodes).
		here := "/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName
		got, hdr := asAgent(t, ctx, c, a, here, asNode(sandbox.NodeName))
		if got.code != http.StatusOK || !strings.Contains(string(got.body), `"here-1"`) || strings.Contains(string(got.body), `"there"`) {
			t.Fatalf("this node's pods as its node: %d %.300s", got.code, got.body)
		}
		fs, err := c.Admin.FlowcontrolV1().FlowSchemas().Get(ctx, "system-nodes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if uid := hdr.Get("X-Kubernetes-Pf-Flowschema-Uid"); uid != string(fs.UID) {
			t.Errorf("the list as the node was classified by FlowSchema UID %q, want system-nodes (%s)", uid, fs.UID)
		}
	})

	t.Run("this node's pods are cached and served to a pod", func(t *testing.T) {
		viaAgent, _ := podClients(t, c, reader)
		before := readCacheMetrics(t, ctx, a)
		got := viaAgent.do(t, ctx, "GET", "/api/v1/namespaces/"+leastPrivNS+"/pods?resourceVersion=0&fieldSelector=spec.nodeName%3D"+sandbox.NodeName, acceptJSON, uaHit, nil)
		if got.code != http.StatusOK {
			t.Fatalf("cached list: %d %s", got.code, got.body)
		}
		want, err := c.Admin.CoreV1().Pods(leastPrivNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
		if err != nil {
			t.Fatal(err)
		}
		var wantNames []string
		for _, p := range want.Items {
			wantNames = append(wantNames, p.Name)
		}
		slices.Sort(wantNames)
		if names := itemNamesJSON(t, got.body); !slices.Equal(names, wantNames) || !slices.Contains(names, "here-1") || slices.Contains(names, "there") {
			t.Errorf("cached list holds %v, want %v (here-1 and here-2, not there)", names, wantNames)
		}
		if hits := readCacheMetrics(t, ctx, a).outcomes["hit"] - before.outcomes["hit"]; hits != 1 {
			t.Errorf("cache hits: %v, want 1", hits)
		}
	})

	t.Run("the audit log shows the agent's watches as its node", func(t *testing.T) {
		events := auditEvents(t, c, func(ev *auditv1.Event) bool {
			return ev.UserAgent == "kube-apicache/"+sandbox.NodeName && ev.ObjectRef != nil && ev.ObjectRef.APIGroup == "" &&
				(ev.ObjectRef.Resource == "pods" || ev.ObjectRef.Resource == "nodes") &&
				!ev.RequestReceivedTimestamp.Time.Before(start.Add(-time.Second))
		})
		watches := map[string]int{}
		for _, ev := range events {
			imp := "(none)"
			if ev.ImpersonatedUser != nil {
				imp = ev.ImpersonatedUser.Username
			}
			if ev.User.Username != sandbox.AgentUsername() || imp != cache.NodeUsername(sandbox.NodeName) {
				t.Errorf("%s %s by %s as %s, want by %s as %s", ev.Verb, ev.RequestURI, ev.User.Username, imp, sandbox.AgentUsername(), cache.NodeUsername(sandbox.NodeName))
				continue
			}
			if !slices.Equal(ev.ImpersonatedUser.Groups, []string{"system:nodes", "system:authenticated"}) {
				t.Errorf("%s %s: impersonated groups %v, want [system:nodes system:authenticated]", ev.Verb, ev.RequestURI, ev.ImpersonatedUser.Groups)
			}
			if ev.AuthenticationMetadata == nil || ev.AuthenticationMetadata.ImpersonationConstraint != "impersonate:associated-node" {
				t.Errorf("%s %s: authenticationMetadata %+v, want impersonationConstraint impersonate:associated-node", ev.Verb, ev.RequestURI, ev.AuthenticationMetadata)
			}
			if ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 300 {
				t.Errorf("%s %s as the node: %d %s", ev.Verb, ev.RequestURI, ev.ResponseStatus.Code, ev.ResponseStatus.Message)
			}
			if ev.Verb == "watch" && ev.Stage == auditv1.StageResponseStarted {
				watches[ev.ObjectRef.Resource]++
				if watches[ev.ObjectRef.Resource] == 1 {
					t.Logf("audit: %s %s user=%s impersonatedUser=%s groups=%v constraint=%s", ev.Verb, ev.RequestURI, ev.User.Username,
						ev.ImpersonatedUser.Username, ev.ImpersonatedUser.Groups, ev.AuthenticationMetadata.ImpersonationConstraint)
				}
			}
		}
		if watches["pods"] == 0 || watches["nodes"] == 0 {
			t.Errorf("the agent's watches as its node in the audit log: %v, want pods and nodes", watches)
		}
	})

	t.Run("a missing impersonation grant is explained and reads are forwarded", func(t *testing.T) {
		// Given: the agent's impersonation binding removed (restored when
		// the test ends) and kube-apiserver refusing the impersonation
		// (it caches an allowed impersonation for 10s).
		a.Process.Stop(40 * time.Second)
		crb, err := c.Admin.RbacV1().ClusterRoleBindings().Get(ctx, nodeImpersonationBinding, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the shipped RBAC has no %s binding: %v", nodeImpersonationBinding, err)
		}
		if err := c.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { restoreBinding(t, c, crb) })
		var refusal rawResponse
		err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			refusal, _ = asAgent(t, ctx, c, a, "/api/v1/pods?fieldSelector=spec.nodeName%3D"+sandbox.NodeName, asNode(sandbox.NodeName))
			return refusal.code == http.StatusForbidden, nil
		})
		if err != nil {
			t.Fatalf("impersonating the node still allowed a minute after the binding went: %d", refusal.code)
		}
		t.Logf("without the binding: %d %s", refusal.code, statusMessage(refusal.body))

		// When: an agent starts.
		b := startAgent(t, ctx, c)

		// Then: its log says what is missing, the node's pods and Node
		// stay unsynced while the rest syncs, and reads are forwarded.
		const logged = "may not impersonate its node"
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return strings.Contains(b.Process.Log(), logged), nil
		})
		if err != nil {
			t.Fatalf("the agent's log does not say %q:\n%s", logged, tailLines(b.Process.Log(), 30))
		}
		for _, l := range strings.Split(b.Process.Log(), "\n") {
			if strings.Contains(l, logged) {
				t.Logf("agent log: %s", l)
				break
			}
		}
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return readCacheMetrics(t, ctx, b).synced["services"] == 1, nil
		})
		if err != nil {
			t.Fatalf("services did not sync: %v", readCacheMetrics(t, ctx, b).synced)
		}
		if m := readCacheMetrics(t, ctx, b); m.synced["pods"] != 0 || m.synced["nodes"] != 0 {
			t.Errorf("synced without the impersonation grant: %v", m.synced)
		}
		viaAgent, _ := podClients(t, c, reader)
		before := readCacheMetrics(t, ctx, b)
		got := viaAgent.do(t, ctx, "GET", "/api/v1/namespaces/"+leastPrivNS+"/pods?resourceVersion=0&fieldSelector=spec.nodeName%3D"+sandbox.NodeName, acceptJSON, uaOther, nil)
		if got.code != http.StatusOK {
			t.Fatalf("list through the agent: %d %s", got.code, got.body)
		}
		after := readCacheMetrics(t, ctx, b)
		if n := after.outcomes["forwarded/not-synced"] - before.outcomes["forwarded/not-synced"]; n != 1 {
			t.Errorf("reads forwarded as not synced: %v, want 1 (outcomes %v)", n, after.outcomes)
		}
	})
}

// newPodReader creates a pod whose ServiceAccount may list pods
// cluster-wide.
func newPodReader(t *testing.T, ctx context.Context, c *sandbox.Cluster) *sandbox.Pod {
	t.Helper()
	reader, err := c.NewPod(ctx, sandbox.PodSpec{Name: "pod-reader", Namespace: leastPrivNS, ServiceAccount: "pod-reader"})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-leastpriv-pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reader.Spec.ServiceAccount, Namespace: leastPrivNS}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := reader.WaitAllowed(ctx, "list", "pods"); err != nil {
		t.Fatal(err)
	}
	return reader
}

// restoreBinding puts back a ClusterRoleBinding deleted by a test.
func restoreBinding(t *testing.T, c *sandbox.Cluster, crb *rbacv1.ClusterRoleBinding) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	restored := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: crb.Name, Labels: crb.Labels},
		RoleRef:    crb.RoleRef,
		Subjects:   crb.Subjects,
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, restored, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Errorf("restoring %s: %v", crb.Name, err)
	}
}

// statusMessage returns a Status body's message, or the start of the body.
func statusMessage(body []byte) string {
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		return st.Message
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return string(body)
}

// itemNamesJSON returns the names of a JSON list's items, sorted.
func itemNamesJSON(t *testing.T, body []byte) []string {
	t.Helper()
	var list metav1.PartialObjectMetadataList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("decoding list %.200s: %v", body, err)
	}
	var names []string
	for _, it := range list.Items {
		names = append(names, it.Name)
	}
	slices.Sort(names)
	return names
}
