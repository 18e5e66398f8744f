package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// TestFieldLabelsMatchKubeAPIServer checks the cache's field label tables
// (cache/fields.go) against a live kube-apiserver.
//
// For every built-in resource kube-apiserver serves and lists, it asks
// kube-apiserver directly which field labels it accepts among every JSON
// path of the resource's type up to three levels deep, the metadata fields
// and the cache's own labels (a label it refuses gets a 400). The cache
// must answer exactly the accepted ones: a label it answers that
// kube-apiserver refuses would turn a 400 into a list, and a label
// kube-apiserver accepts that the cache lacks only costs a forward, but
// means the table is out of date. (An alias that is no path of the type,
// such as the pods' "spec.host", is found only if the table names it.)
func TestFieldLabelsMatchKubeAPIServer(t *testing.T) {
	c := requireCluster(t)
	minor := serverMinor(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lists, err := c.Admin.Discovery().ServerPreferredResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	type probe struct {
		gvr    schema.GroupVersionResource
		labels []string
	}
	var probes []probe
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			gvk := gv.WithKind(r.Kind)
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || !scheme.Scheme.Recognizes(gvk) {
				continue
			}
			obj, err := scheme.Scheme.New(gvk)
			if err != nil {
				t.Fatal(err)
			}
			candidates := map[string]bool{"metadata.name": true, "metadata.namespace": true}
			for _, l := range jsonPaths(reflect.TypeOf(obj).Elem(), "", 3) {
				if !strings.HasPrefix(l, "metadata.") && l != "metadata" && l != "kind" && l != "apiVersion" {
					candidates[l] = true
				}
			}
			for _, l := range cache.BuiltinFieldLabels(gv.WithResource(r.Name).GroupResource(), minor) {
				candidates[l] = true
			}
			var labels []string
			for l := range candidates {
				labels = append(labels, l)
			}
			sort.Strings(labels)
			probes = append(probes, probe{gvr: gv.WithResource(r.Name), labels: labels})
		}
	}
	if len(probes) < 40 {
		t.Fatalf("discovery listed %d built-in resources, want the whole API", len(probes))
	}

	// accepted asks kube-apiserver whether it accepts label for gvr.
	accepted := func(gvr schema.GroupVersionResource, label string) (bool, error) {
		res := c.Admin.CoreV1().RESTClient().Get().AbsPath(apiPath(gvr, "")).
			Param("fieldSelector", label+"=kube-apicache-probe").Param("limit", "1").Do(ctx)
		var code int
		res.StatusCode(&code)
		switch err := res.Error(); {
		case err == nil:
			return true, nil
		case apierrors.IsBadRequest(err):
			return false, nil
		default:
			return false, fmt.Errorf("%s %s: %d %v", gvr, label, code, err)
		}
	}
	type finding struct{ gvr, label, problem string }
	var (
		mu       sync.Mutex
		findings []finding
		requests int
		sem      = make(chan struct{}, 8)
		wg       sync.WaitGroup
	)
	for _, p := range probes {
		known := map[string]bool{}
		for _, l := range cache.BuiltinFieldLabels(p.gvr.GroupResource(), minor) {
			known[l] = true
		}
		for _, label := range p.labels {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ok, err := accepted(p.gvr, label)
				mu.Lock()
				defer mu.Unlock()
				requests++
				switch {
				case err != nil:
					findings = append(findings, finding{p.gvr.String(), label, err.Error()})
				case ok && !known[label]:
					findings = append(findings, finding{p.gvr.String(), label, "accepted by kube-apiserver, missing from the cache's table"})
				case !ok && known[label]:
					findings = append(findings, finding{p.gvr.String(), label, "in the cache's table, refused by kube-apiserver"})
				}
			})
		}
	}
	wg.Wait()
	for _, f := range findings {
		t.Errorf("%s %s: %s", f.gvr, f.label, f.problem)
	}
	figuref(t, "field labels: %d built-in resources, %d candidate labels asked of kube-apiserver; %d differ from the cache's tables",
		len(probes), requests, len(findings))
}

// jsonPaths returns the dotted JSON paths of t's fields, to depth levels:
// each struct field's path, and those of its own fields when it is a
// struct (slices and maps are not entered: no field label indexes them).
func jsonPaths(t reflect.Type, prefix string, depth int) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || depth == 0 {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonPaths(f.Type, prefix, depth)...)
			continue
		}
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		out = append(out, prefix+name)
		out = append(out, jsonPaths(f.Type, prefix+name+".", depth-1)...)
	}
	return out
}

// apiPath is the collection path of gvr in namespace ns, or across all
// namespaces if ns is empty.
func apiPath(gvr schema.GroupVersionResource, ns string) string {
	p := "/apis/" + gvr.Group + "/" + gvr.Version
	if gvr.Group == "" {
		p = "/api/" + gvr.Version
	}
	if ns != "" {
		p += "/namespaces/" + ns
	}
	return p + "/" + gvr.Resource
}

// fieldLabelNS holds the namespaced objects of TestFieldSelectorsThroughAgent.
const fieldLabelNS = "field-labels"

// fieldSelectorResources are the resources TestFieldSelectorsThroughAgent
// caches: every built-in resource with field labels of its own that
// kube-apiserver serves by default, and two with the metadata fields only.
type fieldSelectorResource struct {
	gvr schema.GroupVersionResource
	// spec is the --cache-resources entry.
	spec string
	// scope is the selector term the cache requires (this node's pods and
	// Node).
	scope string
	// namespaced lists are made in fieldLabelNS, away from other
	// scenarios' churn.
	namespaced bool
}

var fieldSelectorResources = []fieldSelectorResource{
	{gvr: corev1.SchemeGroupVersion.WithResource("pods"), spec: "pods", scope: "spec.nodeName=" + sandbox.NodeName},
	{gvr: corev1.SchemeGroupVersion.WithResource("nodes"), spec: "nodes", scope: "metadata.name=" + sandbox.NodeName},
	{gvr: corev1.SchemeGroupVersion.WithResource("namespaces"), spec: "namespaces"},
	{gvr: corev1.SchemeGroupVersion.WithResource("services"), spec: "services", namespaced: true},
	{gvr: corev1.SchemeGroupVersion.WithResource("secrets"), spec: "secrets", namespaced: true},
	{gvr: corev1.SchemeGroupVersion.WithResource("events"), spec: "events", namespaced: true},
	{gvr: corev1.SchemeGroupVersion.WithResource("replicationcontrollers"), spec: "replicationcontrollers", namespaced: true},
	{gvr: corev1.SchemeGroupVersion.WithResource("configmaps"), spec: "configmaps", namespaced: true},
	{gvr: eventsv1.SchemeGroupVersion.WithResource("events"), spec: "events.events.k8s.io", namespaced: true},
	{gvr: batchv1.SchemeGroupVersion.WithResource("jobs"), spec: "jobs.batch", namespaced: true},
	{gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, spec: "replicasets.apps", namespaced: true},
	{gvr: certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"), spec: "certificatesigningrequests.certificates.k8s.io"},
	{gvr: resourcev1.SchemeGroupVersion.WithResource("resourceslices"), spec: "resourceslices.resource.k8s.io"},
	// GA in 1.37, beta before (served by the sandbox for this check): at
	// the version the cache resolves (servedSelectorResources).
	{gvr: certificatesv1beta1.SchemeGroupVersion.WithResource("clustertrustbundles"), spec: "clustertrustbundles.certificates.k8s.io"},
	{gvr: certificatesv1beta1.SchemeGroupVersion.WithResource("podcertificaterequests"), spec: "podcertificaterequests.certificates.k8s.io", namespaced: true},
}

// servedSelectorResources is fieldSelectorResources at the versions the
// sandbox's kube-apiserver serves them, as the cache resolves a resource
// named without one: the first version, in the server's order of
// preference, that serves it. A resource served only at a version this
// client's scheme lacks (1.34's v1alpha1 PodCertificateRequests) is left
// out: the cache forwards it.
func servedSelectorResources(t *testing.T, c *sandbox.Cluster) []fieldSelectorResource {
	t.Helper()
	groups, err := c.Admin.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	var out []fieldSelectorResource
	for _, r := range fieldSelectorResources {
		if r.gvr.Group != certificatesv1.GroupName || r.gvr.Resource == "certificatesigningrequests" {
			out = append(out, r)
			continue
		}
		for _, g := range groups.Groups {
			if g.Name != r.gvr.Group {
				continue
			}
			for _, v := range g.Versions {
				list, err := c.Admin.Discovery().ServerResourcesForGroupVersion(v.GroupVersion)
				if err != nil {
					t.Fatal(err)
				}
				served := false
				for _, ar := range list.APIResources {
					if ar.Name == r.gvr.Resource && scheme.Scheme.Recognizes(schema.GroupVersionKind{Group: g.Name, Version: v.Version, Kind: ar.Kind}) {
						served = true
					}
				}
				if served {
					r.gvr.Version = v.Version
					out = append(out, r)
					break
				}
			}
		}
	}
	return out
}

// TestFieldSelectorsThroughAgent is the field selector scenario.
//
// Given an agent caching every built-in resource with field labels of its
// own (events of both groups, secrets, jobs, replication controllers,
// namespaces, nodes, pods, services, CSRs, resource slices, and the beta
// cluster trust bundles and pod certificate requests) and two with
// metadata fields only, and objects whose fields take several values,
// when a pod allowed to list them all lists each with every field label
// kube-apiserver accepts for it, with = and != against each value the
// objects have, the empty value and one no object has, and with labels
// kube-apiserver refuses,
// then the agent and kube-apiserver give the same status and the same
// objects every time; every accepted label was answered by the cache, and
// every refused one was forwarded (never refused by the agent itself).
func TestFieldSelectorsThroughAgent(t *testing.T) {
	c := requireCluster(t)
	minor := serverMinor(t, c)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	createFieldLabelObjects(t, ctx, c)
	resources := servedSelectorResources(t, c)

	var specs []string
	var rules []rbacv1.PolicyRule
	for _, r := range resources {
		specs = append(specs, r.spec)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{r.gvr.Group}, Resources: []string{r.gvr.Resource}, Verbs: readVerbs})
	}
	reader := newClientPod(t, ctx, c, fieldLabelNS, "field-reader")
	grantClusterRead(t, ctx, c, "e2e-field-labels-reader",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: reader.Spec.ServiceAccount, Namespace: fieldLabelNS}, rules...)
	// The agent's own watches; pods and nodes it watches as the node.
	grantClusterRead(t, ctx, c, "e2e-field-labels-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace}, rules[2:]...)
	if err := reader.WaitAllowed(ctx, "list", "secrets"); err != nil {
		t.Fatal(err)
	}
	// Every selector is a review of its own (kube-apiserver authorizes
	// field selectors): room for them all from the one reader pod.
	agent := startAgent(t, ctx, c, "--cache-resources="+strings.Join(specs, ","),
		"--review-qps=500", "--review-burst=2000", "--review-qps-per-source=500", "--review-burst-per-source=2000")
	waitSynced(t, ctx, agent, specs)
	viaAgent, direct := podClients(t, c, reader)

	// extraValues are values a label's JSON path does not show.
	extraValues := map[string][]string{
		"source":             {"kubelet", "e2e-controller"},
		"status.successful":  {"0", "1"},
		"reportingComponent": {"e2e-controller"},
	}
	refused := []string{"spec.bogus", "status.replicas", "metadata.uid"}
	var compared, hits, forwards int
	for _, r := range resources {
		ns := ""
		if r.namespaced {
			ns = fieldLabelNS
		}
		path := apiPath(r.gvr, ns)
		objects := listJSON(t, ctx, direct, path)
		labels := cache.BuiltinFieldLabels(r.gvr.GroupResource(), minor)
		sort.Strings(labels)
		type query struct {
			selector string
			hit      bool
		}
		var queries []query
		for _, label := range labels {
			if scopeField, _, _ := strings.Cut(r.scope, "="); label == scopeField && scopeField != "" {
				// Another term on the scope's own field: forwarded,
				// since the cache cannot tell it covers the request.
				continue
			}
			values := map[string]bool{"": true, "no-object-has-this": true}
			for _, v := range extraValues[label] {
				values[v] = true
			}
			for _, o := range objects {
				if v, ok := jsonValue(o, label); ok {
					values[v] = true
				}
			}
			for v := range values {
				for _, op := range []string{"=", "!="} {
					queries = append(queries, query{selector: label + op + v, hit: true})
				}
			}
		}
		for _, label := range refused {
			if !slices.Contains(labels, label) {
				queries = append(queries, query{selector: label + "=x"})
			}
		}
		for _, q := range queries {
			selector := q.selector
			if r.scope != "" {
				selector = r.scope + "," + selector
			}
			p := path + "?fieldSelector=" + url.QueryEscape(selector)
			before := readCacheMetrics(t, ctx, agent)
			got := viaAgent.do(t, ctx, http.MethodGet, p, acceptJSON, uaOther, nil)
			outcome := cacheOutcome(before, readCacheMetrics(t, ctx, agent))
			want := direct.do(t, ctx, http.MethodGet, p, acceptJSON, uaDirect, nil)
			compared++
			if gotAnswer, wantAnswer := answerOf(got), answerOf(want); !gotAnswer.equal(wantAnswer) {
				// The objects may have changed between the two reads:
				// ask both again before calling it a difference.
				got = viaAgent.do(t, ctx, http.MethodGet, p, acceptJSON, uaOther, nil)
				want = direct.do(t, ctx, http.MethodGet, p, acceptJSON, uaDirect, nil)
				if gotAnswer, wantAnswer = answerOf(got), answerOf(want); !gotAnswer.equal(wantAnswer) {
					t.Errorf("%s %s: through the agent %s, directly %s%s", r.gvr.Resource, selector,
						gotAnswer.summary, wantAnswer.summary, gotAnswer.firstDifference(wantAnswer))
				}
			}
			switch {
			case q.hit && outcome != "cache":
				t.Errorf("%s %s: %s, want answered by the cache", r.gvr.Resource, selector, outcome)
			case !q.hit && outcome != "forwarded/field-label":
				t.Errorf("%s %s: %s, want forwarded for its field label", r.gvr.Resource, selector, outcome)
			case q.hit:
				hits++
			default:
				forwards++
			}
		}
	}
	figuref(t, "field selectors: %d lists over %d resources compared through the agent and directly; %d answered by the cache, %d forwarded for a label kube-apiserver refuses",
		compared, len(resources), hits, forwards)
}

// waitSynced waits until the agent's cache has synced every resource of
// specs (in --cache-resources syntax, as the metrics name them).
func waitSynced(t *testing.T, ctx context.Context, a *sandbox.Agent, specs []string) {
	t.Helper()
	waitFor(t, time.Minute, "the cache synced "+strings.Join(specs, ","), func() bool {
		m := readCacheMetrics(t, ctx, a)
		for _, s := range specs {
			if m.synced[s] != 1 {
				return false
			}
		}
		return true
	})
}

// listJSON lists path with client and returns the items as generic JSON.
func listJSON(t *testing.T, ctx context.Context, client rawClient, path string) []map[string]any {
	t.Helper()
	resp := client.do(t, ctx, http.MethodGet, path, acceptJSON, uaDirect, nil)
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if resp.code != http.StatusOK || json.Unmarshal(resp.body, &list) != nil {
		t.Fatalf("listing %s: %d %s", path, resp.code, resp.body)
	}
	return list.Items
}

// jsonValue returns the scalar at the dotted path of obj, as kube-apiserver
// formats a field label's value.
func jsonValue(obj map[string]any, path string) (string, bool) {
	var cur any = obj
	for _, key := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false
		}
		cur = m[key]
	}
	switch v := cur.(type) {
	case string:
		return v, true
	case bool, float64:
		return fmt.Sprint(v), true
	}
	return "", false
}

// listAnswer is a list answer: summary is its status code and the sorted
// namespace/name of its items, or the Status message; items are the
// items as canonical JSON (keys sorted), in the same order.
type listAnswer struct {
	summary string
	items   []string
}

func (a listAnswer) equal(b listAnswer) bool {
	return a.summary == b.summary && slices.Equal(a.items, b.items)
}

// firstDifference describes the first item a and b disagree on, if any.
func (a listAnswer) firstDifference(b listAnswer) string {
	for i := range min(len(a.items), len(b.items)) {
		if a.items[i] != b.items[i] {
			return fmt.Sprintf("; first differing item, through the agent:\n%s\ndirectly:\n%s", a.items[i], b.items[i])
		}
	}
	return ""
}

// answerOf reads a list answer: the whole items, not only their names, so
// that an object answered from the cache must equal kube-apiserver's.
func answerOf(r rawResponse) listAnswer {
	var body struct {
		Message string           `json:"message"`
		Items   []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		return listAnswer{summary: fmt.Sprintf("%d undecodable %q", r.code, r.body)}
	}
	if r.code != http.StatusOK {
		return listAnswer{summary: fmt.Sprintf("%d %q", r.code, body.Message)}
	}
	key := func(it map[string]any) string {
		ns, _ := jsonValue(it, "metadata.namespace")
		name, _ := jsonValue(it, "metadata.name")
		return ns + "/" + name
	}
	sort.Slice(body.Items, func(i, j int) bool { return key(body.Items[i]) < key(body.Items[j]) })
	a := listAnswer{}
	names := make([]string, 0, len(body.Items))
	for _, it := range body.Items {
		names = append(names, key(it))
		b, err := json.Marshal(it) // encoding/json sorts map keys
		if err != nil {
			return listAnswer{summary: fmt.Sprintf("200 unencodable item %s: %v", key(it), err)}
		}
		a.items = append(a.items, string(b))
	}
	a.summary = fmt.Sprintf("200 %v", names)
	return a
}

// createFieldLabelObjects creates objects whose fields take several values:
// events from a component and from a controller, events.k8s.io events,
// secrets of two types, a replication controller and a suspended job (no
// pods), a CSR of a custom signer and a resource slice of this node.
func createFieldLabelObjects(t *testing.T, ctx context.Context, c *sandbox.Cluster) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fieldLabelNS}}
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now())
	ref := corev1.ObjectReference{Kind: "Pod", Namespace: fieldLabelNS, Name: "some-pod", UID: "uid-1", APIVersion: "v1",
		ResourceVersion: "42", FieldPath: "spec.containers{app}"}
	created := []error{}
	create := func(err error) {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			created = append(created, err)
		}
	}
	_, err := c.Admin.CoreV1().Events(fieldLabelNS).Create(ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "from-kubelet"}, InvolvedObject: ref, Reason: "Pulled", Type: "Normal",
		Source: corev1.EventSource{Component: "kubelet", Host: sandbox.NodeName}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{})
	create(err)
	_, err = c.Admin.CoreV1().Events(fieldLabelNS).Create(ctx, &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "from-controller"}, InvolvedObject: corev1.ObjectReference{Kind: "Job", Namespace: fieldLabelNS, Name: "a-job"},
		Reason: "Completed", Type: "Warning", ReportingController: "e2e-controller", ReportingInstance: "e2e-controller-1",
		Action: "Complete", EventTime: metav1.NewMicroTime(time.Now()),
	}, metav1.CreateOptions{})
	create(err)
	_, err = c.Admin.EventsV1().Events(fieldLabelNS).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "new-style"}, Regarding: ref, Reason: "Scheduled", Type: "Normal", Note: "placed",
		ReportingController: "e2e-scheduler", ReportingInstance: "e2e-scheduler-1", Action: "Binding", EventTime: metav1.NewMicroTime(time.Now()),
	}, metav1.CreateOptions{})
	create(err)
	for name, typ := range map[string]corev1.SecretType{"opaque": corev1.SecretTypeOpaque, "custom": "example.com/custom"} {
		_, err = c.Admin.CoreV1().Secrets(fieldLabelNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: typ,
			StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
		create(err)
	}
	labels := map[string]string{"app": "field-labels"}
	_, err = c.Admin.CoreV1().ReplicationControllers(fieldLabelNS).Create(ctx, &corev1.ReplicationController{
		ObjectMeta: metav1.ObjectMeta{Name: "rc"},
		Spec: corev1.ReplicationControllerSpec{Replicas: ptr.To[int32](0), Selector: labels, Template: &corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
		}},
	}, metav1.CreateOptions{})
	create(err)
	_, err = c.Admin.BatchV1().Jobs(fieldLabelNS).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "job"},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
		}},
	}, metav1.CreateOptions{})
	create(err)
	csrPEM, _ := newCSR(t, "e2e-field-labels")
	_, err = c.Admin.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-field-labels"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: "example.com/field-labels",
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}},
	}, metav1.CreateOptions{})
	create(err)
	_, err = c.Admin.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-field-labels"},
		Spec: resourcev1.ResourceSliceSpec{Driver: "field-labels.example.com", NodeName: ptr.To(sandbox.NodeName),
			Pool: resourcev1.ResourcePool{Name: "pool", ResourceSliceCount: 1}, Devices: []resourcev1.Device{{Name: "dev-0"}}},
	}, metav1.CreateOptions{})
	create(err)
	// Trust bundles with and without a signer (a signer's bundle is named
	// after it). No PodCertificateRequest: only a kubelet can make one
	// for a running pod; its lists are compared empty.
	for name, signer := range map[string]string{"e2e-field-labels": "", "example.com:field-labels:e2e": "example.com/field-labels"} {
		_, err = c.Admin.CertificatesV1beta1().ClusterTrustBundles().Create(ctx, &certificatesv1beta1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       certificatesv1beta1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(c.CA.CertPEM)},
		}, metav1.CreateOptions{})
		create(err)
	}
	if len(created) > 0 {
		t.Fatalf("creating the objects: %v", created)
	}
}

// serverMinor is the sandbox kube-apiserver's minor release, which the
// cache's field label tables depend on.
func serverMinor(t *testing.T, c *sandbox.Cluster) int {
	t.Helper()
	info, err := c.Admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("kube-apiserver version: %v", err)
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil {
		t.Fatalf("kube-apiserver version %q: %v", info.GitVersion, err)
	}
	return int(v.Minor())
}
