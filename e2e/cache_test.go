package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const (
	cacheNS = "e2e-cache"
	// User agents tell the audit log which requests were expected to be
	// answered by the cache.
	uaHit    = "kube-apicache-e2e/cache-hit"
	uaDirect = "kube-apicache-e2e/direct"
	uaOther  = "kube-apicache-e2e/other"
)

// rawClient sends requests with a pod's own token, from the pod's network
// namespace, either to the Service VIP (the agent) or straight to
// kube-apiserver.
type rawClient struct {
	hc    *http.Client
	base  string
	token string
}

type rawResponse struct {
	code        int
	contentType string
	body        []byte
}

func (c rawClient) do(t *testing.T, ctx context.Context, method, path, accept, ua string, body []byte) rawResponse {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	switch {
	case body != nil && method == http.MethodPatch:
		req.Header.Set("Content-Type", "application/merge-patch+json")
	case body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", ua)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return rawResponse{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
}

// podClients returns a client through the agent and a direct one, both
// with pod's token.
func podClients(t *testing.T, c *sandbox.Cluster, pod *sandbox.Pod) (viaAgent, direct rawClient) {
	viaAgent = rawClient{hc: vipClient(t, pod, true), base: vipURL(""), token: pod.Token}
	direct = rawClient{hc: vipClient(t, pod, true), base: c.APIServers()[0].URL, token: pod.Token}
	return viaAgent, direct
}

// normalize decodes a response into generic JSON for comparison, whatever
// its encoding, and drops what legitimately differs between two answers
// given moments apart: a list's own resourceVersion.
func normalize(t *testing.T, r rawResponse) map[string]any {
	t.Helper()
	if strings.HasPrefix(r.contentType, runtime.ContentTypeProtobuf) {
		return decodeNormalized(t, scheme.Codecs.UniversalDeserializer(), r)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("decoding JSON %q: %v", r.body, err)
	}
	return dropListRV(m)
}

// decodeNormalized decodes a response with d, in whatever encoding d
// understands, into generic JSON carrying the kind and apiVersion it was
// decoded as, without a list's own resourceVersion.
func decodeNormalized(t *testing.T, d runtime.Decoder, r rawResponse) map[string]any {
	t.Helper()
	obj, gvk, err := d.Decode(r.body, nil, nil)
	if err != nil {
		t.Fatalf("decoding %s: %v", r.contentType, err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["kind"], m["apiVersion"] = gvk.Kind, gvk.GroupVersion().String()
	return dropListRV(m)
}

func dropListRV(m map[string]any) map[string]any {
	if _, isList := m["items"]; isList {
		if md, ok := m["metadata"].(map[string]any); ok {
			delete(md, "resourceVersion")
		}
	}
	return m
}

// cacheMetrics reads the agent's cache counters and state.
type cacheMetrics struct {
	outcomes map[string]float64 // by outcome, and outcome/reason
	synced   map[string]float64 // by resource
}

func readCacheMetrics(t *testing.T, ctx context.Context, a *sandbox.Agent) cacheMetrics {
	t.Helper()
	samples := scrapeAgent(t, ctx, a)
	out := cacheMetrics{outcomes: map[string]float64{}}
	for _, m := range samples["kube_apicache_cache_requests_total"] {
		outcome, reason := m.labels["outcome"], m.labels["reason"]
		out.outcomes[outcome] += m.value
		out.outcomes[outcome+"/"+reason] += m.value
	}
	out.synced = sumBy(samples["kube_apicache_cache_synced"], "resource")
	return out
}

// cacheScenarios keeps each cluster's cache scenario, which several tests
// share: its pods can be created only once.
var cacheScenarios = struct {
	sync.Mutex
	pods map[*sandbox.Cluster][2]*sandbox.Pod
}{pods: map[*sandbox.Cluster][2]*sandbox.Pod{}}

// setUpCacheScenario creates the objects the cache scenarios read, a pod
// allowed to read them cluster-wide and one allowed nothing; once per
// cluster, later calls return the same pods.
func setUpCacheScenario(t *testing.T, ctx context.Context, c *sandbox.Cluster) (reader, nobody *sandbox.Pod) {
	t.Helper()
	cacheScenarios.Lock()
	defer cacheScenarios.Unlock()
	if p, ok := cacheScenarios.pods[c]; ok {
		return p[0], p[1]
	}
	reader, nobody = newCacheScenario(t, ctx, c)
	cacheScenarios.pods[c] = [2]*sandbox.Pod{reader, nobody}
	return reader, nobody
}

func newCacheScenario(t *testing.T, ctx context.Context, c *sandbox.Cluster) (reader, nobody *sandbox.Pod) {
	t.Helper()
	reader = newClientPod(t, ctx, c, cacheNS, "reader")
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-cache-reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "services", "namespaces"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list"}},
		},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-cache-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: reader.Spec.ServiceAccount, Namespace: cacheNS}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := reader.WaitAllowed(ctx, "list", "nodes"); err != nil {
		t.Fatal(err)
	}
	var err error
	if nobody, err = c.NewPod(ctx, sandbox.PodSpec{Name: "nobody", Namespace: cacheNS, ServiceAccount: "nobody"}); err != nil {
		t.Fatal(err)
	}

	for _, svc := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "svc-a", Labels: map[string]string{"tier": "a"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "svc-b", Labels: map[string]string{"tier": "b"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 81}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "svc-headless", Labels: map[string]string{"tier": "c"}},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 82}}}},
	} {
		if _, err := c.Admin.CoreV1().Services(cacheNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, p := range []struct {
		name, node string
		restart    corev1.RestartPolicy
	}{
		{"local-1", sandbox.NodeName, corev1.RestartPolicyAlways},
		{"local-2", sandbox.NodeName, corev1.RestartPolicyNever},
		{"elsewhere", "other-node", corev1.RestartPolicyAlways},
	} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": p.name, "group": "e2e"}},
			Spec: corev1.PodSpec{NodeName: p.node, RestartPolicy: p.restart,
				Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest"}}},
		}
		if _, err := c.Admin.CoreV1().Pods(cacheNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return reader, nobody
}

// waitCacheSynced waits until every default resource is in the cache.
func waitCacheSynced(t *testing.T, ctx context.Context, a *sandbox.Agent) {
	t.Helper()
	want := []string{"pods", "nodes", "services", "endpointslices.discovery.k8s.io", "namespaces"}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m := readCacheMetrics(t, ctx, a)
		for _, r := range want {
			if m.synced[r] != 1 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("cache did not sync: %v\n%v", err, readCacheMetrics(t, ctx, a).synced)
	}
}

// cacheCase is one request of the differential scenario.
type cacheCase struct {
	name string
	path string
	// hit: the agent must answer it from its cache.
	hit bool
	// code is the status both must answer.
	code int
}

const (
	acceptJSON     = "application/json"
	acceptProtobuf = "application/vnd.kubernetes.protobuf, application/json"
)

// TestCacheDifferential is the cached-reads scenario: given an agent whose
// cache has synced, when a pod makes the same request through the agent
// and directly with the same token, then both answers are the same (modulo
// a list's own resourceVersion), in JSON and protobuf, for every
// resourceVersion mode, selectors, namespaced and cluster-scoped resources,
// not found, forbidden and bad requests; the requests the cache covers were
// answered by the cache; and none of those reached kube-apiserver as a get
// or list (audit log).
func TestCacheDifferential(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reader, nobody := setUpCacheScenario(t, ctx, c)
	agent := startAgent(t, ctx, c)
	waitCacheSynced(t, ctx, agent)
	viaAgent, direct := podClients(t, c, reader)

	// An RV the cache has certainly reached: that of its own RV=0 list.
	var listed metav1.List
	r0 := viaAgent.do(t, ctx, "GET", "/api/v1/namespaces/"+cacheNS+"/services?resourceVersion=0", acceptJSON, uaOther, nil)
	if err := json.Unmarshal(r0.body, &listed); err != nil || listed.ResourceVersion == "" {
		t.Fatalf("listing services: %v %s", err, r0.body)
	}
	svcRV := listed.ResourceVersion
	r0 = viaAgent.do(t, ctx, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3D"+sandbox.NodeName+"&resourceVersion=0", acceptJSON, uaOther, nil)
	if err := json.Unmarshal(r0.body, &listed); err != nil || listed.ResourceVersion == "" {
		t.Fatalf("listing pods: %v %s", err, r0.body)
	}
	podRV := listed.ResourceVersion

	// The cache covers this node's name whether or not a Node object
	// exists: its 404 is kube-apiserver's.
	nodeCode := http.StatusNotFound
	if _, err := c.Admin.CoreV1().Nodes().Get(ctx, sandbox.NodeName, metav1.GetOptions{}); err == nil {
		nodeCode = http.StatusOK
	}
	onNode := "fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName)
	nsPods := "/api/v1/namespaces/" + cacheNS + "/pods"
	nsSvcs := "/api/v1/namespaces/" + cacheNS + "/services"
	cases := []cacheCase{
		// resourceVersion modes
		{"node pods, RV=0", "/api/v1/pods?" + onNode + "&resourceVersion=0", true, 200},
		{"node pods, consistent", "/api/v1/pods?" + onNode, true, 200},
		{"node pods, RV=N", "/api/v1/pods?" + onNode + "&resourceVersion=" + podRV, true, 200},
		{"node pods, NotOlderThan N", "/api/v1/pods?" + onNode + "&resourceVersion=" + podRV + "&resourceVersionMatch=NotOlderThan", true, 200},
		{"node pods, limit with RV=0 is the whole list", "/api/v1/pods?" + onNode + "&resourceVersion=0&limit=1", true, 200},
		{"node pods, limit above the count", "/api/v1/pods?" + onNode + "&limit=500", true, 200},
		{"node pods, Exact is forwarded", "/api/v1/pods?" + onNode + "&resourceVersion=" + podRV + "&resourceVersionMatch=Exact", false, 200},
		{"node pods, paginated consistent list is forwarded", "/api/v1/pods?" + onNode + "&limit=1", false, 200},
		// selectors
		{"node pods in a namespace", nsPods + "?" + onNode, true, 200},
		{"node pods by label", nsPods + "?" + onNode + "&labelSelector=" + url.QueryEscape("app in (local-2,elsewhere)"), true, 200},
		{"node pods by field", nsPods + "?fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName+",spec.restartPolicy=Never"), true, 200},
		{"node pods by old field name", "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.host="+sandbox.NodeName), false, 200},
		{"node pods, unsupported field label is forwarded", nsPods + "?fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName+",spec.bogus=1"), false, 400},
		{"namespace pods are not covered", nsPods, false, 200},
		{"pods of another node are not covered", "/api/v1/pods?fieldSelector=spec.nodeName%3Dother-node", false, 200},
		{"services by label", nsSvcs + "?labelSelector=" + url.QueryEscape("tier!=b"), true, 200},
		{"services by field", "/api/v1/services?fieldSelector=" + url.QueryEscape("spec.clusterIP=None"), true, 200},
		{"services by name", nsSvcs + "?fieldSelector=metadata.name%3Dsvc-a&resourceVersion=" + svcRV, true, 200},
		{"services, bad label selector", nsSvcs + "?labelSelector=" + url.QueryEscape("tier in (a"), true, 400},
		{"services, unsupported field label is forwarded", nsSvcs + "?fieldSelector=spec.bogus%3D1", false, 400},
		{"services, malformed field selector", nsSvcs + "?fieldSelector=nonsense", true, 400},
		// gets, namespaced and cluster-scoped
		{"get node pod", nsPods + "/local-1", true, 200},
		{"get node pod, RV=0", nsPods + "/local-2?resourceVersion=0", true, 200},
		{"get pod of another node is forwarded", nsPods + "/elsewhere", false, 200},
		{"get missing pod is forwarded", nsPods + "/missing", false, 404},
		{"get service", nsSvcs + "/svc-a", true, 200},
		{"get missing service", nsSvcs + "/missing", true, 404},
		{"get this node", "/api/v1/nodes/" + sandbox.NodeName, true, nodeCode},
		{"list this node", "/api/v1/nodes?fieldSelector=metadata.name%3D" + sandbox.NodeName, true, 200},
		{"get another node is forwarded", "/api/v1/nodes/other-node", false, 404},
		{"list namespaces", "/api/v1/namespaces", true, 200},
		{"namespaces by phase", "/api/v1/namespaces?fieldSelector=status.phase%3DActive&labelSelector=kubernetes.io%2Fmetadata.name%3D" + cacheNS, true, 200},
		{"namespaces, unsupported field label is forwarded", "/api/v1/namespaces?fieldSelector=metadata.namespace%3Dx", false, 400},
		{"get namespace", "/api/v1/namespaces/" + cacheNS, true, 200},
		{"get missing namespace", "/api/v1/namespaces/missing", true, 404},
		{"endpointslices", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", true, 200},
		{"endpointslices by label", "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dkubernetes", true, 200},
		{"endpointslices, old version is forwarded", "/apis/discovery.k8s.io/v1beta1/endpointslices", false, 404},
		{"configmaps are not cached", "/api/v1/namespaces/" + cacheNS + "/configmaps", false, 200},
	}

	before := readCacheMetrics(t, ctx, agent)
	hits := 0
	for _, tc := range cases {
		for _, accept := range []string{acceptJSON, acceptProtobuf} {
			name := tc.name + " (" + strings.SplitN(accept, ",", 2)[0] + ")"
			ua := uaOther
			if tc.hit {
				ua = uaHit
				hits++
			}
			got := viaAgent.do(t, ctx, "GET", tc.path, accept, ua, nil)
			want := direct.do(t, ctx, "GET", tc.path, accept, uaDirect, nil)
			if got.code != want.code || got.code != tc.code {
				t.Errorf("%s: code through the agent %d, direct %d, want %d\nagent:  %s\ndirect: %s", name, got.code, want.code, tc.code, got.body, want.body)
				continue
			}
			if got.contentType != want.contentType {
				t.Errorf("%s: Content-Type through the agent %q, direct %q", name, got.contentType, want.contentType)
			}
			if diff := cmp.Diff(normalize(t, want), normalize(t, got)); diff != "" {
				t.Errorf("%s: bodies differ (-direct +agent):\n%s", name, diff)
			}
		}
	}

	// Forbidden: a pod allowed nothing gets kube-apiserver's 403, from the
	// cache.
	nobodyAgent, nobodyDirect := podClients(t, c, nobody)
	for _, path := range []string{nsSvcs, nsSvcs + "/svc-a", "/api/v1/namespaces"} {
		for _, accept := range []string{acceptJSON, acceptProtobuf} {
			hits++
			got := nobodyAgent.do(t, ctx, "GET", path, accept, uaHit, nil)
			want := nobodyDirect.do(t, ctx, "GET", path, accept, uaDirect, nil)
			if got.code != http.StatusForbidden || want.code != http.StatusForbidden {
				t.Errorf("forbidden %s: through the agent %d, direct %d", path, got.code, want.code)
				continue
			}
			if diff := cmp.Diff(normalize(t, want), normalize(t, got)); diff != "" {
				t.Errorf("forbidden %s: bodies differ (-direct +agent):\n%s", path, diff)
			}
		}
	}

	t.Run("covered requests were cache hits", func(t *testing.T) {
		after := readCacheMetrics(t, ctx, agent)
		answered := (after.outcomes["hit"] - before.outcomes["hit"]) + (after.outcomes["denied"] - before.outcomes["denied"])
		if int(answered) != hits {
			t.Errorf("cache answered %v requests, want %d; outcomes before %v, after %v", answered, hits, before.outcomes, after.outcomes)
		}
		figuref(t, "cache answered %v of %d covered requests; outcomes now %v", answered, hits, after.outcomes)
	})

	t.Run("cache hits reached no apiserver", func(t *testing.T) {
		seen, upstream := 0, 0
		for _, ev := range auditEvents(t, c, nil) {
			if ev.UserAgent == uaOther {
				seen++
			}
			if ev.UserAgent == uaHit && (ev.Verb == "get" || ev.Verb == "list") {
				upstream++
				t.Errorf("cached read reached kube-apiserver: %s %s", ev.Verb, ev.RequestURI)
			}
		}
		// The audit log does record this run's forwarded requests, so a
		// hit would have shown up.
		if seen == 0 {
			t.Errorf("no forwarded request of this test in the audit log; cannot tell hits apart")
		}
		figuref(t, "audit: %d forwarded requests of this test, %d cached reads upstream", seen, upstream)
	})
}

// TestCacheReadYourWrites: given an agent with a synced cache, when a pod
// creates and updates services through the agent and immediately reads
// them back with resourceVersion="" (1,000 times), then no read is stale,
// and the reads are answered by the cache.
func TestCacheReadYourWrites(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	writer := newClientPod(t, ctx, c, "e2e-cache-ryw", "writer")
	agent := startAgent(t, ctx, c)
	waitCacheSynced(t, ctx, agent)
	viaAgent, _ := podClients(t, c, writer)
	base := "/api/v1/namespaces/e2e-cache-ryw/services"

	before := readCacheMetrics(t, ctx, agent)
	const iterations = 1000
	stale := 0
	name := ""
	for i := 0; i < iterations; i++ {
		var resp rawResponse
		if i%50 == 0 {
			// Create: the new object must be there at once.
			name = fmt.Sprintf("ryw-%d", i)
			svc := fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"name":%q,"labels":{"step":"%d"}},"spec":{"ports":[{"port":80}]}}`, name, i)
			resp = viaAgent.do(t, ctx, "POST", base, acceptJSON, uaOther, []byte(svc))
			if resp.code != http.StatusCreated {
				t.Fatalf("create %s: %d %s", name, resp.code, resp.body)
			}
		} else {
			patch := fmt.Sprintf(`{"metadata":{"labels":{"step":"%d"}}}`, i)
			resp = viaAgent.do(t, ctx, "PATCH", base+"/"+name, acceptJSON, uaOther, []byte(patch))
			if resp.code != http.StatusOK {
				t.Fatalf("patch %s: %d %s", name, resp.code, resp.body)
			}
		}
		var written corev1.Service
		if err := json.Unmarshal(resp.body, &written); err != nil {
			t.Fatal(err)
		}
		// Read it back, by get and by list.
		path := base + "/" + name
		if i%2 == 1 {
			path = base + "?fieldSelector=metadata.name%3D" + name
		}
		got := viaAgent.do(t, ctx, "GET", path, acceptJSON, uaHit, nil)
		if got.code != http.StatusOK {
			t.Fatalf("read %s: %d %s", path, got.code, got.body)
		}
		var read corev1.Service
		if i%2 == 1 {
			var list corev1.ServiceList
			if err := json.Unmarshal(got.body, &list); err != nil || len(list.Items) != 1 {
				t.Fatalf("read %s: %v %s", path, err, got.body)
			}
			read = list.Items[0]
		} else if err := json.Unmarshal(got.body, &read); err != nil {
			t.Fatal(err)
		}
		if read.Labels["step"] != fmt.Sprint(i) || read.ResourceVersion != written.ResourceVersion {
			stale++
			t.Errorf("iteration %d: read step %q at RV %s after writing step %d at RV %s", i, read.Labels["step"], read.ResourceVersion, i, written.ResourceVersion)
		}
	}
	after := readCacheMetrics(t, ctx, agent)
	hits := after.outcomes["hit"] - before.outcomes["hit"]
	figuref(t, "%d write-then-read iterations: %d stale reads; %v reads answered by the cache; forwarded by reason: %v",
		iterations, stale, hits, diffOutcomes(before.outcomes, after.outcomes))
	if hits == 0 {
		t.Errorf("no read was answered by the cache; all were forwarded")
	}
	// Every read the cache answered stayed off kube-apiserver: the reads
	// in the audit log are exactly the forwarded ones.
	upstream := len(auditEvents(t, c, func(ev *auditv1.Event) bool {
		return ev.UserAgent == uaHit && (ev.Verb == "get" || ev.Verb == "list") && ev.Stage == "ResponseComplete"
	}))
	if upstream != iterations-int(hits) {
		t.Errorf("%d reads reached kube-apiserver, want the %d the cache forwarded", upstream, iterations-int(hits))
	}
}

// diffOutcomes returns the forwarded counts that grew between two reads.
func diffOutcomes(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if strings.HasPrefix(k, "forwarded/") && v > before[k] {
			out[strings.TrimPrefix(k, "forwarded/")] = v - before[k]
		}
	}
	return out
}
