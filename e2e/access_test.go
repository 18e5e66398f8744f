package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const accessNS = "e2e-access"

// User agents that tell the access scenarios' requests apart in the audit
// log.
const (
	uaAccessAgent  = "kube-apicache-e2e/access-agent"
	uaAccessDirect = "kube-apicache-e2e/access-direct"
	uaImpersonate  = "kube-apicache-e2e/access-impersonate"
)

// TestAccessDecisions covers who may read from the cache, against one agent
// running at -v=10:
//   - revoking a RoleBinding turns a cached read into kube-apiserver's 403
//     within the decision TTL;
//   - a low-privilege token impersonating system:admin is forwarded and
//     gets the same 403 as directly;
//   - a read RBAC does not allow gets the same 403 from the cache as from
//     kube-apiserver;
//   - and no caller's token, nor the agent's, appears in its log.
func TestAccessDecisions(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Given a pod allowed to read services in its namespace by a
	// RoleBinding, a pod allowed nothing, a service to read,
	reader, err := c.NewPod(ctx, sandbox.PodSpec{Name: "access-reader", Namespace: accessNS, ServiceAccount: "access-reader"})
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := c.NewPod(ctx, sandbox.PodSpec{Name: "access-nobody", Namespace: accessNS, ServiceAccount: "access-nobody"})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "service-reader", Namespace: accessNS},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "service-reader", Namespace: accessNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reader.Spec.ServiceAccount, Namespace: accessNS}},
	}
	if _, err := c.Admin.RbacV1().Roles(accessNS).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().RoleBindings(accessNS).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := reader.WaitAllowed(ctx, "get", "services"); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "access-svc"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := c.Admin.CoreV1().Services(accessNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// and an agent logging at the highest verbosity whose cache has synced.
	agent := startAgent(t, ctx, c, "-v=10")
	waitCacheSynced(t, ctx, agent)

	t.Run("revoked RoleBinding", func(t *testing.T) {
		testRevokedRoleBinding(t, ctx, c, agent, reader)
	})
	t.Run("impersonation", func(t *testing.T) {
		testImpersonation(t, ctx, c, nobody)
	})
	t.Run("forbidden", func(t *testing.T) {
		testForbidden(t, ctx, c, agent, nobody)
	})

	// Then no token appears in the agent's log,
	log := agent.Process.Log()
	// which did log at that verbosity (client-go request bodies of the
	// access reviews),
	if !strings.Contains(log, "subjectaccessreviews") || !strings.Contains(log, "Request Body") {
		t.Fatalf("the agent log shows no client-go request logging at -v=10; the check below would prove nothing")
	}
	for _, p := range []*sandbox.Pod{reader, nobody, agent.Pod} {
		for i, part := range strings.Split(p.Token, ".") {
			// The JWT header is the same for every token of the issuer;
			// the claims and the signature are each token's own.
			if i > 0 && len(part) > 16 && strings.Contains(log, part) {
				t.Errorf("the agent log contains part %d of %s's token", i, p.Spec.Name)
			}
		}
	}
}

// testRevokedRoleBinding: given a read the cache answers for a reader, when
// its RoleBinding is deleted, then reads through the agent turn 403 within
// the decision TTL of the moment kube-apiserver itself denies them, with
// kube-apiserver's body.
func testRevokedRoleBinding(t *testing.T, ctx context.Context, c *sandbox.Cluster, agent *sandbox.Agent, reader *sandbox.Pod) {
	viaAgent, direct := podClients(t, c, reader)
	path := "/api/v1/namespaces/" + accessNS + "/services/access-svc"

	before := readCacheMetrics(t, ctx, agent)
	for range 3 {
		if r := viaAgent.do(t, ctx, "GET", path, acceptJSON, uaAccessAgent, nil); r.code != http.StatusOK {
			t.Fatalf("allowed read through the agent: %d %s", r.code, r.body)
		}
	}
	if hits := readCacheMetrics(t, ctx, agent).outcomes["hit"] - before.outcomes["hit"]; hits != 3 {
		t.Fatalf("%v reads answered from the cache, want 3", hits)
	}

	revoked := time.Now()
	if err := c.Admin.RbacV1().RoleBindings(accessNS).Delete(ctx, "service-reader", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Poll both paths until each answers 403; bounded by the deadline.
	var agentDelay, directDelay time.Duration
	var agentDenied, directDenied rawResponse
	deadline := revoked.Add(access.MaxTTL + 20*time.Second)
	for (agentDelay == 0 || directDelay == 0) && time.Now().Before(deadline) {
		if agentDelay == 0 {
			if r := viaAgent.do(t, ctx, "GET", path, acceptJSON, uaAccessAgent, nil); r.code == http.StatusForbidden {
				agentDelay, agentDenied = time.Since(revoked), r
			} else if r.code != http.StatusOK {
				t.Fatalf("through the agent after revocation: %d %s", r.code, r.body)
			}
		}
		if directDelay == 0 {
			if r := direct.do(t, ctx, "GET", path, acceptJSON, uaAccessDirect, nil); r.code == http.StatusForbidden {
				directDelay, directDenied = time.Since(revoked), r
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if agentDelay == 0 || directDelay == 0 {
		t.Fatalf("not denied within %v: through the agent after %v, directly after %v", access.MaxTTL+20*time.Second, agentDelay, directDelay)
	}
	figuref(t, "after revoking the RoleBinding: kube-apiserver denied after %v, the agent after %v (decision TTL %v)",
		directDelay.Round(time.Millisecond), agentDelay.Round(time.Millisecond), access.MaxTTL)
	// The cached allow was made before the revocation and lives at most
	// MaxTTL; allow a second for the reads' own round trips.
	if agentDelay > directDelay+access.MaxTTL+time.Second {
		t.Errorf("the agent kept allowing for %v after kube-apiserver denied, more than the decision TTL %v", agentDelay-directDelay, access.MaxTTL)
	}
	if diff := cmp.Diff(normalize(t, directDenied), normalize(t, agentDenied)); diff != "" {
		t.Errorf("403 bodies differ (-direct +agent):\n%s", diff)
	}
}

// testImpersonation: given a token allowed nothing, when it asks to
// impersonate system:admin, then the agent forwards the request (it reaches
// kube-apiserver) and the answer is the same 403 as directly.
func testImpersonation(t *testing.T, ctx context.Context, c *sandbox.Cluster, nobody *sandbox.Pod) {
	viaAgent, direct := podClients(t, c, nobody)
	for _, path := range []string{
		"/api/v1/namespaces/" + accessNS + "/services",
		"/api/v1/namespaces/" + accessNS + "/services/access-svc",
		"/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName,
	} {
		got := impersonatingGet(t, ctx, viaAgent, path)
		want := impersonatingGet(t, ctx, direct, path)
		if got.code != http.StatusForbidden || want.code != http.StatusForbidden {
			t.Errorf("%s as system:admin: through the agent %d, direct %d; want 403 for both\nagent:  %s\ndirect: %s", path, got.code, want.code, got.body, want.body)
			continue
		}
		if diff := cmp.Diff(normalize(t, want), normalize(t, got)); diff != "" {
			t.Errorf("%s as system:admin: bodies differ (-direct +agent):\n%s", path, diff)
		}
		if !strings.Contains(string(got.body), "cannot impersonate") {
			t.Errorf("%s: not the impersonation denial: %s", path, got.body)
		}
	}
	// Every impersonating request reached kube-apiserver, twice per path
	// (once through the agent, once directly): none was answered locally.
	seen := len(auditEvents(t, c, func(ev *auditv1.Event) bool {
		return ev.UserAgent == uaImpersonate && ev.Stage == "ResponseComplete"
	}))
	if seen != 6 {
		t.Errorf("kube-apiserver saw %d impersonating requests, want 6", seen)
	}
}

func impersonatingGet(t *testing.T, ctx context.Context, c rawClient, path string) rawResponse {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Impersonate-User", "system:admin")
	req.Header.Set("Accept", acceptJSON)
	req.Header.Set("User-Agent", uaImpersonate)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResponse{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
}

// testForbidden: given a token RBAC allows nothing, when it reads what the
// cache holds, then the agent answers kube-apiserver's 403 (code, reason,
// message, details) itself, without forwarding the read.
func testForbidden(t *testing.T, ctx context.Context, c *sandbox.Cluster, agent *sandbox.Agent, nobody *sandbox.Pod) {
	viaAgent, direct := podClients(t, c, nobody)
	paths := []string{
		"/api/v1/namespaces/" + accessNS + "/services",
		"/api/v1/namespaces/" + accessNS + "/services/access-svc",
		"/api/v1/namespaces/" + accessNS + "/services/missing",
		"/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName,
		"/api/v1/namespaces/" + accessNS + "/services?labelSelector=app%3Dweb",
		"/api/v1/namespaces",
		"/api/v1/nodes/" + sandbox.NodeName,
	}
	before := readCacheMetrics(t, ctx, agent)
	for _, path := range paths {
		got := viaAgent.do(t, ctx, "GET", path, acceptJSON, uaAccessAgent+"-forbidden", nil)
		want := direct.do(t, ctx, "GET", path, acceptJSON, uaAccessDirect, nil)
		if got.code != http.StatusForbidden || want.code != http.StatusForbidden {
			t.Errorf("%s: through the agent %d, direct %d; want 403 for both\nagent:  %s\ndirect: %s", path, got.code, want.code, got.body, want.body)
			continue
		}
		if diff := cmp.Diff(normalize(t, want), normalize(t, got)); diff != "" {
			t.Errorf("%s: bodies differ (-direct +agent):\n%s", path, diff)
		}
	}
	if denied := readCacheMetrics(t, ctx, agent).outcomes["denied"] - before.outcomes["denied"]; denied != float64(len(paths)) {
		t.Errorf("the cache denied %v reads itself, want %d", denied, len(paths))
	}
	for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool { return ev.UserAgent == uaAccessAgent+"-forbidden" }) {
		t.Errorf("a denied read reached kube-apiserver: %s %s", ev.Verb, ev.RequestURI)
	}
}
