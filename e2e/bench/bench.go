package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const benchNS = "bench"

type bench struct {
	o      options
	c      *sandbox.Cluster
	client *sandbox.Pod
	agent  *sandbox.Agent
	// firstNodePod is a pod on the agent's node, for the get case.
	firstNodePod string
	// podclient is the in-pod client program, for the storm case.
	podclient string
	// dir is the run's temporary directory, for the files cases write
	// (the rewrite idle case's profile).
	dir string
}

// probeBudgetOff are the flags, beyond --profiling, the bench starts its
// agent with. The probe budget is off: the consistent-read case measures
// what a probe round saves at 1 to 64 readers in flight from one source,
// hundreds of rounds a second, past the default budget's 100 rounds a
// second for one source (docs/operations/capacity.md, "Control-plane cost
// per node").
var probeBudgetOff = []string{"--probe-objects-per-second=-1", "--probe-objects-per-second-per-source=-1",
	"--probes-per-second=-1", "--probes-per-second-per-source=-1"}

// result is one case measured along one path.
type result struct {
	p50, p99    time.Duration
	errors      int
	apiserverS  float64 // kube-apiserver CPU-seconds
	agentS      float64 // agent CPU-seconds
	upstream    int     // requests kube-apiserver received from the client or the agent
	requests    int
	upstreamDet string
	// samples are the measured latencies, sorted.
	samples []time.Duration
}

type benchCase struct {
	name string
	path string
	// inflight overrides -inflight when positive.
	inflight int
}

func (b *bench) run(ctx context.Context, agentBin string) error {
	c := b.c
	// Given a client pod allowed to read pods and services cluster-wide,
	var err error
	if b.client, err = c.NewPod(ctx, sandbox.PodSpec{Name: "bench-client", Namespace: benchNS, ServiceAccount: "bench-client"}); err != nil {
		return err
	}
	// The client pod may get and list pods and services everywhere.
	if err := b.grantPodsAndServices(ctx, "bench-reader", "get", "list"); err != nil {
		return err
	}
	// and the agent, its cache synced,
	pod, certFile, keyFile, err := c.NewAgentPod(ctx, "kube-apicache-bench")
	if err != nil {
		return err
	}
	logf("starting the agent")
	// --profiling lets the bench read the agent's live heap after a
	// forced collection (and take CPU profiles with -agent-profile).
	extra := append([]string{"--profiling"}, probeBudgetOff...)
	if b.agent, err = c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, extra...)...); err != nil {
		return err
	}
	b.agent.CertFile, b.agent.KeyFile = certFile, keyFile
	defer b.agent.Process.Stop(40 * time.Second)
	if err := b.waitCached(ctx, "pods", -1); err != nil {
		return err
	}
	existing, err := b.podsOnNode(ctx)
	if err != nil {
		return err
	}
	heapBefore, err := b.agentHeap(ctx)
	if err != nil {
		return err
	}

	// when the cluster holds the pods and services,
	onNode := b.o.nodePods - existing
	if onNode < 0 {
		onNode = 0
	}
	start := time.Now()
	if err := b.createPods(ctx, onNode, b.o.pods-existing-onNode); err != nil {
		return err
	}
	logf("created %d pods (%d on %s) in %v", b.o.pods-existing, onNode, sandbox.NodeName, time.Since(start).Round(time.Millisecond))
	if err := b.waitCached(ctx, "pods", b.o.nodePods); err != nil {
		return err
	}
	heapAfter, err := b.agentHeap(ctx)
	if err != nil {
		return err
	}
	start = time.Now()
	if err := b.createServices(ctx, b.o.services); err != nil {
		return err
	}
	logf("created %d services in %v", b.o.services, time.Since(start).Round(time.Millisecond))
	if err := b.waitCached(ctx, "services", b.o.services); err != nil {
		return err
	}

	// and the agent left idle before any pod reads through it,
	idle, err := b.idle(ctx, agentBin)
	if err != nil {
		return err
	}

	// then measure every case along both paths,
	nodeSel := "fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName)
	cases := []benchCase{
		{name: "list node pods, RV=0", path: "/api/v1/pods?" + nodeSel + "&resourceVersion=0"},
		{name: "list node pods, RV=\"\"", path: "/api/v1/pods?" + nodeSel},
		{name: "get pod, RV=0", path: "/api/v1/namespaces/" + benchNS + "/pods/" + b.firstNodePod + "?resourceVersion=0"},
		{name: "get pod, RV=\"\"", path: "/api/v1/namespaces/" + benchNS + "/pods/" + b.firstNodePod},
		{name: "list services, RV=0", path: "/api/v1/services?resourceVersion=0"},
		{name: "list services, RV=\"\"", path: "/api/v1/services"},
	}
	m, err := newMeasurer(b)
	if err != nil {
		return err
	}
	rep, ch := newReport(b.o), &charts{}
	type row struct {
		c             benchCase
		agent, direct result
	}
	var rows []row
	measureStart := time.Now()
	for _, bc := range cases {
		if !b.o.cases.MatchString(bc.name) {
			continue
		}
		agentRes, err := m.measure(ctx, bc, true)
		if err != nil {
			return err
		}
		if b.o.profileDir != "" {
			if err := m.profileAgent(ctx, bc.name, 1, m.requester(bc, true)); err != nil {
				return err
			}
		}
		directRes, err := m.measure(ctx, bc, false)
		if err != nil {
			return err
		}
		logf("%s: agent p50 %v, direct p50 %v", bc.name, agentRes.p50, directRes.p50)
		rows = append(rows, row{bc, agentRes, directRes})
		rep.Reads = append(rep.Reads, readOf(bc.name, agentRes, directRes))
		ch.cdf(bc.name, map[string][]time.Duration{"agent": agentRes.samples, "direct": directRes.samples})
	}

	// Over the whole run (warm-ups, every case, longer than the decision
	// TTL), how many reviews the agent sent per decision it needed.
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return err
	}
	var reviews, reads float64
	for k, v := range scrape(text, "kube_apicache_access_reviews_total", "kube_apicache_access_lookups_total") {
		switch {
		case strings.HasPrefix(k, "kube_apicache_access_reviews_total"):
			reviews += v
		case k == `kube_apicache_access_lookups_total{review="token"}`:
			reads += v // one token lookup per reviewed request
		}
	}
	reviewSummary := fmt.Sprintf("agent's TokenReviews+SubjectAccessReviews over the whole run (%v, warm-ups included): %.0f for %.0f reviewed reads, %.2f per 1,000 reads",
		time.Since(measureStart).Round(time.Second), reviews, reads, perK(reviews, int(reads)))
	if len(rows) > 0 {
		rep.Reviews = reviewSummary
	}

	// and the heap per pod of the agent's cache and of a typed informer.
	// and an informer start-up storm along both paths,
	var stormAgent, stormDirect stormResult
	if b.o.storm > 0 {
		logf("starting %d informer processes at once, through the agent and direct", b.o.storm)
		if stormAgent, stormDirect, err = b.storm(ctx, m, b.o.storm); err != nil {
			return err
		}
		rep.Storm = &stormJSON{Informers: b.o.storm, Agent: stormPathOf(stormAgent), Direct: stormPathOf(stormDirect), Target: stormCPUTarget}
		if stormDirect.apiserverS > 0 {
			rep.Storm.CPURatio = stormAgent.apiserverS / stormDirect.apiserverS
		}
		ch.storm = map[string][]time.Duration{"agent": stormAgent.syncs, "direct": stormDirect.syncs}
	}

	// and the watch cases: steady churn under many informers, event
	// latency, and the agent's heap per watcher,
	// and consistent reads at several readers in flight,
	consistent, err := b.consistentReads(ctx, m)
	if err != nil {
		return err
	}
	for _, r := range consistent {
		rep.Consistent = append(rep.Consistent, consistentJSON{
			readJSON: readOf(fmt.Sprintf("%s, %d in flight", consistentCase, r.inflight), r.agent, r.direct),
			Inflight: r.inflight, ProbesPerK: perK(r.probes, r.agent.requests),
		})
		ch.cdf(fmt.Sprintf("%s, %d in flight", consistentCase, r.inflight), map[string][]time.Duration{"agent": r.agent.samples, "direct": r.direct.samples})
	}

	watches, err := b.watchCases(ctx, m)
	if err != nil {
		return err
	}
	watches.report(rep)

	// and forwarded writes, and how stale reads and informers through
	// the agent are after a write made elsewhere,
	writes, err := b.writes(ctx, m)
	if err != nil {
		return fmt.Errorf("%s: %w", writesCase, err)
	}
	writes.report(rep, ch)
	staleness, err := b.staleness(ctx, m, watches.latency)
	if err != nil {
		return fmt.Errorf("%s: %w", stalenessCase, err)
	}
	staleness.report(rep, ch)

	heap, err := measureHeap(ctx, b)
	if err != nil {
		return err
	}
	agentPerPod := 0.0
	if onNode > 0 {
		agentPerPod = float64(int64(heapAfter)-int64(heapBefore)) / float64(onNode)
	}
	rep.Heap = &heapJSON{AgentSynced: heap.coldPerPod, AgentWarm: heap.warmPerPod, Informer: heap.informerPerPod, AgentProcess: agentPerPod,
		CachedPods: heap.pods, ProcessPodsOn: onNode}
	if heap.informerPerPod > 0 {
		rep.Heap.RatioSynced, rep.Heap.RatioWarm = heap.coldPerPod/heap.informerPerPod, heap.warmPerPod/heap.informerPerPod
	}

	fmt.Fprintf(os.Stdout, "\nkube-apicache bench: %d pods (%d on %s), %d services; %d requests per case and path, %d in flight, Accept %q\n\n",
		b.o.pods, b.o.nodePods, sandbox.NodeName, b.o.services, b.o.requests, b.o.inflight, b.o.accept)
	if len(rows) > 0 {
		out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(out, "case\tp50 agent\tp50 direct\tp50 ratio\tp99 agent\tp99 direct\tp99 ratio\tapiserver CPU-s/1k agent\tdirect\tagent CPU-s/1k\tupstream/1k agent\tdirect\terrors\t")
		for _, r := range rows {
			fmt.Fprintf(out, "%s\t%v\t%v\t%.3f\t%v\t%v\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%d/%d\t\n", r.c.name,
				r.agent.p50, r.direct.p50, ratio(r.agent.p50, r.direct.p50),
				r.agent.p99, r.direct.p99, ratio(r.agent.p99, r.direct.p99),
				perK(r.agent.apiserverS, r.agent.requests), perK(r.direct.apiserverS, r.direct.requests),
				perK(r.agent.agentS, r.agent.requests),
				perK(float64(r.agent.upstream), r.agent.requests), perK(float64(r.direct.upstream), r.direct.requests),
				r.agent.errors, r.direct.errors)
		}
		_ = out.Flush()
		fmt.Println()
		for _, r := range rows {
			if r.agent.upstreamDet != "" {
				fmt.Printf("upstream requests during %q through the agent: %s\n", r.c.name, r.agent.upstreamDet)
			}
		}
		fmt.Println(reviewSummary)
		fmt.Println()
	}
	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "heap per cached pod\tbytes\tpods\thow\t")
	fmt.Fprintf(out, "agent cache, synced (in-process, %d copies)\t%.0f\t%d\tHeapAlloc after GC, before/after sync\t\n", b.o.copies, heap.coldPerPod, heap.pods)
	fmt.Fprintf(out, "agent cache, after a JSON and a protobuf list (in-process, %d copies)\t%.0f\t%d\tHeapAlloc after GC, before/after sync and lists\t\n", b.o.copies, heap.warmPerPod, heap.pods)
	fmt.Fprintf(out, "typed informer (in-process, %d copies)\t%.0f\t%d\tHeapAlloc after GC, before/after sync\t\n", b.o.copies, heap.informerPerPod, heap.pods)
	fmt.Fprintf(out, "agent process (whole cache, synced)\t%.0f\t%d\tlive heap after a forced GC, before/after the pods\t\n", agentPerPod, onNode)
	_ = out.Flush()
	fmt.Printf("\nheap ratio agent cache/typed informer: %.3f synced, %.3f holding both encodings\n", heap.coldPerPod/heap.informerPerPod, heap.warmPerPod/heap.informerPerPod)
	if b.o.storm > 0 {
		printStorm(b.o.storm, stormAgent, stormDirect)
	}
	printConsistent(consistent)
	watches.print()
	if writes != nil {
		writes.print()
	}
	if staleness != nil {
		staleness.print()
	}
	idle.print()
	idle.report(rep)
	sizing, err := b.sizing(ctx)
	if err != nil {
		return err
	}
	sizing.print()
	sizing.report(rep)
	// and the agent's start to ready, as it replaces the agent (and
	// leaves it as it was).
	cold, err := b.coldStart(ctx, agentBin)
	if err != nil {
		return err
	}
	printColdStart(cold)
	for _, v := range cold {
		rep.ColdStart = append(rep.ColdStart, coldStartJSON{
			Variant: v.name, ReadyMs: msAll(v.ready), InterceptingMs: msAll(v.intercepting),
			ReadyMedianMs: msOf(v.median(v.ready)), ReadyMaxMs: msOf(v.ready[len(v.ready)-1]),
			InterceptMed: msOf(v.median(v.intercepting)), InterceptMax: msOf(v.intercepting[len(v.intercepting)-1]),
			TargetMs: msOf(coldStartTarget), CSRsIssued: v.csrs,
		})
	}
	// and what rewrite profiles cost the callers they do not select, as
	// it replaces the agent between blocks (and leaves it as the bench
	// started it). It runs after every case that reads through the
	// bench's agent, and before the rule sync, which leaves kube-proxy's
	// rules for 10,000 Services in the node's nat table.
	rewrite, err := b.rewriteIdle(ctx, m, agentBin)
	if err != nil {
		// What was measured before is kept.
		if werr := ch.write(benchplot.Dir(*outDir), rep); werr != nil {
			logf("%v", werr)
		}
		return fmt.Errorf("%s: %w", rewriteIdleCase, err)
	}
	if rewrite != nil {
		rewrite.print()
		rewrite.report(rep, ch)
	}
	// Last, as it replaces the agent: the rule sync on a large nat table.
	if b.o.natServices > 0 && b.o.cases.MatchString("nat sync") {
		empty, full, dump, err := b.natSyncCost(ctx, agentBin, b.o.natServices, b.o.natEndpoints, b.o.natWindow)
		if err != nil {
			// What was measured before is kept.
			if werr := ch.write(benchplot.Dir(*outDir), rep); werr != nil {
				logf("%v", werr)
			}
			return fmt.Errorf("nat sync: %w", err)
		}
		printNATSync(empty, full, dump)
		rep.NATSync = &natSyncJSON{Empty: natSyncOf(empty), Full: natSyncOf(full)}
	}
	return ch.write(benchplot.Dir(*outDir), rep)
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func perK(v float64, n int) float64 {
	if n == 0 {
		return 0
	}
	return v * 1000 / float64(n)
}

// grantPodsAndServices binds the ClusterRole name, which allows verbs on
// pods and services in every namespace, to the client pod's ServiceAccount
// (objects that already exist are kept), and waits until RBAC allows the
// last of verbs on pods.
func (b *bench) grantPodsAndServices(ctx context.Context, name string, verbs ...string) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: verbs}},
	}
	if _, err := b.c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: b.client.Spec.ServiceAccount, Namespace: benchNS}},
	}
	if _, err := b.c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return b.client.WaitAllowed(ctx, verbs[len(verbs)-1], "pods")
}

// podsOnNode counts the pods already bound to the agent's node (the
// sandbox's own: the agent and the client).
func (b *bench) podsOnNode(ctx context.Context) (int, error) {
	list, err := b.c.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
	if err != nil {
		return 0, err
	}
	return len(list.Items), nil
}

// waitCached waits until the agent reports resource synced with at least
// want objects (any number if want < 0).
func (b *bench) waitCached(ctx context.Context, resource string, want int) error {
	var last map[string]float64
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		text, err := b.agent.Metrics(ctx)
		if err != nil {
			return false, nil
		}
		last = scrape(text, "kube_apicache_cache_synced", "kube_apicache_cache_objects")
		return last[`kube_apicache_cache_synced{resource="`+resource+`"}`] == 1 &&
			(want < 0 || last[`kube_apicache_cache_objects{resource="`+resource+`"}`] >= float64(want)), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the agent to cache %s (%d): %w (last: %v)", resource, want, err, last)
	}
	return nil
}

// agentHeap returns the agent's live heap: its heap after a garbage
// collection, which fetching a heap profile with gc=1 forces (the agent runs
// with --profiling), read from its metrics right after. The least of a few
// samples is kept.
func (b *bench) agentHeap(ctx context.Context) (uint64, error) {
	return b.agentMemStat(ctx, "go_memstats_heap_alloc_bytes")
}

// agentMemStat is agentHeap for another of the agent's go_memstats
// gauges, e.g. go_memstats_heap_inuse_bytes.
func (b *bench) agentMemStat(ctx context.Context, name string) (uint64, error) {
	var least uint64
	for i := range 3 {
		code, _, err := b.c.AgentGet(ctx, b.c.Node, sandbox.AgentMetricsAddr, "/debug/pprof/heap?gc=1", true, time.Minute)
		if err != nil {
			return 0, err
		}
		if code != http.StatusOK {
			return 0, fmt.Errorf("agent heap profile: HTTP %d", code)
		}
		text, err := b.agent.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		v := uint64(scrape(text, name)[name])
		if i == 0 || v < least {
			least = v
		}
	}
	return least, nil
}

// scrape returns the samples of the named metric families from Prometheus
// text, keyed by the sample's name and labels as written.
func scrape(text string, names ...string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		for _, n := range names {
			if !strings.HasPrefix(line, n) {
				continue
			}
			key, val, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			var f float64
			if _, err := fmt.Sscan(val, &f); err == nil {
				out[key] = f
			}
		}
	}
	return out
}

// benchPod is a pod object as a controller would create it: labels, one
// container with ports, resources and environment. It tolerates every taint
// so nothing evicts it from its (agent-less) node.
func benchPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"app": "bench", "shard": name[len(name)-1:], "app.kubernetes.io/part-of": "kube-apicache-bench"},
		},
		Spec: corev1.PodSpec{
			NodeName:    node,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.invalid/bench/app:1.0",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Env:   []corev1.EnvVar{{Name: "MODE", Value: "bench"}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resourceQuantity("10m"), corev1.ResourceMemory: resourceQuantity("16Mi"),
				}},
			}},
		},
	}
}
