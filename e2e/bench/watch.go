package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The watch cases measure the agent serving every watch of a cached scope
// from its event window (cache/history.go, cache/watch.go), one upstream
// watch per resource for every client watch on the node:
//
//   - "watch churn": informer processes on the node hold their watches
//     while pods on the node and services change at a steady rate; what
//     that costs kube-apiserver (CPU-seconds, bytes sent) through the
//     agent against the same informers straight at kube-apiserver, and
//     against the same churn with no informers at all.
//   - "watch event latency": from a write by the bench's admin until a
//     watch in the node's pod sees it, through the agent and directly,
//     both watches open at once so that every write is timed on both.
//   - "watch memory": the agent's heap with one watcher of the node's
//     pods against many.
var (
	watchInformers = flag.Int("watch-informers", 50, "informer processes of the \""+churnCase+"\" case (0 skips it)")
	churnTime      = flag.Duration("watch-churn-time", time.Minute, "how long the \""+churnCase+"\" case changes pods and services, per path")
	churnRate      = flag.Int("watch-churn-rate", 20, "pod updates a second (pods on the agent's node) and service updates a second of the \""+churnCase+"\" case")
	latencyN       = flag.Int("watch-latency-samples", 300, "writes the \""+latencyCase+"\" case times along both paths (0 skips it)")
	memoryWatchers = flag.Int("watch-memory-watchers", 50, "watchers of the node's pods the \""+memoryCase+"\" case compares with one (0 skips it)")
)

const (
	churnCase   = "watch churn"
	latencyCase = "watch event latency"
	memoryCase  = "watch memory"

	// churnTarget is the most kube-apiserver CPU-seconds, and bytes sent,
	// the churn may cost through the agent as a fraction of direct.
	churnTarget = 0.05
	// The most a watch through the agent may add to an event's latency.
	latencyP50Target = 2 * time.Millisecond
	latencyP99Target = 10 * time.Millisecond
	// memoryTarget is the most many watchers may add to the agent's heap
	// (over its heap with none), less watcherAllowance per watcher, as a
	// multiple of what one watcher adds, less one allowance.
	memoryTarget = 1.2
	// watcherAllowance is what each served watch holds by design
	// (cache/watch.go): its writer's 32 KiB bufio buffer and a batch of
	// watchBatch (64) event pointers.
	watcherAllowance = 32<<10 + 64*8

	churnAnnotation   = "bench.kube-apicache.io/churn"
	latencyAnnotation = "bench.kube-apicache.io/latency"
)

// watchResults are the watch cases' results; nil for a case not run.
type watchResults struct {
	churn   *churnResult
	latency *latencyResult
	memory  *memoryResult
}

// watchCases runs the selected watch cases.
func (b *bench) watchCases(ctx context.Context, m *measurer) (*watchResults, error) {
	run := func(name string, n int) bool { return n > 0 && b.o.cases.MatchString(name) }
	var r watchResults
	if !run(churnCase, *watchInformers) && !run(latencyCase, *latencyN) && !run(memoryCase, *memoryWatchers) {
		return &r, nil
	}
	// The bench client may watch pods and services.
	if err := b.grantPodsAndServices(ctx, "bench-informers", "get", "list", "watch"); err != nil {
		return nil, err
	}
	var err error
	if run(churnCase, *watchInformers) {
		if *churnRate <= 0 || *churnTime <= 0 {
			return nil, fmt.Errorf("-watch-churn-rate and -watch-churn-time must be positive")
		}
		logf("%s: %d informer processes, %d pod and %d service updates a second for %v, with no informers, through the agent and direct",
			churnCase, *watchInformers, *churnRate, *churnRate, *churnTime)
		if r.churn, err = b.watchChurn(ctx, m, *watchInformers, *churnTime, *churnRate); err != nil {
			return nil, fmt.Errorf("%s: %w", churnCase, err)
		}
	}
	if run(latencyCase, *latencyN) {
		logf("%s: %d writes, each seen through the agent and direct", latencyCase, *latencyN)
		if r.latency, err = b.watchLatency(ctx, m, *latencyN); err != nil {
			return nil, fmt.Errorf("%s: %w", latencyCase, err)
		}
	}
	if run(memoryCase, *memoryWatchers) {
		if *memoryWatchers < 2 {
			return nil, fmt.Errorf("-watch-memory-watchers must be at least 2")
		}
		logf("%s: the agent's heap with 1 and %d watchers of the node's pods", memoryCase, *memoryWatchers)
		if r.memory, err = b.watchMemory(ctx, m, *memoryWatchers); err != nil {
			return nil, fmt.Errorf("%s: %w", memoryCase, err)
		}
	}
	return &r, nil
}

// churnWindow is one churn window: what kube-apiserver and the agent
// spent while the pods and services changed.
type churnWindow struct {
	took                 time.Duration
	podWrites, svcWrites int
	apiserverS, agentS   float64 // CPU-seconds
	bytes                float64 // kube-apiserver's responses and watch events
	// synced is when the last informer process had synced, failed how
	// many did not.
	synced time.Duration
	failed int
	// outcomes are the agent's cache outcomes of watches when the
	// informers started; served what it did for client watches during
	// the window: events sent by resource, and watches ended by
	// resource and reason.
	outcomes map[string]float64
	served   map[string]float64
	// lateEvents are events the agent sent to client watches after the
	// window (its second after the last write), until they stopped for a
	// second or for up to half a minute.
	lateEvents float64
}

// churnResult is the churn with no informers (the churn's own cost: the
// writes, the agent's and kube-controller-manager's watches), with n
// informer processes through the agent, and with them direct.
type churnResult struct {
	n, rate        int
	none, agent    churnWindow
	direct         churnWindow
	podN, serviceN int
}

// watchChurn measures the churn three times: with no informers, with n
// informer processes through the agent, and with n direct.
func (b *bench) watchChurn(ctx context.Context, m *measurer, n int, d time.Duration, rate int) (*churnResult, error) {
	cs, err := b.fastAdmin()
	if err != nil {
		return nil, err
	}
	podList, err := cs.CoreV1().Pods(benchNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
	if err != nil {
		return nil, err
	}
	svcList, err := cs.CoreV1().Services(benchNS).List(ctx, metav1.ListOptions{LabelSelector: "app=bench"})
	if err != nil {
		return nil, err
	}
	var pods, svcs []string
	for _, p := range podList.Items {
		pods = append(pods, p.Name)
	}
	for _, s := range svcList.Items {
		svcs = append(svcs, s.Name)
	}
	if len(pods) == 0 || len(svcs) == 0 {
		return nil, fmt.Errorf("no pods on %s or no services in %s to change", sandbox.NodeName, benchNS)
	}
	env, err := b.directEnv()
	if err != nil {
		return nil, err
	}
	r := &churnResult{n: n, rate: rate, podN: len(pods), serviceN: len(svcs)}
	window := func(procs int, env []string) (churnWindow, error) {
		return b.churnWindow(ctx, m, procs, env, func(ctx context.Context) (int, int, error) {
			return churn(ctx, cs, pods, svcs, d, rate)
		})
	}
	if r.none, err = window(0, nil); err != nil {
		return nil, err
	}
	if r.agent, err = window(n, nil); err != nil {
		return nil, err
	}
	if r.direct, err = window(n, env); err != nil {
		return nil, err
	}
	return r, nil
}

// churnWindow starts n informer processes (none if n is 0) with env,
// waits until they have synced, and measures what kube-apiserver and the
// agent spend while run changes pods and services.
func (b *bench) churnWindow(ctx context.Context, m *measurer, n int, env []string, run func(context.Context) (int, int, error)) (churnWindow, error) {
	var w churnWindow
	before, err := b.watchOutcomes(ctx)
	if err != nil {
		return w, err
	}
	if n > 0 {
		procs, err := b.startInformers(ctx, n, *churnTime+3*time.Minute, env)
		if err != nil {
			return w, err
		}
		defer procs.stop()
		if w.synced, w.failed = procs.wait(); w.failed == n {
			return w, fmt.Errorf("no informer process synced")
		}
	}
	// Let the start-up work settle: the window measures steady watches.
	time.Sleep(2 * time.Second)
	after, err := b.watchOutcomes(ctx)
	if err != nil {
		return w, err
	}
	w.outcomes = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			w.outcomes[k] = d
		}
	}
	served0, err := b.watchesServed(ctx)
	if err != nil {
		return w, err
	}
	bytes0, err := b.apiserverBytes(ctx)
	if err != nil {
		return w, err
	}
	cpu0, agent0 := m.cpu(m.apiserverPIDs...), m.cpu(m.agentPID)
	start := time.Now()
	if w.podWrites, w.svcWrites, err = run(ctx); err != nil {
		return w, err
	}
	w.took = time.Since(start)
	time.Sleep(time.Second) // let the last events reach the watchers
	w.apiserverS = m.cpu(m.apiserverPIDs...) - cpu0
	w.agentS = m.cpu(m.agentPID) - agent0
	bytes1, err := b.apiserverBytes(ctx)
	if err != nil {
		return w, err
	}
	w.bytes = bytes1 - bytes0
	served1, err := b.watchesServed(ctx)
	if err != nil {
		return w, err
	}
	w.served = map[string]float64{}
	for k, v := range served1 {
		if d := v - served0[k]; d > 0 {
			w.served[k] = d
		}
	}
	sent := func(m map[string]float64) float64 {
		var sum float64
		for k, v := range m {
			if strings.HasPrefix(k, "events ") {
				sum += v
			}
		}
		return sum
	}
	last := sent(served1)
	for range 30 {
		time.Sleep(time.Second)
		served2, err := b.watchesServed(ctx)
		if err != nil {
			return w, err
		}
		if sent(served2) == last {
			break
		}
		w.lateEvents += sent(served2) - last
		last = sent(served2)
	}
	return w, nil
}

// churn changes pods and services, rate of each a second for d, one
// annotation by merge patch, in turn; it returns how many of each it
// changed. Writes that fall behind are not made up: the loops end after
// rate×d writes each, or d plus half a minute.
func churn(ctx context.Context, cs kubernetes.Interface, pods, svcs []string, d time.Duration, rate int) (int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	n := int(d.Seconds() * float64(rate))
	// Each call's values are its own: a patch that repeated a value an
	// earlier window left would change nothing and make no event.
	nonce := time.Now().UnixNano()
	patch := func(i int) []byte {
		return fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"%d-%d"}}}`, churnAnnotation, nonce, i)
	}
	var podN, svcN int
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		podN, err = paced(ctx, n, rate, func(ctx context.Context, i int) error {
			_, err := cs.CoreV1().Pods(benchNS).Patch(ctx, pods[i%len(pods)], types.MergePatchType, patch(i), metav1.PatchOptions{})
			return err
		})
		return err
	})
	g.Go(func() (err error) {
		svcN, err = paced(ctx, n, rate, func(ctx context.Context, i int) error {
			_, err := cs.CoreV1().Services(benchNS).Patch(ctx, svcs[i%len(svcs)], types.MergePatchType, patch(i), metav1.PatchOptions{})
			return err
		})
		return err
	})
	err := g.Wait()
	return podN, svcN, err
}

// paced calls fn for 0..n-1 at most rate times a second, and returns how
// many calls succeeded.
func paced(ctx context.Context, n, rate int, fn func(context.Context, int) error) (int, error) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		select {
		case <-ctx.Done():
			return i, ctx.Err()
		case <-tick.C:
		}
		if err := fn(ctx, i); err != nil {
			return i, err
		}
	}
	return n, nil
}

// watchesServed reads what the agent did for client watches: the events
// it sent, as "events <resource>", and the watches that ended, as "ended
// <resource> <reason>".
func (b *bench) watchesServed(ctx context.Context) (map[string]float64, error) {
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for k, v := range scrape(text, "kube_apicache_cache_watch_events_total", "kube_apicache_cache_watches_ended_total") {
		if strings.HasPrefix(k, "kube_apicache_cache_watch_events_total") {
			out["events "+labelValue(k, "resource")] += v
		} else {
			out["ended "+labelValue(k, "resource")+" "+labelValue(k, "reason")] += v
		}
	}
	return out, nil
}

// clientset is a client-go clientset as a program in the bench client pod
// has one: the pod's network and token, protobuf as informers of built-in
// types use, through the agent (the Service VIP) or straight to
// kube-apiserver.
func (m *measurer) clientset(viaAgent bool) (kubernetes.Interface, error) {
	host := m.directBase
	if viaAgent {
		host = m.agentBase
	}
	cfg := &rest.Config{
		Host:            host,
		BearerToken:     m.b.client.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(m.b.client.Dir, "serviceaccount", "ca.crt")},
		Dial:            m.b.client.NetNS.DialContext,
		QPS:             100,
		Burst:           200,
		UserAgent:       "kube-apicache-bench",
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubernetes.NewForConfig(cfg)
}

// watchNodePods opens a watch-list of the node's pods, as a client-go
// informer starts one, and returns once its initial events have arrived.
// Each later event goes to fn with the time it arrived, until the watch
// ends or is stopped.
func watchNodePods(ctx context.Context, cs kubernetes.Interface, fn func(watch.Event, time.Time)) (watch.Interface, error) {
	w, err := cs.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{
		FieldSelector:        "spec.nodeName=" + sandbox.NodeName,
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
		TimeoutSeconds:       ptr.To[int64](1800),
	})
	if err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		synced := false
		for ev := range w.ResultChan() {
			now := time.Now()
			if !synced {
				if ev.Type == watch.Bookmark {
					if p, ok := ev.Object.(*corev1.Pod); ok && p.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
						synced = true
						close(ready)
					}
				}
				continue
			}
			if fn != nil {
				fn(ev, now)
			}
		}
	}()
	select {
	case <-ready:
		return w, nil
	case <-time.After(time.Minute):
		w.Stop()
		return nil, fmt.Errorf("the watch-list of the node's pods sent no initial-events-end bookmark within a minute")
	case <-ctx.Done():
		w.Stop()
		return nil, ctx.Err()
	}
}

// latencyResult holds, for each timed write, how long until the watch
// through the agent and the direct one saw it, each sorted.
type latencyResult struct {
	pod           string
	agent, direct []time.Duration
	// diffs are agent minus direct, write by write.
	diffs []time.Duration
	// agentAck and directAck are the same sightings timed from the
	// write's answer instead (0 if the event came first), as the
	// staleness case reports them.
	agentAck, directAck []time.Duration
	missed              int
}

// watchLatency opens a watch-list of the node's pods through the agent
// and one direct, from the client pod, then changes an annotation of one
// of those pods n times, one write at a time, and times each write until
// each watch has seen it.
func (b *bench) watchLatency(ctx context.Context, m *measurer, n int) (*latencyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	type sighting struct {
		agent bool
		seq   int
		at    time.Time
	}
	seen := make(chan sighting, 256)
	for _, viaAgent := range []bool{true, false} {
		cs, err := m.clientset(viaAgent)
		if err != nil {
			return nil, err
		}
		w, err := watchNodePods(ctx, cs, func(ev watch.Event, at time.Time) {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				return
			}
			if seq, err := strconv.Atoi(p.Annotations[latencyAnnotation]); err == nil {
				select {
				case seen <- sighting{viaAgent, seq, at}:
				case <-ctx.Done():
				}
			}
		})
		if err != nil {
			return nil, err
		}
		defer w.Stop()
	}
	pods := b.c.Admin.CoreV1().Pods(benchNS)
	r := &latencyResult{pod: b.firstNodePod}
	missedInARow := 0
	for seq := 1; seq <= n; seq++ {
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"%d"}}}`, latencyAnnotation, seq)
		start := time.Now()
		if _, err := pods.Patch(ctx, r.pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, err
		}
		acked := time.Since(start)
		var agent, direct time.Duration
		timeout := time.NewTimer(5 * time.Second)
		for agent == 0 || direct == 0 {
			select {
			case s := <-seen:
				switch {
				case s.seq != seq:
				case s.agent && agent == 0:
					agent = s.at.Sub(start)
				case !s.agent && direct == 0:
					direct = s.at.Sub(start)
				}
				continue
			case <-timeout.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			break
		}
		timeout.Stop()
		if agent == 0 || direct == 0 {
			r.missed++
			if missedInARow++; missedInARow == 5 {
				return nil, fmt.Errorf("5 writes in a row not seen within 5s (through the agent: %v, direct: %v)", agent != 0, direct != 0)
			}
			continue
		}
		missedInARow = 0
		r.agent = append(r.agent, agent)
		r.direct = append(r.direct, direct)
		r.diffs = append(r.diffs, agent-direct)
		r.agentAck = append(r.agentAck, max(agent-acked, 0))
		r.directAck = append(r.directAck, max(direct-acked, 0))
		// Space the writes a little, as unrelated changes come.
		time.Sleep(10 * time.Millisecond)
	}
	for _, s := range [][]time.Duration{r.agent, r.direct, r.diffs, r.agentAck, r.directAck} {
		slices.Sort(s)
	}
	if len(r.agent) == 0 {
		return nil, fmt.Errorf("no write was seen along both paths")
	}
	return r, nil
}

// memoryResult is the agent's heap in use (after a forced collection)
// with no watcher of its own, one, and n of the node's pods.
type memoryResult struct {
	n              int
	none, one, all float64
}

// watchMemory opens watch-lists of the node's pods through the agent from
// the client pod, one and then n in all (over one HTTP/2 connection, as
// one client's informers share it, so that connections are not counted),
// each reading every event, and reads the agent's heap in use with each.
func (b *bench) watchMemory(ctx context.Context, m *measurer, n int) (*memoryResult, error) {
	cs, err := m.clientset(true)
	if err != nil {
		return nil, err
	}
	watchers := func() (float64, error) {
		text, err := b.agent.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		return scrape(text, "kube_apicache_cache_watchers")[`kube_apicache_cache_watchers{resource="pods"}`], nil
	}
	base, err := watchers()
	if err != nil {
		return nil, err
	}
	var (
		mu sync.Mutex // protects ws
		ws []watch.Interface
	)
	defer func() {
		for _, w := range ws {
			w.Stop()
		}
	}()
	open := func(k int) error {
		// The watches outlive the group: no context of its own.
		var g errgroup.Group
		g.SetLimit(8)
		for range k {
			g.Go(func() error {
				w, err := watchNodePods(ctx, cs, nil)
				if err != nil {
					return err
				}
				mu.Lock()
				ws = append(ws, w)
				mu.Unlock()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		// Every watch is served from the cache, not forwarded.
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			v, err := watchers()
			return err == nil && v == base+float64(len(ws)), nil
		})
	}
	heap := func() (float64, error) {
		v, err := b.agentMemStat(ctx, "go_memstats_heap_inuse_bytes")
		return float64(v), err
	}
	r := &memoryResult{n: n}
	if r.none, err = heap(); err != nil {
		return nil, err
	}
	if err := open(1); err != nil {
		return nil, fmt.Errorf("opening 1 watcher: %w", err)
	}
	if r.one, err = heap(); err != nil {
		return nil, err
	}
	if err := open(n - 1); err != nil {
		return nil, fmt.Errorf("opening %d watchers: %w (the agent serves %d)", n, err, len(ws))
	}
	if r.all, err = heap(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *watchResults) print() {
	if r == nil {
		return
	}
	if c := r.churn; c != nil {
		c.print()
	}
	if l := r.latency; l != nil {
		l.print()
	}
	if mem := r.memory; mem != nil {
		mem.print()
	}
}

func (c *churnResult) print() {
	fmt.Printf("\n%s: %d informer processes on %s (watch-list informers for the node's pods, typed and metadata-only, and all services), %d pod updates/s (%d pods on the node) and %d service updates/s (%d services)\n\n",
		churnCase, c.n, sandbox.NodeName, c.rate, c.podN, c.rate, c.serviceN)
	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "\tno informers\tagent\tdirect\t")
	row := func(name, format string, f func(w churnWindow) any) {
		fmt.Fprintf(out, "%s\t"+format+"\t"+format+"\t"+format+"\t\n", name, f(c.none), f(c.agent), f(c.direct))
	}
	row("window", "%v", func(w churnWindow) any { return w.took.Round(time.Millisecond) })
	row("pod/service updates made", "%s", func(w churnWindow) any { return fmt.Sprintf("%d/%d", w.podWrites, w.svcWrites) })
	row("informers synced after", "%s", func(w churnWindow) any {
		if w.synced == 0 {
			return "-"
		}
		return w.synced.Round(time.Millisecond).String()
	})
	row("kube-apiserver CPU-s", "%.2f", func(w churnWindow) any { return w.apiserverS })
	row("kube-apiserver bytes sent", "%.0f", func(w churnWindow) any { return w.bytes })
	row("agent CPU-s", "%.2f", func(w churnWindow) any { return w.agentS })
	_ = out.Flush()
	// Each pod update reaches two watches of each process (typed and
	// metadata-only), each service update one.
	fmt.Printf("  served by the agent in its window: %v; %d pod and %d service updates make %d pod and %d service events; %.0f more events after the window\n",
		c.agent.served, c.agent.podWrites, c.agent.svcWrites, 2*c.n*c.agent.podWrites, c.n*c.agent.svcWrites, c.agent.lateEvents)
	if c.agent.failed+c.direct.failed > 0 {
		fmt.Printf("  informer processes that did not sync: agent %d, direct %d\n", c.agent.failed, c.direct.failed)
	}
	fmt.Printf("  the agent's watch outcomes as the informers started: %v\n", c.agent.outcomes)
	fmt.Printf("%s: kube-apiserver CPU-s agent/direct %s\n", churnCase, verdict(c.agent.apiserverS, c.direct.apiserverS, churnTarget))
	fmt.Printf("%s: kube-apiserver bytes sent agent/direct %s\n", churnCase, verdict(c.agent.bytes, c.direct.bytes, churnTarget))
	// The writes themselves, and the watches of the agent and of
	// kube-controller-manager, cost the same along both paths: beyond the
	// churn with no informers is what the informers' watches cost.
	beyond := func(a, d float64) string { return verdict(max(a, 0), d, churnTarget) }
	fmt.Printf("%s, beyond the churn with no informers: kube-apiserver CPU-s agent/direct %s\n", churnCase,
		beyond(c.agent.apiserverS-c.none.apiserverS, c.direct.apiserverS-c.none.apiserverS))
	fmt.Printf("%s, beyond the churn with no informers: kube-apiserver bytes sent agent/direct %s\n", churnCase,
		beyond(c.agent.bytes-c.none.bytes, c.direct.bytes-c.none.bytes))
}

func (l *latencyResult) print() {
	pct := func(s []time.Duration, p int) time.Duration { return s[min(len(s)*p/100, len(s)-1)] }
	ms := func(d time.Duration) string { return fmt.Sprintf("%+.2fms", float64(d)/float64(time.Millisecond)) }
	judge := func(d, target time.Duration) string {
		if d <= target {
			return "meets"
		}
		return "misses"
	}
	fmt.Printf("\n%s: %d merge patches of pod %s/%s by the admin, one at a time, each timed until a watch-list of the node's pods in the client pod saw it, through the agent and direct, both open at once (%d not seen by both within 5s)\n",
		latencyCase, len(l.agent)+l.missed, benchNS, l.pod, l.missed)
	fmt.Printf("  agent:  p50 %v, p99 %v\n", pct(l.agent, 50).Round(10*time.Microsecond), pct(l.agent, 99).Round(10*time.Microsecond))
	fmt.Printf("  direct: p50 %v, p99 %v\n", pct(l.direct, 50).Round(10*time.Microsecond), pct(l.direct, 99).Round(10*time.Microsecond))
	fmt.Printf("  agent minus direct, write by write: p50 %s, p99 %s\n", ms(pct(l.diffs, 50)), ms(pct(l.diffs, 99)))
	d50, d99 := pct(l.agent, 50)-pct(l.direct, 50), pct(l.agent, 99)-pct(l.direct, 99)
	fmt.Printf("%s: agent minus direct p50 %s (target at most %s): %s; p99 %s (target at most %s): %s\n",
		latencyCase, ms(d50), ms(latencyP50Target), judge(d50, latencyP50Target), ms(d99), ms(latencyP99Target), judge(d99, latencyP99Target))
}

func (mem *memoryResult) print() {
	mib := func(v float64) string { return fmt.Sprintf("%.2f MiB", v/(1<<20)) }
	fmt.Printf("\n%s: the agent's heap in use (go_memstats_heap_inuse_bytes after a forced GC, least of 3) with watch-lists of the node's pods from the client pod, over one connection\n", memoryCase)
	fmt.Printf("  no watcher %s, 1 watcher %s, %d watchers %s\n", mib(mem.none), mib(mem.one), mem.n, mib(mem.all))
	perWatcher := (mem.all - mem.one) / float64(mem.n-1)
	fmt.Printf("  each watcher beyond the first: %.0f bytes, of which %d allowed (32 KiB writer buffer and a batch of 64 event pointers)\n", perWatcher, watcherAllowance)
	// What the watchers add to the heap with none, less what each holds
	// by design: informative, as one watcher's share is within the
	// heap's noise (it can come out below its allowance).
	fmt.Printf("  added by 1 watcher: %.0f bytes (%d allowed); by %d watchers: %.0f bytes, %.0f each, %.0f each beyond the allowance\n",
		mem.one-mem.none, watcherAllowance, mem.n, mem.all-mem.none, (mem.all-mem.none)/float64(mem.n),
		(mem.all-mem.none)/float64(mem.n)-float64(watcherAllowance))
	// The target: the agent with n watchers costs
	// at most 1.2x what it does with one, beyond the per-watcher buffers.
	// A copy of the watched state per watcher (what a relaying proxy
	// holds) breaks it; sharing one window and one Store keeps it near 1.
	one := mem.one - watcherAllowance
	all := mem.all - float64(mem.n*watcherAllowance)
	word := "meets"
	if all > memoryTarget*one {
		word = "misses"
	}
	fmt.Printf("%s: heap with %d watchers/with 1 watcher, each less %d bytes: %.3f× (target at most %g×): %s\n",
		memoryCase, mem.n, watcherAllowance, all/one, memoryTarget, word)
}
