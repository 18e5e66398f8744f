package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// onDemandResources are the default cached resources, as their audit
// events name them.
var onDemandResources = map[string]bool{"pods": true, "nodes": true, "services": true, "endpointslices": true, "namespaces": true}

// agentCacheWatches returns the lists and watches of cached resources the
// agent opened since t0, from kube-apiserver's audit log: the cache's own
// requests (as the agent, or as the node through it), not the agent's
// namespaced EndpointSlice watch of default/kubernetes. stage selects the
// stage (ResponseStarted: a watch began; ResponseComplete: it ended).
func agentCacheWatches(t *testing.T, c *sandbox.Cluster, t0 time.Time, stage auditv1.Stage) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, e := range auditEvents(t, c, func(e *auditv1.Event) bool {
		// detect-local's watch of this node's pods (for the pod-path
		// check) is the agent's, not the cache's.
		podPath := strings.HasSuffix(e.UserAgent, " detect-local")
		return e.User.Username == sandbox.AgentUsername() && e.Stage == stage && (e.Verb == "list" || e.Verb == "watch") &&
			e.ObjectRef != nil && e.ObjectRef.Namespace == "" && onDemandResources[e.ObjectRef.Resource] && !podPath &&
			!e.RequestReceivedTimestamp.Time.Before(t0)
	}) {
		out[e.Verb+" "+e.ObjectRef.Resource]++
	}
	return out
}

// apiserverWatches sums kube-apiserver's apiserver_longrunning_requests
// gauge of WATCHes of resource over every apiserver: the watches open now,
// the agent's and every other client's.
func apiserverWatches(t *testing.T, ctx context.Context, c *sandbox.Cluster, resource string) float64 {
	t.Helper()
	return sumAPIServerMetric(t, ctx, c, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH", "resource": resource})
}

// sumAPIServerMetric sums the samples of name matching match over every
// kube-apiserver of the sandbox.
func sumAPIServerMetric(t *testing.T, ctx context.Context, c *sandbox.Cluster, name string, match map[string]string) float64 {
	t.Helper()
	var n float64
	for _, as := range c.APIServers() {
		cfg := rest.CopyConfig(c.AdminConfig)
		cfg.Host = as.URL
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatalf("kube-apiserver %s metrics: %v", as.URL, err)
		}
		n += sumWhere(parseMetrics(t, string(raw))[name], match)
	}
	return n
}

// cacheStates returns the agent's informer state by resource, and the
// number of informers it runs.
func cacheStates(t *testing.T, ctx context.Context, a *sandbox.Agent) (map[string]string, float64) {
	t.Helper()
	samples := scrapeAgent(t, ctx, a)
	states := map[string]string{}
	for _, s := range samples["kube_apicache_cache_state"] {
		if s.value == 1 {
			states[s.labels["resource"]] = s.labels["state"]
		}
	}
	return states, sumWhere(samples["kube_apicache_cache_informers"], nil)
}

// TestCacheOnDemand is the cache-on-demand scenario: given an agent with
// no resource pinned and a 5 s idle timeout, it holds no watch of any
// cached resource while nobody reads; when a caller without rights lists
// services, it still holds none; when an allowed caller lists services,
// that read is forwarded and starts the services informer (and only it),
// after which reads are cache hits; and 5 s after the last read the
// informer stops and its watch ends.
func TestCacheOnDemand(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	reader, nobody := setUpCacheScenario(t, ctx, c)
	baseline := apiserverWatches(t, ctx, c, "services")
	t0 := time.Now()
	const idle = 5 * time.Second
	agent := startAgent(t, ctx, c, "--cache-pinned-resources=", "--cache-idle-timeout="+idle.String())
	started := time.Now()

	// Given no read: no informer, nothing listed or watched.
	time.Sleep(2 * time.Second)
	states, informers := cacheStates(t, ctx, agent)
	for r := range onDemandResources {
		key := r
		if r == "endpointslices" {
			key = "endpointslices.discovery.k8s.io"
		}
		if states[key] != "idle" {
			t.Errorf("%s before any read: %q, want idle", key, states[key])
		}
	}
	if informers != 0 {
		t.Errorf("informers before any read: %v, want 0", informers)
	}
	if got := agentCacheWatches(t, c, t0, auditv1.StageResponseStarted); len(got) != 0 {
		t.Errorf("cache lists and watches before any read: %v, want none", got)
	}
	idleWatches := apiserverWatches(t, ctx, c, "services")
	quiet := time.Since(started)

	// When a caller without rights lists services: 403, and still nothing.
	const path = "/api/v1/namespaces/" + cacheNS + "/services?resourceVersion=0"
	viaNobody, _ := podClients(t, c, nobody)
	if r := viaNobody.do(t, ctx, "GET", path, acceptJSON, uaOther, nil); r.code != http.StatusForbidden {
		t.Errorf("unauthorized list: %d %s, want 403", r.code, r.body)
	}
	time.Sleep(time.Second)
	if states, informers := cacheStates(t, ctx, agent); states["services"] != "idle" || informers != 0 {
		t.Errorf("after an unauthorized read: services %q, %v informers; want idle, 0", states["services"], informers)
	}

	// When an allowed caller lists services: forwarded, and the informer starts.
	viaReader, _ := podClients(t, c, reader)
	before := readCacheMetrics(t, ctx, agent).outcomes
	readAt := time.Now()
	if r := viaReader.do(t, ctx, "GET", path, acceptJSON, uaOther, nil); r.code != http.StatusOK {
		t.Fatalf("first allowed list: %d %s", r.code, r.body)
	}
	if n := readCacheMetrics(t, ctx, agent).outcomes["forwarded/idle"] - before["forwarded/idle"]; n != 1 {
		t.Errorf("first allowed list: %v forwarded as idle, want 1", n)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		states, _ := cacheStates(t, ctx, agent)
		return states["services"] == "synced", nil
	})
	if err != nil {
		t.Fatalf("services never synced after the first allowed read")
	}
	synced := time.Since(readAt)

	// Then later reads are cache hits, and only services is watched.
	before = readCacheMetrics(t, ctx, agent).outcomes
	for range 5 {
		if r := viaReader.do(t, ctx, "GET", path, acceptJSON, uaOther, nil); r.code != http.StatusOK {
			t.Fatalf("list once synced: %d %s", r.code, r.body)
		}
	}
	lastRead := time.Now()
	if n := readCacheMetrics(t, ctx, agent).outcomes["hit"] - before["hit"]; n != 5 {
		t.Errorf("lists once synced: %v hits, want 5", n)
	}
	states, informers = cacheStates(t, ctx, agent)
	if informers != 1 || states["namespaces"] != "idle" || states["pods"] != "idle" {
		t.Errorf("after reads of services only: %v informers, states %v; want 1, services alone running", informers, states)
	}
	got := agentCacheWatches(t, c, t0, auditv1.StageResponseStarted)
	if got["watch services"]+got["list services"] == 0 || len(got) != min(got["watch services"], 1)+min(got["list services"], 1) {
		t.Errorf("cache lists and watches after reading services: %v, want services only", got)
	}
	runningWatches := apiserverWatches(t, ctx, c, "services")

	// Then the idle timeout after the last read stops it; its watch ends.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		states, informers := cacheStates(t, ctx, agent)
		return states["services"] == "idle" && informers == 0, nil
	})
	if err != nil {
		t.Fatalf("services still running a minute after the last read")
	}
	stoppedAfter := time.Since(lastRead)
	if stoppedAfter < idle {
		t.Errorf("stopped %v after the last read, before the %v idle timeout", stoppedAfter, idle)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return agentCacheWatches(t, c, t0, auditv1.StageResponseComplete)["watch services"] > 0, nil
	})
	if err != nil {
		t.Errorf("kube-apiserver never saw the agent's services watch end")
	}
	var afterWatches float64
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		afterWatches = apiserverWatches(t, ctx, c, "services")
		return afterWatches <= idleWatches, nil
	})
	samples := scrapeAgent(t, ctx, agent)
	starts := sumWhere(samples["kube_apicache_cache_informer_starts_total"], map[string]string{"resource": "services"})
	stops := sumWhere(samples["kube_apicache_cache_informer_stops_total"], map[string]string{"resource": "services"})
	if starts != 1 || stops != 1 {
		t.Errorf("services informer starts %v, stops %v; want 1, 1", starts, stops)
	}
	figuref(t, "agent with nothing pinned: 0 informers and 0 cache lists/watches %v after it was ready; an unauthorized list started none; the first allowed list was forwarded and services synced %v later (then 5 of 5 lists were hits, %v informer running); stopped %v after the last read (idle timeout %v)",
		quiet.Round(100*time.Millisecond), synced.Round(time.Millisecond), 1, stoppedAfter.Round(100*time.Millisecond), idle)
	figuref(t, "kube-apiserver WATCHes of services (all clients): %v before the agent, %v with the agent idle, %v with its informer running, %v after it stopped",
		baseline, idleWatches, runningWatches, afterWatches)
}
