package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const wlNS = "e2e-watchlist"

var widgetsGVR = schema.GroupVersionResource{Group: "e2e.kube-apicache.io", Version: "v1", Resource: "widgets"}

// informerProc is a podclient informers process: its stdin takes "dump",
// its stdout lines arrive on lines.
type informerProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startInformerSet(t *testing.T, ctx context.Context, pod *sandbox.Pod, name string, watchList bool, extra ...string) *informerProc {
	t.Helper()
	args := append([]string{"informers", "--timeout=15m", "--cr=" + widgetsGVR.Group + "/" + widgetsGVR.Version + "/" + widgetsGVR.Resource}, extra...)
	cmd := pod.Command(ctx, podclientBin, args...)
	cmd.Env = append(cmd.Env, fmt.Sprintf("KUBE_FEATURE_WatchListClient=%v", watchList))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &informerProc{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 100000)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, tailLines(stderr.String(), 30))
		}
	})
	return p
}

// waitLine waits for a line starting with prefix.
func (p *informerProc) waitLine(prefix string, timeout time.Duration) (string, error) {
	l, _, err := awaitLine(p.lines, timeout, prefix, func(l string) bool { return strings.HasPrefix(l, prefix) })
	if err != nil {
		return "", fmt.Errorf("%s: %w", p.name, err)
	}
	return l, nil
}

// dump returns the informers' objects as "informer ns/name rv" lines.
func (p *informerProc) dump(t *testing.T) []string {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "dump\n"); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	var out []string
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s ended during a dump", p.name)
			}
			if l == "END" {
				return out
			}
			if s, ok := strings.CutPrefix(l, "OBJ "); ok {
				out = append(out, s)
			}
		case <-deadline:
			t.Fatalf("%s: dump did not end", p.name)
		}
	}
}

// upstreamState is what the informers must hold, read from kube-apiserver.
func upstreamState(t *testing.T, ctx context.Context, c *sandbox.Cluster, dc dynamic.Interface) []string {
	t.Helper()
	var out []string
	pods, err := c.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		out = append(out, fmt.Sprintf("pods %s/%s %s", p.Namespace, p.Name, p.ResourceVersion),
			fmt.Sprintf("pods-metadata %s/%s %s", p.Namespace, p.Name, p.ResourceVersion))
	}
	svcs, err := c.Admin.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		out = append(out, fmt.Sprintf("services %s/%s %s", s.Namespace, s.Name, s.ResourceVersion))
	}
	ws, err := dc.Resource(widgetsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Items {
		out = append(out, fmt.Sprintf("widgets %s/%s %s", w.GetNamespace(), w.GetName(), w.GetResourceVersion()))
	}
	sort.Strings(out)
	return out
}

// waitConverged waits until every informer process holds upstream's state.
func waitConverged(t *testing.T, ctx context.Context, c *sandbox.Cluster, dc dynamic.Interface, procs ...*informerProc) time.Duration {
	t.Helper()
	start := time.Now()
	for _, p := range procs {
		var last []string
		var want []string
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			want = upstreamState(t, ctx, c, dc)
			last = p.dump(t)
			return cmp.Equal(want, last), nil
		})
		if err != nil {
			t.Fatalf("%s did not converge to upstream's state (-upstream +informer):\n%s", p.name, cmp.Diff(want, last))
		}
	}
	return time.Since(start)
}

func createWidgetCRD(t *testing.T, ctx context.Context, c *sandbox.Cluster) {
	t.Helper()
	ac := apiextensionsclient.NewForConfigOrDie(c.AdminConfig)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: widgetsGVR.Resource + "." + widgetsGVR.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: widgetsGVR.Group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"color": {Type: "string"}, "size": {Type: "integer"}}},
					},
				}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Color", Type: "string", JSONPath: ".spec.color"},
					{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
				SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}},
			}},
		},
	}
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := ac.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD not established: %v", err)
	}
}

// grantClusterRead lets subject get, list and watch rules' resources
// cluster-wide.
func grantClusterRead(t *testing.T, ctx context.Context, c *sandbox.Cluster, name string, subject rbacv1.Subject, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

var readVerbs = []string{"get", "list", "watch"}

// churn makes n creates, updates and deletes of pods on this node (and
// some on another node), services and widgets, straight at kube-apiserver.
func churn(t *testing.T, ctx context.Context, c *sandbox.Cluster, dc dynamic.Interface, prefix string, n int) {
	t.Helper()
	rng := rand.New(rand.NewSource(int64(len(prefix)) + int64(n)))
	live := map[string][]string{}
	seq := 0
	for i := 0; i < n; i++ {
		kind := []string{"pods", "services", "widgets"}[i%3]
		names := live[kind]
		op := rng.Intn(3)
		if len(names) < 5 {
			op = 0
		}
		var err error
		switch op {
		case 0: // create
			seq++
			name := fmt.Sprintf("%s-%s-%d", prefix, kind[:3], seq)
			switch kind {
			case "pods":
				node := sandbox.NodeName
				if seq%4 == 0 {
					node = "other-node"
				}
				_, err = c.Admin.CoreV1().Pods(wlNS).Create(ctx, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"n": "0"}},
					Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest"}}},
				}, metav1.CreateOptions{})
			case "services":
				_, err = c.Admin.CoreV1().Services(wlNS).Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"n": "0"}},
					Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
				}, metav1.CreateOptions{})
			case "widgets":
				_, err = dc.Resource(widgetsGVR).Namespace(wlNS).Create(ctx, widgetObject(name, "red", int64(seq)), metav1.CreateOptions{})
			}
			live[kind] = append(names, name)
		case 1: // update
			name := names[rng.Intn(len(names))]
			patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{"n":"%d"}}}`, i))
			switch kind {
			case "pods":
				_, err = c.Admin.CoreV1().Pods(wlNS).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			case "services":
				_, err = c.Admin.CoreV1().Services(wlNS).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			case "widgets":
				patch = []byte(fmt.Sprintf(`{"metadata":{"labels":{"n":"%d"}},"spec":{"color":"c%d"}}`, i, i%4))
				_, err = dc.Resource(widgetsGVR).Namespace(wlNS).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{})
			}
		case 2: // delete
			k := rng.Intn(len(names))
			name := names[k]
			live[kind] = append(names[:k:k], names[k+1:]...)
			opts := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
			switch kind {
			case "pods":
				err = c.Admin.CoreV1().Pods(wlNS).Delete(ctx, name, opts)
			case "services":
				err = c.Admin.CoreV1().Services(wlNS).Delete(ctx, name, opts)
			case "widgets":
				err = dc.Resource(widgetsGVR).Namespace(wlNS).Delete(ctx, name, opts)
			}
		}
		if err != nil {
			t.Fatalf("churn op %d (%s): %v", i, kind, err)
		}
	}
}

func widgetObject(name, color string, size int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": widgetsGVR.GroupVersion().String(), "kind": "Widget",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"color": color, "size": size},
	}}
}

// TestWatchListInformers is the informer start-up scenario.
//
// Given an agent caching the default resources and a custom resource, and
// a pod allowed to read pods, services and widgets,
// when the pod runs a client-go v0.36 informer set with WatchListClient on
// (protobuf) and one with it off (list and watch, JSON), for this node's
// pods (typed and metadata-only), services and widgets,
// then both sync through the agent; kube-apiserver sees no list and no
// watch with sendInitialEvents from the pod's user (audit log); both hold
// upstream's state after 1,000 creates, updates and deletes;
// and when every kube-apiserver restarts under their open watches, the
// watch-lists end as direct ones would, and the informers recover and
// converge again.
func TestWatchListInformers(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dc := dynamic.NewForConfigOrDie(c.AdminConfig)

	createWidgetCRD(t, ctx, c)
	widgetRule := rbacv1.PolicyRule{APIGroups: []string{widgetsGVR.Group}, Resources: []string{"widgets"}, Verbs: readVerbs}
	grantClusterRead(t, ctx, c, "e2e-watchlist-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace}, widgetRule)
	pod := newClientPod(t, ctx, c, wlNS, "informers")
	grantClusterRead(t, ctx, c, "e2e-watchlist-informers",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: pod.Spec.ServiceAccount, Namespace: wlNS},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: readVerbs}, widgetRule)
	if err := pod.WaitAllowed(ctx, "watch", "services"); err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, c, dc, "seed", 60)

	agent := startAgent(t, ctx, c, "--cache-resources="+cache.DefaultResources+",widgets."+widgetsGVR.Group+"/v1")
	waitCacheSynced(t, ctx, agent)
	waitResourceSynced(t, ctx, agent, "widgets."+widgetsGVR.Group)
	startedAt := time.Now()

	// When both informer sets start, then both sync.
	wl := startInformerSet(t, ctx, pod, "watch-list informers", true, "--protobuf")
	lw := startInformerSet(t, ctx, pod, "list+watch informers", false)
	for _, p := range []*informerProc{wl, lw} {
		if _, err := p.waitLine("SYNCED", 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	figuref(t, "both informer sets synced in %s", time.Since(startedAt).Round(time.Millisecond))
	waitConverged(t, ctx, c, dc, wl, lw)

	// When 1,000 creates, updates and deletes happen upstream, then both
	// converge to upstream's state.
	churnStart := time.Now()
	churn(t, ctx, c, dc, "churn", 1000)
	figuref(t, "1,000 writes took %s; informers converged %s after the last", time.Since(churnStart).Round(time.Millisecond),
		waitConverged(t, ctx, c, dc, wl, lw).Round(time.Millisecond))

	// And kube-apiserver never served the pod's user a list or initial
	// events: the cache did.
	user := pod.Username()
	var lists, initial, continuations int
	for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool {
		return ev.User.Username == user && (ev.Stage == "ResponseStarted" || ev.Stage == "ResponseComplete")
	}) {
		switch {
		case ev.Verb == "list":
			lists++
			t.Errorf("kube-apiserver served a list to the informers: %s", ev.RequestURI)
		case ev.Verb == "watch" && strings.Contains(ev.RequestURI, "sendInitialEvents=true"):
			initial++
			t.Errorf("kube-apiserver served initial events to the informers: %s", ev.RequestURI)
		case ev.Verb == "watch" && ev.Stage == "ResponseStarted":
			continuations++
		}
	}
	hits := cacheWatchHits(t, ctx, agent)
	figuref(t, "audit: %d lists and %d watches with initial events reached kube-apiserver from %s; %d watches started upstream; the agent answered %v watch-lists from its cache",
		lists, initial, user, continuations, hits)
	if hits < 4 {
		t.Errorf("the agent answered %v watch-lists from its cache, want at least the 4 of the watch-list informer set", hits)
	}

	// When kubectl in the pod prints pods on this node, services and
	// widgets, then it prints the same through the agent as direct.
	compareKubectl(t, ctx, c, pod)
	compareMetadata(t, ctx, c, agent, pod)

	// When every kube-apiserver restarts under the open watches, then the
	// informers recover and converge again.
	// One at a time, so that every open upstream continuation is cut while
	// the agent can fail over to the other instance.
	hitsBefore := cacheWatchHits(t, ctx, agent)
	viaAgent, direct := podClients(t, c, pod)
	const wlPath = "/api/v1/namespaces/" + wlNS + "/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	agentEnd := watchUntilEnd(t, ctx, viaAgent, wlPath)
	directEnd := watchUntilEnd(t, ctx, direct, wlPath)
	time.Sleep(time.Second) // both streams past their initial events
	for _, as := range c.APIServers() {
		c.StopAPIServer(as)
		if err := c.StartAPIServer(ctx, as); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.WaitReady(ctx); err != nil {
		t.Fatalf("agent not ready after the restart: %v", err)
	}
	// Then the direct watch-list ended. The one through the agent ends
	// only if the agent's own watch had to relist (the restarted
	// apiserver no longer had its resourceVersion), and then without an
	// ERROR event, as kube-apiserver ends its watchers when its cache
	// relists; if the agent's watch resumed on the other instance, it goes
	// on. Either way it saw its initial events first.
	var directEndAt streamEnd
	select {
	case directEndAt = <-directEnd:
	case <-time.After(time.Minute):
		t.Fatalf("the direct watch-list did not end when the apiservers restarted")
	}
	select {
	case end := <-agentEnd:
		figuref(t, "watch-list ends: through the agent %+v (the agent's watch relisted); direct %+v", end, directEndAt)
		if !end.bookmark {
			t.Errorf("the watch-list through the agent ended before its initial-events-end bookmark")
		}
		if end.errorEvent != "" {
			t.Errorf("the watch-list through the agent ended with an ERROR event %q", end.errorEvent)
		}
	case <-time.After(5 * time.Second):
		figuref(t, "watch-list ends: through the agent still open (the agent's watch resumed); direct %+v", directEndAt)
	}
	if !directEndAt.bookmark {
		t.Errorf("the direct watch-list ended before its initial-events-end bookmark")
	}
	churn(t, ctx, c, dc, "after", 90)
	figuref(t, "after the apiserver restarts, informers converged in %s", waitConverged(t, ctx, c, dc, wl, lw).Round(time.Millisecond))
	figuref(t, "watch-lists answered from the cache during the restarts: %v", cacheWatchHits(t, ctx, agent)-hitsBefore)
	for _, p := range []*informerProc{wl, lw} {
		if done := p.cmd.ProcessState; done != nil {
			t.Errorf("%s exited: %v", p.name, done)
		}
	}

	// When one of the two apiservers is stopped and stays down, then the
	// agent's watches resume on the other from their resourceVersions and
	// the informers converge, their watches unbroken.
	// The test's own writes and reads go to the other one meanwhile.
	faults := watchFaultCounts(t, ctx, agent)
	as0 := c.APIServers()[0]
	other := rest.CopyConfig(c.AdminConfig)
	other.Host = c.APIServers()[1].URL
	admin := c.Admin
	c.Admin = kubernetes.NewForConfigOrDie(other)
	c.StopAPIServer(as0)
	churn(t, ctx, c, dynamic.NewForConfigOrDie(other), "one-down", 120)
	took := waitConverged(t, ctx, c, dynamic.NewForConfigOrDie(other), wl, lw)
	c.Admin = admin
	d := watchFaultCounts(t, ctx, agent).minus(faults)
	figuref(t, "one of two apiservers down: informers converged in %s; agent relists %v, client watches ended: %v", took.Round(time.Millisecond), d.lists, d.ends)
	if err := c.StartAPIServer(ctx, as0); err != nil {
		t.Fatal(err)
	}

	// When etcd compacts past every watch's resourceVersion and both
	// apiservers restart, then the agent relists, the watches it serves
	// end (their clients watch again from before its new window, are
	// forwarded, get kube-apiserver's 410 Gone for the compacted revision
	// and relist from its cache), and the informers converge again.
	churn(t, ctx, c, dc, "before-compaction", 60)
	faults = watchFaultCounts(t, ctx, agent)
	list, err := c.Admin.CoreV1().Services(wlNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := strconv.ParseUint(list.ResourceVersion, 10, 64)
	if err := c.CompactEtcd(ctx, rev); err != nil {
		t.Fatal(err)
	}
	for _, as := range c.APIServers() {
		c.StopAPIServer(as)
	}
	for _, as := range c.APIServers() {
		if err := c.StartAPIServer(ctx, as); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.WaitReady(ctx); err != nil {
		t.Fatalf("agent not ready after the restart: %v", err)
	}
	churn(t, ctx, c, dc, "after-compaction", 120)
	took = waitConverged(t, ctx, c, dc, wl, lw)
	d = watchFaultCounts(t, ctx, agent).minus(faults)
	figuref(t, "etcd compacted at %d and both apiservers restarted: informers converged in %s; agent relists %v, client watches ended: %v, watches forwarded as older than the window %v",
		rev, took.Round(time.Millisecond), d.lists, d.ends, d.tooOld)
	if d.lists == 0 {
		t.Errorf("the agent did not relist after etcd compacted past its watches and both apiservers restarted")
	}
	for _, p := range []*informerProc{wl, lw} {
		if done := p.cmd.ProcessState; done != nil {
			t.Errorf("%s exited: %v", p.name, done)
		}
	}

	// When the CRD is deleted, then widget requests get kube-apiserver's
	// answer through the agent too, not a stale cached one.
	ac := apiextensionsclient.NewForConfigOrDie(c.AdminConfig)
	crdName := widgetsGVR.Resource + "." + widgetsGVR.Group
	if err := ac.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crdName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	path := "/apis/" + widgetsGVR.Group + "/v1/namespaces/" + wlNS + "/widgets?resourceVersion=0"
	var got, want rawResponse
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		want = direct.do(t, ctx, "GET", path, acceptJSON, uaDirect, nil)
		got = viaAgent.do(t, ctx, "GET", path, acceptJSON, uaOther, nil)
		return want.code == 404 && got.code == want.code && string(got.body) == string(want.body), nil
	})
	if err != nil {
		t.Errorf("after the CRD was deleted: through the agent %d %s, direct %d %s", got.code, got.body, want.code, want.body)
	}
}

// waitResourceSynced waits until the agent reports resource synced.
func waitResourceSynced(t *testing.T, ctx context.Context, a *sandbox.Agent, resource string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return readCacheMetrics(t, ctx, a).synced[resource] == 1, nil
	})
	if err != nil {
		t.Fatalf("%s not synced in the cache: %v", resource, err)
	}
}

// cacheWatchHits is how many watches the agent answered from its cache.
func cacheWatchHits(t *testing.T, ctx context.Context, a *sandbox.Agent) float64 {
	t.Helper()
	return sumWhere(scrapeAgent(t, ctx, a)["kube_apicache_cache_requests_total"], map[string]string{"verb": "watch", "outcome": "hit"})
}

// ageRE matches kubectl's human-readable ages, which move between two runs.
var ageRE = regexp.MustCompile(`\b[0-9]+[smhdy]([0-9]+[smh])?\b`)

// normalizeAges replaces ages and, since a longer age widens its column,
// collapses runs of spaces.
func normalizeAges(s string) string {
	return regexp.MustCompile(` +`).ReplaceAllString(ageRE.ReplaceAllString(s, "<age>"), " ")
}

// compareKubectl runs the same kubectl commands in pod through the agent
// and straight at kube-apiserver (same token and CA) and compares their
// output, ages aside.
func compareKubectl(t *testing.T, ctx context.Context, c *sandbox.Cluster, pod *sandbox.Pod) {
	t.Helper()
	direct := []string{"--server=" + c.APIServers()[0].URL, "--token=" + pod.Token,
		"--certificate-authority=" + sandbox.ServiceAccountDir + "/ca.crt"}
	onNode := "--field-selector=spec.nodeName=" + sandbox.NodeName
	var cmds [][]string
	same := 0
	for _, out := range []string{"", "-o=wide", "-o=json", "-o=yaml"} {
		cmds = append(cmds,
			[]string{"get", "pods", "-A", onNode, out},
			[]string{"get", "services", "-n", wlNS, out},
			[]string{"get", "widgets", "-n", wlNS, out},
			[]string{"get", "widgets", "-A", "--field-selector=spec.color=c1", out})
	}
	for _, args := range cmds {
		args = slicesWithout(args, "")
		viaAgent := mustKubectl(t, ctx, pod, args...)
		straight := mustKubectl(t, ctx, pod, append(direct, args...)...)
		if diff := cmp.Diff(normalizeAges(straight), normalizeAges(viaAgent)); diff == "" {
			same++
		} else {
			t.Errorf("kubectl %s: direct and through the agent differ (-direct +agent):\n%s", strings.Join(args, " "), diff)
		}
		if len(strings.TrimSpace(viaAgent)) == 0 {
			t.Errorf("kubectl %s printed nothing", strings.Join(args, " "))
		}
	}
	figuref(t, "kubectl printed the same through the agent as direct for %d of %d commands", same, len(cmds))
	// The widget Table has the CRD's printer columns.
	out := mustKubectl(t, ctx, pod, "get", "widgets", "-n", wlNS, "-o=wide")
	if first, _, _ := strings.Cut(out, "\n"); !strings.Contains(first, "COLOR") || !strings.Contains(first, "SIZE") {
		t.Errorf("widget table header %q lacks the printer columns", first)
	}
}

func slicesWithout(in []string, drop string) []string {
	var out []string
	for _, s := range in {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// metaCodecs decode meta.k8s.io/v1 PartialObjectMetadata(List) in any
// encoding.
var metaCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	metav1.AddMetaToScheme(s)
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	return serializer.NewCodecFactory(s)
}()

// compareMetadata asks for metadata-only gets and lists through the agent
// and direct, with the pod's token, in JSON and protobuf, and compares the
// answers (a list's own resourceVersion aside); the agent must answer them
// from its cache.
func compareMetadata(t *testing.T, ctx context.Context, c *sandbox.Cluster, agent *sandbox.Agent, pod *sandbox.Pod) {
	t.Helper()
	viaAgent, direct := podClients(t, c, pod)
	decode := func(r rawResponse) map[string]any {
		t.Helper()
		if r.code != 200 {
			t.Fatalf("answer %d: %s", r.code, r.body)
		}
		return decodeNormalized(t, metaCodecs.UniversalDeserializer(), r)
	}
	var somePod, someWidget string
	pods, err := c.Admin.CoreV1().Pods(wlNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no pod on the node: %v", err)
	}
	somePod = pods.Items[0].Name
	ws, err := dynamic.NewForConfigOrDie(c.AdminConfig).Resource(widgetsGVR).Namespace(wlNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(ws.Items) == 0 {
		t.Fatalf("no widget: %v", err)
	}
	someWidget = ws.Items[0].GetName()
	before := readCacheMetrics(t, ctx, agent).outcomes["hit"]
	n := 0
	for _, enc := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
		for _, tc := range []struct{ path, as string }{
			{"/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3D" + sandbox.NodeName, "PartialObjectMetadataList"},
			{"/api/v1/namespaces/" + wlNS + "/pods/" + somePod, "PartialObjectMetadata"},
			{"/api/v1/services?resourceVersion=0&labelSelector=n", "PartialObjectMetadataList"},
			{"/apis/" + widgetsGVR.Group + "/v1/widgets?resourceVersion=0&fieldSelector=spec.color%3Dc1", "PartialObjectMetadataList"},
			{"/apis/" + widgetsGVR.Group + "/v1/namespaces/" + wlNS + "/widgets/" + someWidget, "PartialObjectMetadata"},
		} {
			accept := enc + ";as=" + tc.as + ";g=meta.k8s.io;v=v1"
			got := decode(viaAgent.do(t, ctx, "GET", tc.path, accept, uaHit, nil))
			want := decode(direct.do(t, ctx, "GET", tc.path, accept, uaDirect, nil))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s as %s: direct and through the agent differ (-direct +agent):\n%s", tc.path, accept, diff)
			}
			n++
		}
	}
	hits := readCacheMetrics(t, ctx, agent).outcomes["hit"] - before
	figuref(t, "metadata-only: %d requests equal through the agent and direct; %v answered from the cache", n, hits)
	if hits < float64(n) {
		t.Errorf("only %v of %d metadata-only requests were answered from the cache", hits, n)
	}
}

// streamEnd is how a watch stream ended.
type streamEnd struct {
	events     int
	bookmark   bool   // the initial-events-end bookmark arrived
	errorEvent string // the reason of an ERROR event, if one came
	readErr    string // empty for a clean end of the stream
}

// watchUntilEnd opens a JSON watch with c and reports how it ended.
func watchUntilEnd(t *testing.T, ctx context.Context, c rawClient, path string) <-chan streamEnd {
	t.Helper()
	resp := c.startWatch(t, ctx, path)
	out := make(chan streamEnd, 1)
	go func() {
		defer resp.Body.Close()
		var end streamEnd
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 1<<16), 16<<20)
		for sc.Scan() {
			var ev struct {
				Type   string
				Object struct {
					Reason   string
					Metadata struct{ Annotations map[string]string }
				}
			}
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			end.events++
			switch ev.Type {
			case "BOOKMARK":
				if ev.Object.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					end.bookmark = true
				}
			case "ERROR":
				end.errorEvent = ev.Object.Reason
			}
		}
		if err := sc.Err(); err != nil {
			end.readErr = err.Error()
		}
		out <- end
	}()
	return out
}

// watchFaults are the agent's counts of what a broken watch costs: the
// lists of its informers, and the client watches it served that ended, by
// reason.
type watchFaults struct {
	lists float64
	ends  map[string]float64
	// tooOld counts the client watches forwarded as older than the
	// event window.
	tooOld float64
}

func watchFaultCounts(t *testing.T, ctx context.Context, a *sandbox.Agent) watchFaults {
	t.Helper()
	m := scrapeAgent(t, ctx, a)
	var lists float64
	for _, s := range m["kube_apicache_cache_lists"] {
		lists += s.value
	}
	tooOld := sumWhere(m["kube_apicache_cache_requests_total"], map[string]string{"verb": "watch", "outcome": "forwarded", "reason": "resource-version-too-old"})
	return watchFaults{lists: lists, ends: sumBy(m["kube_apicache_cache_watches_ended_total"], "reason"), tooOld: tooOld}
}

func (w watchFaults) minus(before watchFaults) watchFaults {
	out := watchFaults{lists: w.lists - before.lists, ends: map[string]float64{}, tooOld: w.tooOld - before.tooOld}
	for k, v := range w.ends {
		if d := v - before.ends[k]; d != 0 {
			out.ends[k] = d
		}
	}
	return out
}

// startWatch opens a JSON watch of path with c, without a client timeout,
// and fails t unless it is answered 200.
func (c rawClient) startWatch(t *testing.T, ctx context.Context, path string) *http.Response {
	t.Helper()
	hc := *c.hc
	hc.Timeout = 0
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("watch %s: %d", path, resp.StatusCode)
	}
	return resp
}
