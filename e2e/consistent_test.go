package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const consistentNS = "e2e-consistent"

// consistentRead is one shape of consistent read the cross-client test
// makes after each write.
type consistentRead struct {
	name string
	// write changes the object (directly at kube-apiserver) and returns
	// the label value and resourceVersion written.
	write func(ctx context.Context, step int) (string, error)
	// path is read through the agent with resourceVersion unset.
	path string
	// object is the written object's namespace/name, found in a list.
	object string
}

// TestConsistentReadsAcrossClients: a write made by another client
// (directly at kube-apiserver, as another node's would be) is seen by the
// next consistent read a pod makes through the agent. With
// --cache-consistent-reads=probe (the default) not one of 1,000 reads of
// each shape is stale, and most are answered by the cache; with
// local-writes the stale reads it allows are counted and reported.
func TestConsistentReadsAcrossClients(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	reader, _ := setUpCacheScenario(t, ctx, c)
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: consistentNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "watched", Namespace: consistentNS},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := c.Admin.CoreV1().Services(consistentNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "watched", Namespace: consistentNS},
		Spec: corev1.PodSpec{NodeName: sandbox.NodeName, Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest"}}}}
	if _, err := c.Admin.CoreV1().Pods(consistentNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	patch := func(step int) []byte {
		return fmt.Appendf(nil, `{"metadata":{"labels":{"step":"%d"}}}`, step)
	}
	patchService := func(ctx context.Context, step int) (string, error) {
		s, err := c.Admin.CoreV1().Services(consistentNS).Patch(ctx, "watched", types.MergePatchType, patch(step), metav1.PatchOptions{})
		if err != nil {
			return "", err
		}
		return s.ResourceVersion, nil
	}
	patchPod := func(ctx context.Context, step int) (string, error) {
		p, err := c.Admin.CoreV1().Pods(consistentNS).Patch(ctx, "watched", types.MergePatchType, patch(step), metav1.PatchOptions{})
		if err != nil {
			return "", err
		}
		return p.ResourceVersion, nil
	}
	reads := []consistentRead{
		{name: "get service", write: patchService, path: "/api/v1/namespaces/" + consistentNS + "/services/watched"},
		{name: "list node pods", write: patchPod, object: consistentNS + "/watched",
			path: "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName)},
		{name: "list services", write: patchService, object: consistentNS + "/watched", path: "/api/v1/services"},
	}
	const iterations = 1000
	step := 0
	run := func(t *testing.T, mode string) map[string]int {
		// One pod reads 1,000 times in a row, each read after a write:
		// one probe per read, each no larger than its read (small
		// scopes, or the whole scope listed), so within the default
		// probe budget.
		agent := startAgent(t, ctx, c, "--cache-consistent-reads="+mode)
		waitCacheSynced(t, ctx, agent)
		viaAgent, _ := podClients(t, c, reader)
		stale := map[string]int{}
		for _, r := range reads {
			before := readCacheMetrics(t, ctx, agent)
			for range iterations {
				step++
				rv, err := r.write(ctx, step)
				if err != nil {
					t.Fatalf("%s: write %d: %v", r.name, step, err)
				}
				// The writer's call returned: the reader is told to read.
				got := viaAgent.do(t, ctx, http.MethodGet, r.path, acceptJSON, uaOther, nil)
				if got.code != http.StatusOK {
					t.Fatalf("%s: read: %d %s", r.name, got.code, got.body)
				}
				seenStep, seenRV := readStep(t, got.body, r.object)
				if seenStep != fmt.Sprint(step) {
					stale[r.name]++
					if mode == "probe" && stale[r.name] <= 5 {
						t.Errorf("%s: read step %q at RV %s after another client wrote step %d at RV %s", r.name, seenStep, seenRV, step, rv)
					}
				}
			}
			after := readCacheMetrics(t, ctx, agent)
			hits := after.outcomes["hit"] - before.outcomes["hit"]
			figuref(t, "%s, %s: %d reads right after another client's write, %d stale; %v answered by the cache, forwarded by reason %v",
				mode, r.name, iterations, stale[r.name], hits, diffOutcomes(before.outcomes, after.outcomes))
			if mode == "probe" && hits < iterations/4 {
				t.Errorf("%s: only %v of %d reads answered by the cache", r.name, hits, iterations)
			}
		}
		samples := scrapeAgent(t, ctx, agent)
		figuref(t, "%s: consistent-read probes by resource: %v", mode, sumBy(samples["kube_apicache_cache_consistent_probes_total"], "resource"))
		return stale
	}
	t.Run("probe", func(t *testing.T) {
		stale := run(t, "probe")
		for _, r := range reads {
			if stale[r.name] != 0 {
				t.Errorf("%s: %d stale reads of %d, want 0", r.name, stale[r.name], iterations)
			}
		}
	})
	t.Run("local-writes", func(t *testing.T) {
		stale := run(t, "local-writes")
		total := 0
		for _, n := range stale {
			total += n
		}
		figuref(t, "local-writes: %d stale reads of %d (%.1f%%): the writes were not this agent's", total, iterations*len(reads), 100*float64(total)/float64(iterations*len(reads)))
	})
}

// readStep returns the "step" label and resourceVersion of the object in
// body: the object itself, or the item named object (namespace/name) of a
// list.
func readStep(t *testing.T, body []byte, object string) (step, rv string) {
	t.Helper()
	if object == "" {
		var m metav1.PartialObjectMetadata
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return m.Labels["step"], m.ResourceVersion
	}
	var l struct {
		Items []metav1.PartialObjectMetadata `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	for _, it := range l.Items {
		if it.Namespace+"/"+it.Name == object {
			return it.Labels["step"], it.ResourceVersion
		}
	}
	t.Fatalf("%s not in the list", object)
	return "", ""
}
