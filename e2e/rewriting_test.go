package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The rewriting scenario's namespaces: the renamed install, and the
// second install under the original names.
const (
	rwNS      = "e2e-rewrite"
	rwPlainNS = "e2e-rewrite-plain"
	// rwOperator is the operators' ServiceAccount (and pod) name in both.
	rwOperator = "widget-operator"
)

// rwProfile is the profile the scenario's agent runs with: the operator of
// rwNS (and a ServiceAccount of it with no rights) see example.com where
// the cluster stores renamed.example.io, kinds prefixed Renamed, resource
// names kept, unprefixed label keys under renamed.example.io/ and
// example.com finalizers under renamed.example.io.
const rwProfile = `apiVersion: config.kube-apicache.io/v1alpha1
kind: RewriteConfiguration
profiles:
- name: widgets
  selector:
    serviceAccounts: [e2e-rewrite/widget-operator, e2e-rewrite/norights]
  groups:
  - from: example.com
    to: renamed.example.io
  kindPrefix: Renamed
  resourcePrefix: ""
  labels:
  - from: ""
    to: renamed.example.io
  finalizers:
  - from: example.com
    to: renamed.example.io
`

var (
	renamedWidgets  = schema.GroupVersionResource{Group: "renamed.example.io", Version: "v1", Resource: "widgets"}
	originalWidgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
)

// TestRewriting is the rewriting scenario: one operator, unchanged, run
// twice in one cluster, once renamed by a profile.
//
// Given a rewrite profile that renames example.com to renamed.example.io
// for one ServiceAccount, whose target group a CRD of someone else's
// serves,
// when an agent starts with it,
// then it refuses to start, naming the group.
//
// Given an agent with the profile, and the sample operator (widgetop) in a
// pod of that ServiceAccount, its webhooks behind `kube-apicache
// webhook-proxy`,
// when the operator installs its CRD and validating webhook and runs its
// exercise (RESTMapper from discovery, create, get, list by label and
// field, watch, watch-list, JSON, merge, strategic-merge and apply
// patches, owner references, status, a second version through the
// conversion webhook, a denial, a finalizer), and kubectl applies a Widget
// server-side from the pod,
// then every step sees only the original names, kube-apiserver holds only
// renamed objects (read directly), the webhooks saw only original names,
// the denial names the original kind, and `kubectl auth can-i` and
// `kubectl explain` (OpenAPI v3) answer in the original names.
// When a ServiceAccount the profile selects but RBAC does not allow reads
// widgets, then it gets kube-apiserver's 403, in the original names.
// When the operator lists ConfigMaps the agent caches, then the cache
// answers and the labels come back under their original keys.
// When the same operator is installed again in another namespace with no
// profile and the original CRD, then both run side by side, and the
// unselected operator's answers through the agent are byte for byte
// kube-apiserver's.
func TestRewriting(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	crds := apiextensionsclient.NewForConfigOrDie(c.AdminConfig)
	dc := dynamic.NewForConfigOrDie(c.AdminConfig)
	dir := t.TempDir()
	profile := filepath.Join(dir, "rewrite.yaml")
	writeFile(t, profile, rwProfile)
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, string(c.CA.CertPEM))
	t.Cleanup(func() { cleanUpRewriting(c, crds) })

	opA := rwPod(t, ctx, c, rwNS, rwOperator)
	norights := rwPod(t, ctx, c, rwNS, "norights")
	opB := rwPod(t, ctx, c, rwPlainNS, rwOperator)
	grantOperator(t, ctx, c, rwNS, "renamed.example.io")
	grantOperator(t, ctx, c, rwPlainNS, "example.com")

	t.Run("RefusedOntoAGroupOfSomeoneElse", func(t *testing.T) {
		// Given a CRD of a group the operator has no rights on.
		owned := "gadgets.owned.rewrite.e2e.example.org"
		createCRD(t, ctx, crds, owned, "owned.rewrite.e2e.example.org", "Gadget", "gadgets")
		bad := filepath.Join(dir, "rewrite-onto-owned.yaml")
		writeFile(t, bad, strings.Replace(rwProfile, "to: renamed.example.io\n  kindPrefix", "to: owned.rewrite.e2e.example.org\n  kindPrefix", 1))
		// When an agent starts with a profile renaming onto it.
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		proc, err := pod.Start(agentBin, c.AgentArgs(certFile, keyFile, "--rewrite-config="+bad)...)
		if err != nil {
			t.Fatal(err)
		}
		stopOnCleanup(t, proc, "refused agent", 40, 5*time.Second)
		// Then it stops before it serves, naming the group.
		if code := waitExit(t, proc, time.Minute); code == 0 {
			t.Fatalf("the agent started with a rename onto a group of someone else's")
		}
		log := proc.Log()
		if !strings.Contains(log, "profiles[0].groups[0].to: Forbidden: owned.rewrite.e2e.example.org is already served and the profile's callers have no rights on it") {
			t.Errorf("the agent's refusal does not name the group:\n%s", tailLines(log, 20))
		}
		if strings.Contains(log, "Intercepting the kubernetes Service") {
			t.Errorf("the refused agent intercepted before it stopped:\n%s", tailLines(log, 20))
		}
	})

	grantClusterRead(t, ctx, c, "e2e-rewrite-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: readVerbs})
	agent := startAgent(t, ctx, c, "--rewrite-config="+profile, "--cache-resources="+cache.DefaultResources+",configmaps")

	// The renamed install: widgetop serves its webhooks on 8443, and
	// webhook-proxy, with the same certificate, on 9444 in front of it.
	serveA, webhooksA := startWebhooks(t, ctx, c, opA, dir, caFile, profile)
	t.Run("InstallRenamed", func(t *testing.T) {
		installWidgetop(t, ctx, opA, webhooksA, caFile)
		// kube-apiserver holds the renamed CRD only.
		crd, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "widgets.renamed.example.io", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the renamed CRD: %v", err)
		}
		if crd.Spec.Group != "renamed.example.io" || crd.Spec.Names.Kind != "RenamedWidget" || crd.Spec.Names.ListKind != "RenamedWidgetList" || crd.Spec.Names.Plural != "widgets" {
			t.Errorf("the renamed CRD's names: group %s, %+v", crd.Spec.Group, crd.Spec.Names)
		}
		if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "widgets.example.com", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("widgets.example.com exists before the second install: %v", err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("OperatorSeesOriginalNames", func(t *testing.T) {
		out := widgetop(t, ctx, opA, "run", "--name=a", "--timeout=3m")
		if !strings.Contains(out, "RESULT ok") {
			t.Fatalf("widgetop run through the rewriting agent:\n%s", out)
		}
		t.Logf("widgetop run:\n%s", out)
	})

	t.Run("KubectlServerSideApply", func(t *testing.T) {
		manifest := filepath.Join(opA.Dir, "home", "applied-widget.yaml")
		writeFile(t, manifest, "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: applied\n  labels:\n    app: kubectl\nspec:\n  size: 7\n  color: purple\n")
		mustKubectl(t, ctx, opA, "apply", "--server-side", "--field-manager=e2e-kubectl", "-f", manifest)
		got := mustKubectl(t, ctx, opA, "get", "widgets.example.com", "applied", "-o", "json")
		var w struct {
			APIVersion, Kind string
			Metadata         struct {
				Labels        map[string]string
				ManagedFields []struct{ Manager, APIVersion string }
			}
		}
		if err := json.Unmarshal([]byte(got), &w); err != nil {
			t.Fatalf("kubectl get -o json: %v\n%s", err, got)
		}
		// kubectl reads the version discovery prefers, v2 (the
		// conversion webhook's work).
		if w.APIVersion != "example.com/v2" || w.Kind != "Widget" || w.Metadata.Labels["app"] != "kubectl" {
			t.Errorf("the applied widget as the pod sees it: %s", got)
		}
		for _, mf := range w.Metadata.ManagedFields {
			if !strings.HasPrefix(mf.APIVersion, "example.com/") {
				t.Errorf("managedFields of %s name %s", mf.Manager, mf.APIVersion)
			}
		}
		// kube-apiserver holds it renamed.
		stored, err := dc.Resource(renamedWidgets).Namespace(rwNS).Get(ctx, "applied", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the applied widget, read directly: %v", err)
		}
		if stored.GetAPIVersion() != "renamed.example.io/v1" || stored.GetKind() != "RenamedWidget" ||
			stored.GetLabels()["renamed.example.io/app"] != "kubectl" || stored.GetLabels()["app"] != "" {
			t.Errorf("kube-apiserver holds: %s %s labels %v", stored.GetAPIVersion(), stored.GetKind(), stored.GetLabels())
		}
		for _, mf := range stored.GetManagedFields() {
			if !strings.HasPrefix(mf.APIVersion, "renamed.example.io/") {
				t.Errorf("stored managedFields of %s name %s", mf.Manager, mf.APIVersion)
			}
		}
		// A denial names the original kind.
		bad := filepath.Join(opA.Dir, "home", "bad-widget.yaml")
		writeFile(t, bad, "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: bad\nspec:\n  size: -1\n")
		_, errOut, err := kubectl(ctx, opA, "apply", "--server-side", "-f", bad)
		if err == nil || !strings.Contains(errOut, "Widget bad: spec.size must not be negative") || strings.Contains(strings.ToLower(errOut), "renamed") {
			t.Errorf("kubectl apply of a refused widget: %v\n%s", err, errOut)
		}
		// Access reviews are renamed too: the operator may create widgets
		// (its Role names renamed.example.io), in its own names.
		if out := mustKubectl(t, ctx, opA, "auth", "can-i", "create", "widgets.example.com"); strings.TrimSpace(out) != "yes" {
			t.Errorf("kubectl auth can-i create widgets.example.com: %q, want yes", out)
		}
		// kubectl explain finds the kind in the OpenAPI v3 document of
		// the renamed group, read under the original names: v2's
		// schema (spec.dimensions).
		explained := mustKubectl(t, ctx, opA, "explain", "widgets.example.com.spec")
		if !regexp.MustCompile(`GROUP:\s+example\.com\n`).MatchString(explained) || !regexp.MustCompile(`KIND:\s+Widget\n`).MatchString(explained) ||
			!regexp.MustCompile(`VERSION:\s+v2\n`).MatchString(explained) || !strings.Contains(explained, "dimensions") ||
			strings.Contains(strings.ToLower(explained), "renamed") {
			t.Errorf("kubectl explain widgets.example.com.spec:\n%s", explained)
		}
	})

	t.Run("WebhooksSawOriginalNames", func(t *testing.T) {
		log := serveA.Log()
		for _, want := range []string{"ADMISSION CREATE example.com/v1 Widget widgets", "CONVERSION example.com/v2", "ADMISSION-RESULT denied: Widget "} {
			if !strings.Contains(log, want) {
				t.Errorf("the webhook server's log has no %q", want)
			}
		}
		if strings.Contains(strings.ToLower(log), "renamed") {
			t.Errorf("the webhook server saw renamed names:\n%s", tailLines(log, 40))
		}
	})

	t.Run("SelectedWithoutRights", func(t *testing.T) {
		viaAgent, direct := podClients(t, c, norights)
		got := viaAgent.do(t, ctx, "GET", "/apis/example.com/v1/namespaces/"+rwNS+"/widgets", "application/json", uaOther, nil)
		want := direct.do(t, ctx, "GET", "/apis/renamed.example.io/v1/namespaces/"+rwNS+"/widgets", "application/json", uaOther, nil)
		if got.code != 403 || want.code != 403 {
			t.Fatalf("through the agent %d, direct %d; want 403 both:\n%s", got.code, want.code, got.body)
		}
		var st metav1.Status
		if err := json.Unmarshal(got.body, &st); err != nil {
			t.Fatal(err)
		}
		if st.Reason != metav1.StatusReasonForbidden || st.Details == nil || st.Details.Group != "example.com" || st.Details.Kind != "widgets" ||
			!strings.Contains(st.Message, `cannot list resource "widgets" in API group "example.com"`) || strings.Contains(st.Message, "renamed") {
			t.Errorf("the 403 through the agent: %s", got.body)
		}
		out, _, _ := kubectl(ctx, norights, "auth", "can-i", "list", "widgets.example.com")
		if strings.TrimSpace(out) != "no" {
			t.Errorf("kubectl auth can-i list widgets.example.com without rights: %q, want no", out)
		}
	})

	t.Run("CachedAnswersRestored", func(t *testing.T) {
		// A ConfigMap the agent's cache answers for, read by the selected
		// operator: its label comes back under the original key.
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cached", Labels: map[string]string{"renamed.example.io/app": "cached"}}}
		if _, err := c.Admin.CoreV1().ConfigMaps(rwNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		viaAgent, _ := podClients(t, c, opA)
		path := "/api/v1/namespaces/" + rwNS + "/configmaps?labelSelector=app%3Dcached&resourceVersion=0"
		var r rawResponse
		hit := false
		for range 20 {
			before := readCacheMetrics(t, ctx, agent)
			r = viaAgent.do(t, ctx, "GET", path, "application/json", uaOther, nil)
			if cacheOutcome(before, readCacheMetrics(t, ctx, agent)) == "cache" {
				hit = true
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if !hit {
			t.Errorf("the cache never answered the selected caller's list")
		}
		var list corev1.ConfigMapList
		if err := json.Unmarshal(r.body, &list); err != nil || len(list.Items) != 1 || list.Items[0].Labels["app"] != "cached" {
			t.Errorf("the selected caller's cached list: %v %s", err, r.body)
		}
	})

	// The second install, under the original names, with no profile.
	_, webhooksB := startWebhooks(t, ctx, c, opB, dir, caFile, "")
	t.Run("SecondInstallSideBySide", func(t *testing.T) {
		installWidgetop(t, ctx, opB, webhooksB, caFile)
		for _, name := range []string{"widgets.example.com", "widgets.renamed.example.io"} {
			if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{}); err != nil {
				t.Errorf("CRD %s: %v", name, err)
			}
		}
		// kube-apiserver holds the first install's objects renamed only,
		// beside the second's under the original names.
		renamed, err := dc.Resource(renamedWidgets).Namespace(rwNS).List(ctx, metav1.ListOptions{})
		if err != nil || len(renamed.Items) != 1 || renamed.Items[0].GetName() != "applied" {
			t.Errorf("renamed widgets in %s: %v, %v", rwNS, err, names(renamed))
		}
		if original, err := dc.Resource(originalWidgets).Namespace(rwNS).List(ctx, metav1.ListOptions{}); err != nil || len(original.Items) != 0 {
			t.Errorf("original widgets in %s: %v, %v; want none", rwNS, err, names(original))
		}
		if err := dc.Resource(renamedWidgets).Namespace(rwNS).Delete(ctx, "applied", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		if out := widgetop(t, ctx, opB, "run", "--name=b", "--timeout=3m"); !strings.Contains(out, "RESULT ok") {
			t.Errorf("widgetop run, unselected:\n%s", out)
		}
		if out := widgetop(t, ctx, opA, "run", "--name=a2", "--timeout=3m"); !strings.Contains(out, "RESULT ok") {
			t.Errorf("widgetop run, renamed, beside the second install:\n%s", out)
		}
	})

	t.Run("UnselectedByteIdentical", func(t *testing.T) {
		obj := map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": "probe", "labels": map[string]any{"app": "probe"}}, "spec": map[string]any{"size": 1}}
		if _, err := dc.Resource(originalWidgets).Namespace(rwPlainNS).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		viaAgent, direct := podClients(t, c, opB)
		for _, p := range []string{
			"/apis/example.com/v1/namespaces/" + rwPlainNS + "/widgets/probe",
			"/apis/example.com/v1/namespaces/" + rwPlainNS + "/widgets?labelSelector=app%3Dprobe&resourceVersion=0",
			"/apis/example.com/v1",
			"/apis/renamed.example.io/v1",
			"/api/v1/namespaces/" + rwPlainNS + "/configmaps/kube-root-ca.crt",
		} {
			var got, want rawResponse
			same := false
			// Two reads a moment apart may see two revisions; three tries.
			for range 3 {
				got = viaAgent.do(t, ctx, "GET", p, "application/json", uaOther, nil)
				want = direct.do(t, ctx, "GET", p, "application/json", uaDirect, nil)
				if same = got.code == want.code && got.contentType == want.contentType && string(got.body) == string(want.body); same {
					break
				}
			}
			if !same {
				t.Errorf("%s: through the agent %d %q\n%s\ndirect %d %q\n%s", p, got.code, got.contentType, got.body, want.code, want.contentType, want.body)
			}
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		byOutcome := sumBy(scrapeAgent(t, ctx, agent)["kube_apicache_rewrite_requests_total"], "outcome")
		if byOutcome["rewritten"] == 0 || byOutcome["failed"] != 0 {
			t.Errorf("rewrite requests by outcome: %v; want some rewritten, none failed", byOutcome)
		}
		figuref(t, "rewriting: %v requests of the selected operator by outcome", byOutcome)
	})
}

// rwPod creates a pod of ServiceAccount name in ns, with the namespace's
// default rights only.
func rwPod(t *testing.T, ctx context.Context, c *sandbox.Cluster, ns, name string) *sandbox.Pod {
	t.Helper()
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: name, Namespace: ns, ServiceAccount: name})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	return pod
}

// grantOperator gives the operator of ns what widgetop needs: its CRD and
// webhook configuration (cluster-wide), and widgets of group (the group
// kube-apiserver stores them in) and ConfigMaps in ns.
func grantOperator(t *testing.T, ctx context.Context, c *sandbox.Cluster, ns, group string) {
	t.Helper()
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: rwOperator, Namespace: ns}
	grantClusterRead(t, ctx, c, "e2e-rewrite-installer-"+ns, subject,
		rbacv1.PolicyRule{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get", "list", "watch", "create"}},
		rbacv1.PolicyRule{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingwebhookconfigurations"}, Verbs: []string{"get", "create"}})
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "widget-operator", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"widgets", "widgets/status"}, Verbs: []string{"*"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
	}}
	if _, err := c.Admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-operator", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "widget-operator"},
		Subjects:   []rbacv1.Subject{subject},
	}
	if _, err := c.Admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// RBAC takes effect asynchronously: wait for the widgets rule.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + rwOperator,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: group, Resource: "widgets"},
		}}
		res, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && res.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("RBAC for the operator of %s: %v", ns, err)
	}
}

// startWebhooks starts widgetop's webhook server in pod on 8443 with a
// certificate of the cluster CA for the pod's IP and loopback, and, with a
// rewrite profile file, webhook-proxy on 9444 in front of it. It returns
// the webhook server's process and the base URL kube-apiserver calls the
// webhooks at.
func startWebhooks(t *testing.T, ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod, dir, caFile, profile string) (*sandbox.Process, string) {
	t.Helper()
	kp, err := c.CA.Issue(sandbox.CertSpec{CommonName: pod.Spec.Name + "." + pod.Spec.Namespace, IPs: []net.IP{net.ParseIP(pod.IP), net.ParseIP("127.0.0.1")}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := kp.Write(dir, "webhook-"+pod.Spec.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	serve, err := pod.Start(widgetopBin, "serve", "--listen=:8443", "--cert="+certFile, "--key="+keyFile)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, serve, "widgetop serve in "+pod.Spec.Namespace, 60, 5*time.Second)
	waitListening(t, ctx, pod, "8443")
	if profile == "" {
		return serve, "https://" + net.JoinHostPort(pod.IP, "8443")
	}
	proxy, err := pod.Start(agentBin, "webhook-proxy", "--listen-address=0.0.0.0:9444", "--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile,
		"--backend=https://127.0.0.1:8443", "--backend-ca-file="+caFile, "--rewrite-config="+profile, "--profile=widgets")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proxy, "webhook-proxy in "+pod.Spec.Namespace, 60, 5*time.Second)
	waitListening(t, ctx, pod, "9444")
	return serve, "https://" + net.JoinHostPort(pod.IP, "9444")
}

// installWidgetop runs widgetop's install in pod: its CRD and its
// validating webhook configuration (named after the pod's namespace),
// calling the webhooks at base.
func installWidgetop(t *testing.T, ctx context.Context, pod *sandbox.Pod, base, caFile string) {
	t.Helper()
	out := widgetop(t, ctx, pod, "install", "--conversion-url="+base+"/convert", "--webhook-url="+base+"/validate",
		"--ca-file="+caFile, "--webhook-config-name=widgets-"+pod.Spec.Namespace, "--timeout=2m")
	if !strings.Contains(out, "INSTALLED") {
		t.Fatalf("widgetop install in %s:\n%s", pod.Spec.Namespace, out)
	}
}

// waitListening waits until something accepts connections on port at the
// pod's address.
func waitListening(t *testing.T, ctx context.Context, pod *sandbox.Pod, port string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		conn, err := pod.NetNS.DialContext(ctx, "tcp", net.JoinHostPort(pod.IP, port))
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	})
	if err != nil {
		t.Fatalf("nothing listens on %s:%s in pod %s: %v", pod.IP, port, pod.Spec.Name, err)
	}
}

// widgetop runs widgetop in pod and returns what it printed.
func widgetop(t *testing.T, ctx context.Context, pod *sandbox.Pod, args ...string) string {
	t.Helper()
	out, err := pod.Command(ctx, widgetopBin, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(exit: %v)", out, err)
	}
	return string(out)
}

// createCRD creates a namespaced CRD with one version v1 that keeps any
// fields, and waits until discovery serves its group.
func createCRD(t *testing.T, ctx context.Context, crds apiextensionsclient.Interface, name, group, kind, plural string) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
		},
	}
	if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := crds.Discovery().ServerResourcesForGroupVersion(group + "/v1")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("group %s not served: %v", group, err)
	}
}

// cleanUpRewriting removes the scenario's cluster-scoped objects: the
// webhook configurations (which would call pods that are gone) and CRDs.
func cleanUpRewriting(c *sandbox.Cluster, crds apiextensionsclient.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"widgets-" + rwNS, "widgets-" + rwPlainNS} {
		_ = c.Admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
	}
	for _, name := range []string{"widgets.renamed.example.io", "widgets.example.com", "gadgets.owned.rewrite.e2e.example.org"} {
		_ = crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, name, metav1.DeleteOptions{})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// names lists the names of a list's items.
func names(l *unstructured.UnstructuredList) []string {
	if l == nil {
		return nil
	}
	var out []string
	for _, i := range l.Items {
		out = append(out, i.GetName())
	}
	return out
}
