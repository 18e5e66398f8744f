package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// TestProberCoalesces: one probe in flight at a time; the reads that arrive
// while one is in flight share the next, which starts when it ends.
func TestProberCoalesces(t *testing.T) {
	var calls, inflight, maxInflight atomic.Int32
	release := make(chan struct{})
	p := &prober{list: func(context.Context) probeResult {
		n := calls.Add(1)
		if cur := inflight.Add(1); cur > maxInflight.Load() {
			maxInflight.Store(cur)
		}
		<-release
		inflight.Add(-1)
		return probeResult{rv: uint64(100 * n)}
	}}
	ctx := context.Background()
	first := make(chan uint64, 1)
	go func() {
		r, _ := p.await(ctx, nil)
		first <- r.rv
	}()
	waitFor(t, func() bool { return calls.Load() == 1 })
	// Reads arriving now must not take the probe in flight: it may have
	// been answered before their writes finished.
	const later = 20
	var wg sync.WaitGroup
	results := make(chan uint64, later)
	for range later {
		wg.Go(func() {
			r, err := p.await(ctx, nil)
			if err != nil {
				t.Error(err)
			}
			results <- r.rv
		})
	}
	time.Sleep(20 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d probes while the first is in flight, want 1", n)
	}
	release <- struct{}{}
	if rv := <-first; rv != 100 {
		t.Errorf("first read got probe rv %d, want 100", rv)
	}
	waitFor(t, func() bool { return calls.Load() == 2 })
	release <- struct{}{}
	wg.Wait()
	close(results)
	for rv := range results {
		if rv != 200 {
			t.Errorf("a later read got probe rv %d, want 200 (the probe that started after it)", rv)
		}
	}
	if n, m := calls.Load(), maxInflight.Load(); n != 2 || m != 1 {
		t.Errorf("%d probes, at most %d in flight; want 2 and 1", n, m)
	}
	// Nothing waits: no probe starts.
	time.Sleep(10 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Errorf("%d probes after every read was answered, want 2", n)
	}
}

// TestProberReaderGivesUp: a read whose context ends stops waiting; the
// probe still ends by itself, and the next read gets a new one.
func TestProberReaderGivesUp(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	p := &prober{list: func(context.Context) probeResult {
		calls.Add(1)
		<-release
		return probeResult{rv: 7}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.await(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await: %v, want the context's deadline", err)
	}
	close(release)
	if r, err := p.await(context.Background(), nil); err != nil || r.rv != 7 || calls.Load() != 2 {
		t.Errorf("next read: %+v %v after %d probes, want rv 7 from a second probe", r, err, calls.Load())
	}
}

func TestStoreMatches(t *testing.T) {
	s := store.NewStore(store.AttrsFor(store.FieldLabelsFor(corev1.SchemeGroupVersion.WithResource("services").GroupResource(), true, true), true), nil, nil)
	if s.Matches(0, nil) {
		t.Error("an unsynced Store matches")
	}
	svc := func(name, rv string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
	}
	if err := s.Replace([]any{svc("a", "5"), svc("b", "8")}, "10"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		rv       uint64
		versions map[string]uint64
		want     bool
	}{
		{"the Store's RV reached", 10, nil, true},
		{"older probe", 9, nil, true},
		{"same objects at a later RV", 50, map[string]uint64{"ns/a": 5, "ns/b": 8}, true},
		{"an object changed", 50, map[string]uint64{"ns/a": 5, "ns/b": 40}, false},
		{"an object created", 50, map[string]uint64{"ns/a": 5, "ns/b": 8, "ns/c": 41}, false},
		{"an object deleted", 50, map[string]uint64{"ns/a": 5}, false},
		{"another object of the same count", 50, map[string]uint64{"ns/a": 5, "ns/c": 8}, false},
	} {
		if got := s.Matches(tc.rv, tc.versions); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestConsistentReadProbe: with --cache-consistent-reads=probe, a
// consistent read is answered only once the cache holds at least the
// probed state, and forwarded when it does not catch up, when the probe
// fails, or when the scope is larger than a probe is worth.
func TestConsistentReadProbe(t *testing.T) {
	tc := newHandlerCache(t)
	var upstream atomic.Pointer[probeResult]
	var probes atomic.Int32
	tc.services.prober = &prober{list: func(context.Context) probeResult {
		probes.Add(1)
		return *upstream.Load()
	}}
	reasons := func(reason string) float64 {
		return testutil.ToFloat64(tc.metrics.requests.WithLabelValues("get", "services", "forwarded", reason))
	}
	const path = "/api/v1/namespaces/ns/services/s1"

	// kube-apiserver is where the cache is: answered at once.
	upstream.Store(&probeResult{rv: 10, versions: map[string]uint64{"ns/s1": 6}})
	if got := tc.get(t, path); got.code != 200 {
		t.Fatalf("current cache: %d %s", got.code, got.body)
	}
	// kube-apiserver moved on without touching the scope (another
	// resource's writes): the content is current, answered at once.
	upstream.Store(&probeResult{rv: 500, versions: map[string]uint64{"ns/s1": 6}})
	start := time.Now()
	if got := tc.get(t, path); got.code != 200 || time.Since(start) > 50*time.Millisecond {
		t.Errorf("quiet scope behind the cluster's RV: %d after %v, want 200 at once", got.code, time.Since(start))
	}
	// Another client updated s1 (RV 501): the read waits for the event.
	upstream.Store(&probeResult{rv: 501, versions: map[string]uint64{"ns/s1": 501}})
	go func() {
		time.Sleep(20 * time.Millisecond)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s1", ResourceVersion: "501", Labels: map[string]string{"v": "2"}}}
		_ = tc.services.store.Update(svc)
	}()
	got := tc.get(t, path)
	var svc corev1.Service
	if err := json.Unmarshal(got.body, &svc); got.code != 200 || err != nil || svc.ResourceVersion != "501" {
		t.Errorf("read after another client's write: %d %s, want the written object", got.code, got.body)
	}
	// An update the watch never delivers (within the wait): forwarded.
	upstream.Store(&probeResult{rv: 600, versions: map[string]uint64{"ns/s1": 600}})
	start = time.Now()
	if got := tc.get(t, path); !got.forwarded() || time.Since(start) < 100*time.Millisecond {
		t.Errorf("cache behind: %d after %v, want forwarded after the 100ms wait", got.code, time.Since(start))
	}
	if n := reasons(reasonProbeBehind); n != 1 {
		t.Errorf("%v reads forwarded as %s, want 1", n, reasonProbeBehind)
	}
	// A deletion the watch has not delivered: forwarded too.
	upstream.Store(&probeResult{rv: 601, versions: map[string]uint64{}})
	if got := tc.get(t, "/api/v1/namespaces/ns/services"); !got.forwarded() {
		t.Errorf("deleted upstream, listed by the cache: %d, want forwarded", got.code)
	}
	// A failing probe forwards.
	upstream.Store(&probeResult{err: errors.New("connection refused")})
	if got := tc.get(t, path); !got.forwarded() || reasons(reasonProbeFailed) != 1 {
		t.Errorf("failed probe: %d (%v forwarded as %s), want forwarded", got.code, reasons(reasonProbeFailed), reasonProbeFailed)
	}
	// RV=0 and not-older-than reads never probe.
	before := probes.Load()
	if got := tc.get(t, path+"?resourceVersion=0"); got.code != 200 || probes.Load() != before {
		t.Errorf("RV=0 read: %d after %d probes, want 200 and none", got.code, probes.Load()-before)
	}
	// A scope larger than the bound forwards without probing.
	if err := tc.services.store.Add(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s2", ResourceVersion: "700"}}); err != nil {
		t.Fatal(err)
	}
	tc.cfg.ProbeMaxObjects = 1
	if got := tc.get(t, path); !got.forwarded() || probes.Load() != before || reasons(reasonProbeTooLarge) != 1 {
		t.Errorf("scope over the bound: %d after %d probes, want forwarded without a probe", got.code, probes.Load()-before)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestProberAdmit: only a read that makes a new round asks the budget; a
// refused one starts nothing. Reads that join a round already due never
// ask: the probe is paid for.
func TestProberAdmit(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	p := &prober{list: func(context.Context) probeResult {
		calls.Add(1)
		<-release
		return probeResult{rv: 1}
	}}
	ctx := context.Background()
	refuse := func() bool { return false }
	if _, err := p.await(ctx, refuse); !errors.Is(err, errProbeBudget) || calls.Load() != 0 {
		t.Fatalf("refused round: %v after %d probes, want errProbeBudget and none", err, calls.Load())
	}
	done := make(chan error, 3)
	go func() {
		_, err := p.await(ctx, nil)
		done <- err
	}()
	waitFor(t, func() bool { return calls.Load() == 1 })
	// A probe is in flight: the next read makes the round after it and
	// pays; a read that arrives after that joins it, whatever its budget.
	var asked atomic.Int32
	go func() {
		_, err := p.await(ctx, func() bool { asked.Add(1); return true })
		done <- err
	}()
	waitFor(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.next != nil
	})
	go func() {
		_, err := p.await(ctx, func() bool { asked.Add(10); return false })
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	close(release)
	for range 3 {
		if err := <-done; err != nil {
			t.Errorf("await: %v", err)
		}
	}
	if n, a := calls.Load(), asked.Load(); n != 2 || a != 1 {
		t.Errorf("%d probes, budget asked %d (weighted), want 2 probes and one ask by the read that made the second round", n, a)
	}
}

// TestProbeBudgetOneTenant: a tenant reading one Service in a loop, each
// read consistent, cannot make the agent list every Service once per read.
// With 1,000 Services cached and the clock stopped, its 1,000 reads list
// at most its share's burst of objects (two probes); the others are
// forwarded, for it to pay in its own flow. Another pod's read is still
// answered from the cache, from its own share, until the node's budget is
// spent too; both refill with time.
func TestProbeBudgetOneTenant(t *testing.T) {
	tc := newHandlerCache(t)
	now := time.Now()
	tc.now = func() time.Time { return now }
	const scope = 1000
	items := make([]any, 0, scope)
	for i := range scope {
		items = append(items, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d", i+1), ResourceVersion: "6"}})
	}
	if err := tc.services.store.Replace(items, "10"); err != nil {
		t.Fatal(err)
	}
	var probes, listed atomic.Int64
	tc.services.prober = &prober{list: func(context.Context) probeResult {
		// kube-apiserver lists the whole scope, as the Store holds it.
		probes.Add(1)
		objs, rv := tc.services.store.Snapshot(store.Predicate{})
		versions := make(map[string]uint64, len(objs))
		for _, o := range objs {
			versions[o.Key()] = o.ResourceVersion()
		}
		listed.Add(int64(len(versions)))
		return probeResult{rv: rv, versions: versions}
	}, observe: tc.metrics.probeDone("services")}
	reasons := func(reason string) float64 {
		return testutil.ToFloat64(tc.metrics.requests.WithLabelValues("get", "services", "forwarded", reason))
	}
	const path, tenant, reads = "/api/v1/namespaces/ns/services/s1", "10.0.0.1:40000", 1000
	hits := 0
	for range reads {
		switch got := tc.getFrom(t, tenant, path); {
		case got.code == 200:
			hits++
		case !got.forwarded():
			t.Fatalf("read: %d %s", got.code, got.body)
		}
	}
	t.Logf("%d consistent gets of one Service from one source, %d Services cached: %d probes listed %d objects upstream (%.1f a read; %d without a budget), %d answered from the cache, %d forwarded",
		reads, scope, probes.Load(), listed.Load(), float64(listed.Load())/reads, reads*scope, hits, reads-hits)
	if n := listed.Load(); n > DefaultProbeBurstPerSource {
		t.Errorf("one source's %d reads made the agent list %d objects, want at most its burst of %d", reads, n, DefaultProbeBurstPerSource)
	}
	if n := testutil.ToFloat64(tc.metrics.probeObjects.WithLabelValues("services")); n != float64(listed.Load()) {
		t.Errorf("probe objects metric %v, want %d", n, listed.Load())
	}
	refused := func(budget string) float64 {
		return testutil.ToFloat64(tc.metrics.probesRefused.WithLabelValues("services", budget))
	}
	if n, r := reasons(reasonProbeBudget), refused(probeBudgetSource); hits != 2 || n != reads-2 || r != reads-2 {
		t.Errorf("%d answered from the cache, %v forwarded as %s, %v probes refused by the source's share; want 2, %d, %d",
			hits, n, reasonProbeBudget, r, reads-2, reads-2)
	}

	// Another pod has a share of its own. The node's budget holds four
	// such probes: the fourth source's read is forwarded.
	for i, want := range []int{200, 200, 299} {
		if got := tc.getFrom(t, fmt.Sprintf("10.0.1.%d:40000", i), path); got.code != want {
			t.Errorf("source %d: %d, want %d", i, got.code, want)
		}
	}
	if n := refused(probeBudgetNode); n != 1 {
		t.Errorf("%v probes refused by the node's budget, want 1", n)
	}
	// Ten seconds later the tenant's share holds one more such probe.
	now = now.Add(10 * time.Second)
	if got := tc.getFrom(t, tenant, path); got.code != 200 {
		t.Errorf("after the share refilled: %d, want 200", got.code)
	}
	if got := tc.getFrom(t, tenant, path); !got.forwarded() {
		t.Errorf("right after: %d, want forwarded", got.code)
	}

	// A list of the whole scope costs kube-apiserver, forwarded, at least
	// what its probe does: it is charged no objects, only a round, so a
	// source's rounds bound it (two seconds' worth at once).
	lister := "10.0.2.1:40000"
	now = now.Add(time.Minute)
	lists := 0
	const tries = 300
	for range tries {
		if got := tc.getFrom(t, lister, "/api/v1/namespaces/ns/services"); got.code == 200 {
			lists++
		} else if !got.forwarded() {
			t.Fatalf("list: %d %s", got.code, got.body)
		}
	}
	t.Logf("%d consistent lists of the whole scope from a fresh source at once: %d answered from the cache", tries, lists)
	if want := roundsBurst(DefaultProbeRoundsPerSecondPerSource); lists != want {
		t.Errorf("%d of %d lists of the whole scope answered from the cache, want the source's %d rounds", lists, tries, want)
	}
}
