package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// watchedEvent is one event of a watch stream, its object decoded as
// generic JSON.
type watchedEvent struct {
	Type   string
	Object map[string]any
}

func (e watchedEvent) rv() uint64 {
	md, _ := e.Object["metadata"].(map[string]any)
	rv, _ := md["resourceVersion"].(string)
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

func (e watchedEvent) initialEventsEnd() bool {
	md, _ := e.Object["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	return e.Type == "BOOKMARK" && ann[metav1.InitialEventsAnnotationKey] == "true"
}

// watchStream records the events of one JSON watch.
type watchStream struct {
	mu     sync.Mutex
	events []watchedEvent
	last   time.Time
	done   chan struct{}
	err    error
}

func (s *watchStream) snapshot() ([]watchedEvent, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]watchedEvent(nil), s.events...), s.last
}

// openWatch starts a JSON watch of path with c; it is read until ctx ends.
func openWatch(t *testing.T, ctx context.Context, c rawClient, path string) *watchStream {
	t.Helper()
	resp := c.startWatch(t, ctx, path)
	s := &watchStream{done: make(chan struct{}), last: time.Now()}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 1<<16))
		for {
			var ev watchedEvent
			if err := dec.Decode(&ev); err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
			s.mu.Lock()
			s.events = append(s.events, ev)
			s.last = time.Now()
			s.mu.Unlock()
		}
	}()
	return s
}

// watchForm is one way to watch, sent through the agent and direct.
type watchForm struct {
	name string
	path string
	// initial: the stream starts with initial events ending at a
	// bookmark; only the events after both streams' starts compare.
	initial bool
	// state: only the state the events build compares (a legacy watch
	// from "0" without bookmarks, whose start is not marked).
	state bool
}

// TestWatchFormsMatchKubeAPIServer is the differential test of watches
// served from the agent's cache. Given the agent caching this node's pods
// and services, and a pod allowed to watch them, when every watch form
// kube-apiserver serves is opened through the agent and directly at once
// and a randomized churn (creates, updates, label flips that move objects
// in and out of a selector, deletes) runs on services, pods of this node
// and a custom resource (its selectable field too) until kube-apiserver
// has sent at least 2,000 events of them, then each pair of streams
// carries the same events (type, whole object, resourceVersion) in the
// same order; and
// kube-apiserver holds no more watches for 50 clients each watching this
// node's pods, services and endpointslices through the agent, where
// directly they cost it 150.
func TestWatchFormsMatchKubeAPIServer(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const ns = "e2e-watchcache"
	createWidgetCRD(t, ctx, c)
	widgetRule := rbacv1.PolicyRule{APIGroups: []string{widgetsGVR.Group}, Resources: []string{"widgets"}, Verbs: readVerbs}
	grantClusterRead(t, ctx, c, "e2e-watchcache-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace}, widgetRule)
	grantClusterRead(t, ctx, c, "e2e-watchcache-watcher",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "watcher", Namespace: ns}, widgetRule)
	// The probe budget is off: the fan-out below opens 150 watch-lists
	// one after another, each starting at the current state, so each
	// probes on its own; 50 of them watch one namespace's services, and
	// their probes list every Service of the sandbox (hundreds, from the
	// other tests), past the default budget of one source, which would
	// forward them (with a short timeout, to come back from a
	// resourceVersion). The budget has tests of its own; the fan-out is
	// measured here.
	pod, agent := watcherAndAgent(t, ctx, c, ns, "--cache-resources="+cache.DefaultResources+",widgets."+widgetsGVR.Group+"/v1",
		"--probe-objects-per-second=-1", "--probe-objects-per-second-per-source=-1", "--probes-per-second=-1", "--probes-per-second-per-source=-1")
	waitResourceSynced(t, ctx, agent, "widgets."+widgetsGVR.Group)
	viaAgent, direct := podClients(t, c, pod)

	// A few objects before the watches, so that the initial events have
	// something in them.
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	w := newChurner(c, dynamic.NewForConfigOrDie(c.AdminConfig), ns, rng)
	for range 20 {
		w.step(t, ctx)
	}
	list, err := c.Admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := list.ResourceVersion
	node := url.QueryEscape("spec.nodeName=" + sandbox.NodeName)
	svcs := "/api/v1/namespaces/" + ns + "/services?watch=true&timeoutSeconds=600"
	pods := "/api/v1/namespaces/" + ns + "/pods?watch=true&timeoutSeconds=600&fieldSelector=" + node
	widgets := "/apis/" + widgetsGVR.Group + "/v1/namespaces/" + ns + "/widgets?watch=true&timeoutSeconds=600"
	forms := []watchForm{
		{name: "services from N", path: svcs + "&resourceVersion=" + n},
		{name: "services from N with bookmarks", path: svcs + "&allowWatchBookmarks=true&resourceVersion=" + n},
		{name: "services from N, sendInitialEvents=false", path: svcs + "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=" + n},
		{name: "services from N, label selector", path: svcs + "&labelSelector=app%3Dx&resourceVersion=" + n},
		{name: "services from N, one object", path: svcs + "&fieldSelector=metadata.name%3Dsvc-3&resourceVersion=" + n},
		{name: "services watch-list", path: svcs + "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", initial: true},
		{name: "services watch-list, label selector", path: svcs + "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=app%3Dx", initial: true},
		{name: "services legacy from 0", path: svcs + "&resourceVersion=0", state: true},
		{name: "services legacy from 0 with bookmarks", path: svcs + "&resourceVersion=0&allowWatchBookmarks=true", initial: true},
		{name: "widgets from N", path: widgets + "&resourceVersion=" + n},
		{name: "widgets from N, selectable field", path: widgets + "&fieldSelector=spec.color%3Dred&resourceVersion=" + n},
		{name: "widgets watch-list, label selector", path: widgets + "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&labelSelector=app%3Dx", initial: true},
		{name: "node pods from N", path: pods + "&resourceVersion=" + n},
		{name: "node pods from N, label selector", path: pods + "&labelSelector=app%3Dx&resourceVersion=" + n},
		{name: "node pods watch-list", path: pods + "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", initial: true},
		{name: "node pods watch-list, one object", path: pods + "%2Cmetadata.name%3Dpod-2&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", initial: true},
	}
	hitsBefore := cacheWatchHits(t, ctx, agent)
	type pair struct{ agent, direct *watchStream }
	streams := make([]pair, len(forms))
	for i, f := range forms {
		streams[i] = pair{openWatch(t, ctx, viaAgent, f.path), openWatch(t, ctx, direct, f.path)}
	}
	if hits := cacheWatchHits(t, ctx, agent) - hitsBefore; hits != float64(len(forms)) {
		t.Errorf("the agent answered %v of the %d watches from its cache", hits, len(forms))
	}

	// When writes churn services, this node's pods and widgets until
	// kube-apiserver has sent at least 2,000 events of them (a label flip
	// to the value it has, or a delete of what is gone, makes none),
	// counted on the direct watches of each whole collection.
	const minEvents, maxWrites = 2000, 6000
	everything := map[string]bool{"services from N": true, "widgets from N": true, "node pods from N": true}
	churned := func() int {
		n := 0
		for i, f := range forms {
			if !everything[f.name] {
				continue
			}
			evs, _ := streams[i].direct.snapshot()
			for _, ev := range evs {
				n += boolInt(ev.Type != "BOOKMARK")
			}
		}
		return n
	}
	start := time.Now()
	writes := 0
	for writes < maxWrites && churned() < minEvents {
		for range 100 {
			w.step(t, ctx)
			writes++
		}
	}
	took := time.Since(start)

	// Then, once every stream has been quiet for two seconds, each pair
	// carries the same events.
	deadline := time.Now().Add(time.Minute)
	for {
		quiet := true
		for _, p := range streams {
			for _, s := range []*watchStream{p.agent, p.direct} {
				if _, last := s.snapshot(); time.Since(last) < 2*time.Second {
					quiet = false
				}
			}
		}
		if quiet || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	events := churned()
	figuref(t, "watch forms: %d writes (%d creates, %d updates, %d label flips, %d deletes) in %s made %d events",
		writes, w.creates, w.updates, w.flips, w.deletes, took.Round(time.Millisecond), events)
	if events < minEvents {
		t.Errorf("%d writes made %d events, want at least %d", writes, events, minEvents)
	}
	total := 0
	for i, f := range forms {
		a, _ := streams[i].agent.snapshot()
		d, _ := streams[i].direct.snapshot()
		got, want := comparable(f, a, d)
		total += len(want)
		if len(want) == 0 && !f.state {
			t.Errorf("%s: no event to compare", f.name)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: events through the agent differ from kube-apiserver's (-direct +agent):\n%s", f.name, diff)
		}
	}
	figuref(t, "watch forms: %d forms, %d events compared, equal through the agent and direct", len(forms), total)

	// And when 50 informer-like clients each watch this node's pods, the
	// services and the endpointslices (150 watch-lists), then
	// kube-apiserver holds no more watches for them through the agent,
	// which keeps its one per resource; directly they cost 150.
	const clients = 50
	wl := "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	paths := map[string]string{
		"pods":           pods + wl,
		"services":       svcs + wl,
		"endpointslices": "/apis/discovery.k8s.io/v1/namespaces/" + ns + "/endpointslices?watch=true&timeoutSeconds=600" + wl,
	}
	watches := func() map[string]float64 {
		out := map[string]float64{}
		for res := range paths {
			out[res] = apiserverWatches(t, ctx, c, res)
		}
		return out
	}
	cost := func(rc rawClient) map[string]float64 {
		before := watches()
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		for range clients {
			for _, path := range paths {
				openWatch(t, wctx, rc, path)
			}
		}
		time.Sleep(time.Second)
		after := watches()
		for res := range after {
			after[res] -= before[res]
		}
		return after
	}
	viaAgentCost, directCost := cost(viaAgent), cost(direct)
	informers := sumWhere(scrapeAgent(t, ctx, agent)["kube_apicache_cache_informers"], nil)
	figuref(t, "upstream watches for %d clients watching node pods, services and endpointslices: through the agent %v, direct %v; the agent runs %v informers (one watch each)",
		clients, viaAgentCost, directCost, informers)
	for res := range paths {
		if viaAgentCost[res] != 0 {
			t.Errorf("%d watches of %s through the agent cost kube-apiserver %v watches, want 0", clients, res, viaAgentCost[res])
		}
		if directCost[res] < clients {
			t.Errorf("%d direct watches of %s show as %v in kube-apiserver's gauge: the measure does not see them", clients, res, directCost[res])
		}
	}
	// The agent itself holds exactly one watch upstream for each.
	held := sumBy(scrapeAgent(t, ctx, agent)["kube_apicache_cache_upstream_watches"], "resource")
	for _, res := range []string{"pods", "services", "endpointslices.discovery.k8s.io"} {
		if held[res] != 1 {
			t.Errorf("the agent holds %v upstream watches of %s, want exactly 1 (all: %v)", held[res], res, held)
		}
	}
	figuref(t, "upstream watches the agent holds itself, by resource: %v", held)
}

// comparable returns the parts of the two streams of form f that must be
// equal: every event but bookmarks, after the later of the two streams'
// starts for a watch with initial events; the final state for a legacy
// watch whose start is not marked.
func comparable(f watchForm, agent, direct []watchedEvent) (got, want []watchedEvent) {
	if f.state {
		return stateOf(agent), stateOf(direct)
	}
	var from uint64
	if f.initial {
		for _, evs := range [][]watchedEvent{agent, direct} {
			for _, ev := range evs {
				if ev.initialEventsEnd() {
					from = max(from, ev.rv())
				}
			}
		}
	}
	pick := func(evs []watchedEvent) []watchedEvent {
		var out []watchedEvent
		initial := f.initial
		for _, ev := range evs {
			if ev.initialEventsEnd() {
				initial = false
				continue
			}
			if initial || ev.Type == "BOOKMARK" || ev.rv() <= from {
				continue
			}
			out = append(out, ev)
		}
		return out
	}
	return pick(agent), pick(direct)
}

// stateOf applies a stream's events to an empty state, as an informer does.
func stateOf(evs []watchedEvent) []watchedEvent {
	state := map[string]watchedEvent{}
	for _, ev := range evs {
		md, _ := ev.Object["metadata"].(map[string]any)
		name, _ := md["name"].(string)
		switch ev.Type {
		case "ADDED", "MODIFIED":
			state[name] = watchedEvent{Type: "OBJECT", Object: ev.Object}
		case "DELETED":
			delete(state, name)
		}
	}
	out := make([]watchedEvent, 0, len(state))
	for _, name := range slices.Sorted(maps.Keys(state)) {
		out = append(out, state[name])
	}
	return out
}

// churner makes random writes to a namespace's services svc-0..39, pods
// pod-0..19 bound to the sandbox node and widgets wid-0..19: creates,
// annotation updates, label flips between app=x and app=y (with a widget's
// spec.color between red and blue), and deletes.
type churner struct {
	c                                *sandbox.Cluster
	dc                               dynamic.Interface
	ns                               string
	rng                              *rand.Rand
	svcs, pods, widgets              map[string]bool
	creates, updates, flips, deletes int
}

func newChurner(c *sandbox.Cluster, dc dynamic.Interface, ns string, rng *rand.Rand) *churner {
	return &churner{c: c, dc: dc, ns: ns, rng: rng, svcs: map[string]bool{}, pods: map[string]bool{}, widgets: map[string]bool{}}
}

func (w *churner) step(t *testing.T, ctx context.Context) {
	t.Helper()
	kind := []string{"svc", "pod", "wid"}[w.rng.Intn(3)]
	live, size := map[string]map[string]bool{"svc": w.svcs, "pod": w.pods, "wid": w.widgets}[kind], map[string]int{"svc": 40, "pod": 20, "wid": 20}[kind]
	name := fmt.Sprintf("%s-%d", kind, w.rng.Intn(size))
	app := []string{"x", "y"}[w.rng.Intn(2)]
	color := map[string]string{"x": "red", "y": "blue"}[app]
	pods, svcs := w.c.Admin.CoreV1().Pods(w.ns), w.c.Admin.CoreV1().Services(w.ns)
	widgets := w.dc.Resource(widgetsGVR).Namespace(w.ns)
	var err error
	switch op := w.rng.Intn(10); {
	case !live[name]:
		switch kind {
		case "pod":
			_, err = pods.Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
				Spec:       corev1.PodSpec{NodeName: sandbox.NodeName, Containers: []corev1.Container{{Name: "c", Image: "none"}}},
			}, metav1.CreateOptions{})
		case "svc":
			_, err = svcs.Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
				Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
		default:
			obj := widgetObject(name, color, int64(w.rng.Intn(100)))
			obj.SetLabels(map[string]string{"app": app})
			_, err = widgets.Create(ctx, obj, metav1.CreateOptions{})
		}
		live[name] = err == nil
		w.creates++
	case op < 2:
		switch kind {
		case "pod":
			err = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		case "svc":
			err = svcs.Delete(ctx, name, metav1.DeleteOptions{})
		default:
			err = widgets.Delete(ctx, name, metav1.DeleteOptions{})
		}
		delete(live, name)
		w.deletes++
	default:
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"step":"%d"}}}`, w.rng.Int())
		if op < 5 {
			patch = fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app)
			if kind == "wid" {
				patch = fmt.Sprintf(`{"metadata":{"labels":{"app":%q}},"spec":{"color":%q}}`, app, color)
			}
			w.flips++
		} else {
			w.updates++
		}
		switch kind {
		case "pod":
			_, err = pods.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		case "svc":
			_, err = svcs.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		default:
			_, err = widgets.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
	}
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("churn %s: %v", name, err)
	}
}

// TestSlowWatcher: given 100 watches of services through the agent that
// read their streams and one that never reads (its receive buffer tiny),
// when 300 updates of 16 KiB each flow, then every reading watch gets
// every event, promptly; the stuck one is ended by the agent (its writes
// wait at most the agent's write timeout); and the agent's resident
// memory grows by a bounded amount.
func TestSlowWatcher(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns = "e2e-slowwatch"
	pod, agent := watcherAndAgent(t, ctx, c, ns)
	viaAgent, _ := podClients(t, c, pod)
	svc, err := c.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "big"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/namespaces/" + ns + "/services?watch=true&resourceVersion=" + svc.ResourceVersion
	rssBefore := gaugeOf(t, ctx, agent, "process_resident_memory_bytes")
	endsBefore := sumWhere(scrapeAgent(t, ctx, agent)["kube_apicache_cache_watches_ended_total"], map[string]string{"reason": "slow"})

	// The stuck watch: HTTP/1.1 over its own connection, with a receive
	// buffer of 4 KiB, never read after the request.
	conn, err := dialVIP(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{RootCAs: podCAPool(t, pod), ServerName: sandbox.ServiceVIP, NextProtos: []string{"http/1.1"}})
	if _, err := fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: application/json\r\n\r\n", path, sandbox.ServiceVIP, pod.Token); err != nil {
		t.Fatal(err)
	}

	// The readers: one HTTP/2 connection, 100 streams, each counting its
	// events and how long after its write each arrived.
	const readers, updates = 100, 300
	var mu sync.Mutex
	written := map[string]time.Time{}
	var lags []time.Duration
	got := make([]int, readers)
	hc := *viaAgent.hc
	hc.Timeout = 0
	var wg sync.WaitGroup
	for i := range readers {
		req, _ := http.NewRequestWithContext(ctx, "GET", viaAgent.base+path, nil)
		req.Header.Set("Authorization", "Bearer "+pod.Token)
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
			for sc.Scan() {
				now := time.Now()
				line := sc.Bytes()
				k := bytes.Index(line, []byte(`"resourceVersion":"`))
				if k < 0 {
					continue
				}
				rest := line[k+len(`"resourceVersion":"`):]
				rv := string(rest[:bytes.IndexByte(rest, '"')])
				mu.Lock()
				got[i]++
				if at, ok := written[rv]; ok {
					lags = append(lags, now.Sub(at))
				}
				n := got[i]
				mu.Unlock()
				if n == updates {
					return
				}
			}
		})
	}
	time.Sleep(time.Second)

	// When 300 updates of 16 KiB flow (4.7 MiB per watch).
	filler := strings.Repeat("x", 16<<10)
	start := time.Now()
	for i := range updates {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"filler":"%s-%d"}}}`, filler, i)
		s, err := c.Admin.CoreV1().Services(ns).Patch(ctx, "big", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		written[s.ResourceVersion] = time.Now()
		mu.Unlock()
	}
	wrote := time.Since(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		mu.Lock()
		t.Fatalf("readers did not get every event within a minute of the last write: %v", got)
	}
	delivered := time.Since(start)
	// Then the stuck one is ended.
	var ended float64
	deadline := time.Now().Add(30 * time.Second)
	for ended < 1 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		ended = sumWhere(scrapeAgent(t, ctx, agent)["kube_apicache_cache_watches_ended_total"], map[string]string{"reason": "slow"}) - endsBefore
	}
	rssAfter := gaugeOf(t, ctx, agent, "process_resident_memory_bytes")
	mu.Lock()
	slices.Sort(lags)
	p50, p99, worst := lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	mu.Unlock()
	figuref(t, "slow watcher: %d readers x %d events of 16 KiB written in %s, all delivered %s after the first write; lag p50 %s p99 %s max %s; stuck watch ended: %v; agent RSS %.1f -> %.1f MiB",
		readers, updates, wrote.Round(time.Millisecond), delivered.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond),
		worst.Round(time.Millisecond), ended, rssBefore/(1<<20), rssAfter/(1<<20))
	if ended < 1 {
		t.Errorf("the watch that never reads was not ended")
	}
	if p99 > 5*time.Second {
		t.Errorf("p99 delivery lag %s: the readers were held back", p99)
	}
	if grow := rssAfter - rssBefore; grow > 128<<20 {
		t.Errorf("agent RSS grew by %.1f MiB", grow/(1<<20))
	}
}

// gaugeOf reads one unlabelled gauge of the agent's.
func gaugeOf(t *testing.T, ctx context.Context, a *sandbox.Agent, name string) float64 {
	t.Helper()
	return sumWhere(scrapeAgent(t, ctx, a)[name], nil)
}

// watcherAndAgent makes namespace ns with a pod allowed to watch in it
// (edit), and starts an agent with the default flags and agentArgs, its
// cache synced.
func watcherAndAgent(t *testing.T, ctx context.Context, c *sandbox.Cluster, ns string, agentArgs ...string) (*sandbox.Pod, *sandbox.Agent) {
	t.Helper()
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pod := newClientPod(t, ctx, c, ns, "watcher")
	if err := pod.WaitAllowed(ctx, "watch", "services"); err != nil {
		t.Fatal(err)
	}
	agent := startAgent(t, ctx, c, agentArgs...)
	waitCacheSynced(t, ctx, agent)
	return pod, agent
}
