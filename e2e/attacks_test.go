package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// Bounds the attack scenarios are checked against.
const (
	// attackHeapBound bounds the growth of the agent's heap in use that one
	// attack may cause, measured while the attack holds what it can and
	// after it. Each attack below would hold 40-100 MiB without its bound.
	attackHeapBound = 24 << 20
	// attackBodyTimeout is the agent's --request-body-timeout here.
	attackBodyTimeout = 4 * time.Second
	// victimSamples is the number of cached reads one p99 is taken over.
	victimSamples = 200
)

// TestTenantAttacks: given an agent with a synced cache, a victim pod that
// reads its node's pods from the cache, a tenant pod with no rights and a
// tenant pod with `edit` in its own namespace, when each tenant runs an
// attack on the agent (poisoning the read-your-writes barrier through a
// proxied answer, distinct oversized selectors, bodies held back, distinct
// bogus tokens, watch-lists that are never read), then the agent's memory
// and goroutines stay bounded, the victim's cached reads stay cache hits,
// and their p99 stays within twice the quiet p99 (figures reported).
func TestTenantAttacks(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	victim, nobody := setUpCacheScenario(t, ctx, c)
	editor := newClientPod(t, ctx, c, "attack", "editor")
	a := startAgent(t, ctx, c, "--request-body-timeout="+attackBodyTimeout.String(), "--profiling")
	watcher := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-attack-watcher"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, watcher, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	watchers := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-attack-watcher"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: watcher.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: victim.Spec.ServiceAccount, Namespace: victim.Spec.Namespace}}}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, watchers, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := victim.WaitAllowed(ctx, "watch", "pods"); err != nil {
		t.Fatal(err)
	}
	waitCacheSynced(t, ctx, a)
	at := &attacks{c: c, a: a, victim: victim, nobody: nobody, editor: editor,
		victimClient: vipClient(t, victim, true)}
	at.quiet = at.victimP99(t, ctx)
	figuref(t, "attacks: victim's quiet cached-read p99 %v over %d reads", at.quiet.Round(time.Microsecond), victimSamples)
	baseGoroutines := agentMetrics(t, ctx, a)["go_goroutines"]

	t.Run("BarrierPoisoning", at.barrierPoisoning)
	t.Run("OversizedSelectors", at.oversizedSelectors)
	t.Run("HeldBackBodies", at.heldBackBodies)
	t.Run("BogusTokens", at.bogusTokens)
	t.Run("UnreadWatchLists", at.unreadWatchLists)

	// Then the agent's goroutines return to where they were.
	var g float64
	waitFor(t, 30*time.Second, "the agent's goroutines to return to their baseline", func() bool {
		g = agentMetrics(t, ctx, a)["go_goroutines"]
		return g <= baseGoroutines+20
	})
	figuref(t, "attacks: agent goroutines after all attacks %v (baseline %v)", g, baseGoroutines)
}

// attacks is the state the attack scenarios share.
type attacks struct {
	c                      *sandbox.Cluster
	a                      *sandbox.Agent
	victim, nobody, editor *sandbox.Pod
	victimClient           *http.Client
	quiet                  time.Duration
}

// nodePods is the victim's read: its node's pods, a consistent read the
// cache answers.
var nodePods = "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName)

// victimP99 reads the node's pods victimSamples times, one after another,
// and returns the p99 latency; every read must succeed.
func (at *attacks) victimP99(t *testing.T, ctx context.Context) time.Duration {
	t.Helper()
	return at.victimP99Of(t, ctx, nodePods)
}

// victimP99Of is victimP99 for another read of the victim's.
func (at *attacks) victimP99Of(t *testing.T, ctx context.Context, path string) time.Duration {
	t.Helper()
	lat := make([]time.Duration, 0, victimSamples)
	for range victimSamples {
		start := time.Now()
		code, _ := at.send(ctx, at.victimClient, http.MethodGet, path, at.victim.Token, nil)
		if code != http.StatusOK {
			t.Fatalf("victim's read: %d", code)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// checkVictim measures the victim's p99 now, reports it and checks it
// against twice the quiet p99 (with a 50ms floor for this shared machine's
// scheduling noise), and checks that its reads were cache hits.
func (at *attacks) checkVictim(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	at.checkVictimAgainst(t, ctx, when, at.quiet)
}

// checkVictimAgainst is checkVictim with another quiet p99.
func (at *attacks) checkVictimAgainst(t *testing.T, ctx context.Context, when string, quiet time.Duration) {
	t.Helper()
	before := readCacheMetrics(t, ctx, at.a).outcomes["hit"]
	p99 := at.victimP99(t, ctx)
	rounds := 1
	for ; rounds < 3 && p99 > 2*quiet; rounds++ {
		// One p99 over 200 reads is the second-slowest read, which one
		// hiccup of this shared machine sets (the rest of the suite runs
		// beside this test): up to two more rounds, and the best of
		// them, so that a hiccup must strike all three to count.
		p99 = min(p99, at.victimP99(t, ctx))
	}
	// The outcome is counted once the answer has been written, so the
	// last read's count may trail its answer by a moment: wait for it.
	hits := readCacheMetrics(t, ctx, at.a).outcomes["hit"] - before
	for deadline := time.Now().Add(2 * time.Second); int(hits) < rounds*victimSamples && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		hits = readCacheMetrics(t, ctx, at.a).outcomes["hit"] - before
	}
	figuref(t, "attacks/%s: victim's cached-read p99 %s %v (quiet %v, ratio %.2f; best of %d rounds); %v of %d reads were cache hits",
		t.Name(), when, p99.Round(time.Microsecond), quiet.Round(time.Microsecond), float64(p99)/float64(quiet), rounds, hits, rounds*victimSamples)
	// The floor is this machine's: two shared cores that also run
	// kube-apiserver, etcd and another shard of the suite, where one
	// round's p99 reached 47 ms against a quiet 19 ms with every read a
	// cache hit. The hits below are what the attacks must not take.
	if p99 > 2*quiet && p99 > 50*time.Millisecond {
		t.Errorf("victim's p99 %s the attack: %v, more than twice the quiet %v", when, p99, quiet)
	}
	if int(hits) < rounds*victimSamples {
		t.Errorf("only %v of the victim's %d reads were cache hits %s the attack", hits, rounds*victimSamples, when)
	}
}

// send makes one request through the Service VIP and returns the code and
// body.
func (at *attacks) send(ctx context.Context, hc *http.Client, method, path, token string, body io.Reader) (int, []byte) {
	return vipRequest(ctx, hc, method, path, token, body)
}

// vipRequest sends one request to the Service VIP with token (none if
// empty) and returns the status (0 if none came) and the body.
func vipRequest(ctx context.Context, hc *http.Client, method, path, token string, body io.Reader) (int, []byte) {
	req, err := http.NewRequestWithContext(ctx, method, vipURL(path), body)
	if err != nil {
		return 0, nil
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// heap returns the agent's live heap (after a collection) and its
// goroutines.
func (at *attacks) heap(t *testing.T, ctx context.Context) (heap, goroutines float64) {
	t.Helper()
	// Twice: sync.Pool keeps what it held until a second collection.
	for range 2 {
		if err := at.a.CollectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m := agentMetrics(t, ctx, at.a)
	return m["go_memstats_heap_inuse_bytes"], m["go_goroutines"]
}

// checkHeap reports the agent's heap growth and goroutines since base and
// checks the growth against attackHeapBound.
func (at *attacks) checkHeap(t *testing.T, ctx context.Context, when string, base float64) {
	t.Helper()
	h, g := at.heap(t, ctx)
	rss, _ := procMemory(t, at.a.Process.Pid())
	figuref(t, "attacks/%s: agent heap in use %s: %+.1f MiB (RSS %.1f MiB), %v goroutines",
		t.Name(), when, (h-base)/(1<<20), float64(rss)/(1<<20), g)
	if h-base > attackHeapBound {
		t.Errorf("agent heap grew by %.1f MiB %s, bound %d MiB", (h-base)/(1<<20), when, attackHeapBound>>20)
	}
}

// barrierPoisoning: given the editor's pod serving an answer that names
// the largest resourceVersion and a Pod on this node, when the editor
// POSTs through the agent to that pod's proxy subresource (allowed by
// `edit`), then the answer reaches the editor unchanged, and the victim's
// consistent reads of pods are still cache hits that wait for nothing.
func (at *attacks) barrierPoisoning(t *testing.T) {
	ctx := context.Background()
	forged, _ := json.Marshal(&corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: at.editor.Spec.Namespace, ResourceVersion: "18446744073709551615"},
		Spec:       corev1.PodSpec{NodeName: sandbox.NodeName},
	})
	l, err := at.editor.NetNS.Listen("tcp", net.JoinHostPort(at.editor.IP, "8080"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(forged)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	editorClient := vipClient(t, at.editor, true)
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:8080/proxy/poison", at.editor.Spec.Namespace, at.editor.Spec.Name)
	before := readCacheMetrics(t, ctx, at.a).outcomes
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		code, body := at.send(ctx, editorClient, method, path, at.editor.Token, strings.NewReader("{}"))
		if code != http.StatusOK || string(body) != string(forged) {
			t.Fatalf("%s to the pod's proxy: %d %s, want the backend's answer", method, code, body)
		}
	}
	start := time.Now()
	at.checkVictim(t, ctx, "after")
	after := readCacheMetrics(t, ctx, at.a).outcomes
	for _, reason := range []string{"forwarded/write-barrier-timeout", "forwarded/recent-write"} {
		if n := after[reason] - before[reason]; n > 0 {
			t.Errorf("%v consistent reads forwarded as %s after the proxied answers", n, reason)
		}
	}
	figuref(t, "attacks/%s: %d consistent reads after 4 poisoned proxy answers took %v in all, none forwarded",
		t.Name(), victimSamples, time.Since(start).Round(time.Millisecond))
}

// oversizedSelectors: when a tenant with no rights sends 100 lists with
// distinct 512 KiB field selectors, then they are forwarded (kube-apiserver
// answers them), no review is made for them, and the agent's heap does not
// keep them, during or after the decisions' lifetime.
func (at *attacks) oversizedSelectors(t *testing.T) {
	ctx := context.Background()
	base, _ := at.heap(t, ctx)
	reviewsBefore := agentMetrics(t, ctx, at.a)["kube_apicache_access_reviews_total"]
	hc := vipClient(t, at.nobody, true)
	var wg sync.WaitGroup
	codes := make(chan int, 100)
	for i := range 100 {
		wg.Go(func() {
			sel := fmt.Sprintf("metadata.name=%d-%s", i, strings.Repeat("x", 512<<10))
			code, _ := at.send(ctx, hc, http.MethodGet, "/api/v1/namespaces/"+cacheNS+"/services?fieldSelector="+url.QueryEscape(sel), at.nobody.Token, nil)
			codes <- code
		})
		if i%10 == 9 {
			wg.Wait()
		}
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusForbidden {
			t.Errorf("an oversized list of a tenant with no rights: %d, want kube-apiserver's 403", code)
			break
		}
	}
	if n := agentMetrics(t, ctx, at.a)["kube_apicache_access_reviews_total"] - reviewsBefore; n > 0 {
		t.Errorf("%v reviews sent for oversized requests, want none", n)
	}
	at.checkHeap(t, ctx, "right after the attack", base)
	at.checkVictim(t, ctx, "after")
	// Past every decision's lifetime (10s) nothing of them is left.
	time.Sleep(11 * time.Second)
	at.checkHeap(t, ctx, "11s after the attack", base)
}

// heldBackBodies: when a tenant with no rights opens 40 connections, each
// sending a write that declares a 1 MiB body and holds its last bytes
// back, 20 to a pod's proxy subresource (long-running) and 20 as
// configmap creates, then the agent's heap stays bounded while they hang
// (proxied bodies are streamed, and only what fits the body budget is
// buffered), held creates are answered 504 at the body deadline, no
// connection is still held after it, and the victim's reads are
// unaffected.
func (at *attacks) heldBackBodies(t *testing.T) {
	ctx := context.Background()
	base, _ := at.heap(t, ctx)
	pool := podCAPool(t, at.nobody)
	type held struct {
		conn        *tls.Conn
		path        string
		closedEarly bool
	}
	var conns []held
	closedEarly := 0
	for i := range 40 {
		path := fmt.Sprintf("/api/v1/namespaces/%s/configmaps", cacheNS)
		if i%2 == 0 {
			path = fmt.Sprintf("/api/v1/namespaces/%s/pods/x%d/proxy/upload", cacheNS, i)
		}
		raw, err := dialVIP(ctx, at.nobody)
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: sandbox.ServiceVIP, NextProtos: []string{"http/1.1"}})
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, sandbox.ServiceVIP, 1<<20)
		h := held{conn: conn, path: path}
		if _, err := conn.Write(append([]byte(head), make([]byte, 1<<20-100)...)); err != nil {
			// A streamed body (every proxied one, and creates past the
			// buffer budget): kube-apiserver refuses the anonymous caller
			// at once, and the agent closes the connection rather than
			// read the rest of the body.
			h.closedEarly = true
			closedEarly++
		}
		conns = append(conns, h)
	}
	defer func() {
		for _, h := range conns {
			h.conn.Close()
		}
	}()
	at.checkHeap(t, ctx, "while 40 bodies are held back", base)
	at.checkVictim(t, ctx, "during")

	// The creates' bodies are past their deadline by now or soon: each gets
	// an answer, 504 for a body that never arrived; the proxied ones were
	// answered by kube-apiserver already (anonymous: refused).
	// Every connection is answered or closed by then; none is still held.
	// (A connection closed with its body unread may be reset, which can
	// discard the answer before the client reads it: code 0.)
	answers := map[int]int{}
	for _, h := range conns {
		_ = h.conn.SetReadDeadline(time.Now().Add(2 * attackBodyTimeout))
		buf := make([]byte, 64)
		n, err := io.ReadAtLeast(h.conn, buf, 12)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: still held %v after the body deadline", h.path, 2*attackBodyTimeout)
		}
		code := 0
		if n >= 12 {
			_, _ = fmt.Sscanf(string(buf[9:12]), "%d", &code)
		}
		answers[code]++
	}
	if answers[http.StatusGatewayTimeout] == 0 {
		t.Errorf("no held-back create was answered 504 at its body deadline")
	}
	figuref(t, "attacks/%s: answers to 40 held-back bodies by status %v (0: none); %d proxied ones closed before their body was sent", t.Name(), answers, closedEarly)
	at.checkHeap(t, ctx, "after the attack", base)
}

// bogusTokens: when a tenant sends lists with distinct bogus tokens, 20 at
// a time, while the victim reads (at least 300 of them, until the victim
// is done), then the agent sends TokenReviews for no more than the
// tenant's share, forwards the rest (kube-apiserver answers 401), and the
// victim's p99 of cached reads served by the agent alone
// (resourceVersion=0) is within twice what it is under the same number of
// ordinary forwarded requests from that tenant (on this machine's two
// cores, any concurrent load slows the victim; the attack must cost it no
// more than ordinary load). One p99 over 200 reads is the second-slowest
// read, which a single scheduling hiccup of this shared machine sets: the
// two loads alternate over two rounds and the better p99 of each is
// compared, so a hiccup must strike both rounds of the attack to count.
// The victim's consistent reads, which wait for a probe of kube-apiserver,
// are measured the same way and reported, not bounded: in a run beside
// the rest of the suite their p99 under the attack was 1.04s, about the
// cache's 1s wait timeout before a read is forwarded, against 79ms under
// ordinary load. Bounding what a tenant can make the probes cost is the
// security re-review's work.
func (at *attacks) bogusTokens(t *testing.T) {
	ctx := context.Background()
	base, _ := at.heap(t, ctx)
	hc := vipClient(t, at.nobody, true)
	configmaps := "/api/v1/namespaces/" + cacheNS + "/configmaps"
	services := "/api/v1/namespaces/" + cacheNS + "/services"

	const rounds = 2
	var ordinary, bogus, ordinaryConsistent, bogusConsistent []time.Duration
	var ordinaryCodes, codes map[int]int
	var reviews, throttled float64
	var victimHits []float64
	var took time.Duration
	for round := range rounds {
		// Ordinary load: the tenant's own token, a read the cache does
		// not cover; kube-apiserver answers 403.
		p99, c := at.underLoad(t, ctx, hc, configmaps, func(int) string { return at.nobody.Token })
		ordinary, ordinaryConsistent = append(ordinary, p99.cached), append(ordinaryConsistent, p99.consistent)
		ordinaryCodes = mergeCodes(ordinaryCodes, c)

		before := scrapeAgent(t, ctx, at.a)
		start := time.Now()
		p99, c = at.underLoad(t, ctx, hc, services,
			func(i int) string { return fmt.Sprintf("bogus-%d-%d-%d", start.UnixNano(), round, i) })
		took += time.Since(start)
		after := scrapeAgent(t, ctx, at.a)
		bogus, bogusConsistent = append(bogus, p99.cached), append(bogusConsistent, p99.consistent)
		victimHits = append(victimHits, p99.cachedHits)
		codes = mergeCodes(codes, c)
		reviews += sumWhere(after["kube_apicache_access_reviews_total"], map[string]string{"review": "token"}) -
			sumWhere(before["kube_apicache_access_reviews_total"], map[string]string{"review": "token"})
		throttled += sumWhere(after["kube_apicache_access_reviews_throttled_total"], map[string]string{"review": "token"}) -
			sumWhere(before["kube_apicache_access_reviews_throttled_total"], map[string]string{"review": "token"})
	}
	sent := 0
	for _, n := range codes {
		sent += n
	}
	figuref(t, "attacks/%s: %d bogus tokens in %v over %d rounds: %v TokenReviews sent, %v throttled and forwarded; answers %v",
		t.Name(), sent, took.Round(time.Millisecond), rounds, reviews, throttled, codes)
	best, bestOrdinary := slices.Min(bogus), slices.Min(ordinary)
	figuref(t, "attacks/%s: victim's cached-read (resourceVersion=0) p99 under %v ordinary forwarded requests %v (best of %v), under the bogus tokens %v (best of %v; ratio to ordinary %.2f); cache hits %v of %d per round",
		t.Name(), ordinaryCodes, bestOrdinary.Round(time.Microsecond), roundDurations(ordinary),
		best.Round(time.Microsecond), roundDurations(bogus), float64(best)/float64(bestOrdinary), victimHits, victimSamples)
	figuref(t, "attacks/%s: victim's consistent-read p99 quiet %v, under ordinary forwarded requests %v (best of %v), under the bogus tokens %v (best of %v; ratio to ordinary %.2f; reported, not bounded)",
		t.Name(), at.quiet.Round(time.Microsecond), slices.Min(ordinaryConsistent).Round(time.Microsecond), roundDurations(ordinaryConsistent),
		slices.Min(bogusConsistent).Round(time.Microsecond), roundDurations(bogusConsistent),
		float64(slices.Min(bogusConsistent))/float64(slices.Min(ordinaryConsistent)))
	// What the agent owes the victim under bogus tokens is its own
	// reviews (its token was seen valid: never the tenant's budget) and
	// so cache hits. Its latency also pays for kube-apiserver
	// authenticating every bogus token on the same two cores, so the
	// ratio has a floor of this machine's size.
	for round, hits := range victimHits {
		if int(hits) < victimSamples {
			t.Errorf("round %d: %v of the victim's %d cached reads were cache hits under the bogus tokens, want all", round, hits, victimSamples)
		}
	}
	if best > 2*bestOrdinary && best > 100*time.Millisecond {
		t.Errorf("victim's cached-read p99 under the bogus tokens %v (best of %d rounds), more than twice its p99 under ordinary load %v", best, rounds, bestOrdinary)
	}
	// The tenant's share: the burst plus the rate over the attack, and a
	// few reviews the victim may need meanwhile (from its own share). The
	// share refills between rounds (at most the burst again).
	if share := rounds*(30+4) + 5*took.Seconds(); reviews > share {
		t.Errorf("%v TokenReviews for one tenant's bogus tokens, want at most its share %.0f", reviews, share)
	}
	if codes[http.StatusUnauthorized] != sent {
		t.Errorf("answers to bogus tokens %v, want 401 from kube-apiserver for all", codes)
	}
	at.checkHeap(t, ctx, "after the attack", base)
}

// mergeCodes adds the answers by code of b to a, which may be nil.
func mergeCodes(a, b map[int]int) map[int]int {
	if a == nil {
		a = map[int]int{}
	}
	for code, n := range b {
		a[code] += n
	}
	return a
}

// roundDurations formats one duration per round, rounded for a figure.
func roundDurations(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Microsecond).String()
	}
	return out
}

// victimP99s are the victim's p99 of cached reads served by the agent
// alone (resourceVersion=0) and of consistent reads (after a probe).
type victimP99s struct {
	cached, consistent time.Duration
	// cachedHits counts the cache hits while the cached reads were
	// measured: the tenant's own requests are never hits.
	cachedHits float64
}

// underLoad measures the victim's p99s while the tenant's client sends
// GETs of path, 20 at a time, each with token(i); it returns them and the
// tenant's answers by status.
func (at *attacks) underLoad(t *testing.T, ctx context.Context, hc *http.Client, path string, token func(int) string) (victimP99s, map[int]int) {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan struct{})
	codes := map[int]int{}
	go func() {
		defer close(done)
		var mu sync.Mutex
		for i := 0; i < 5000; i += 20 {
			select {
			case <-stop:
				if i >= 300 {
					return
				}
			default:
			}
			var wg sync.WaitGroup
			for j := range 20 {
				wg.Go(func() {
					code, _ := at.send(ctx, hc, http.MethodGet, path, token(i+j), nil)
					mu.Lock()
					codes[code]++
					mu.Unlock()
				})
			}
			wg.Wait()
		}
	}()
	time.Sleep(100 * time.Millisecond)
	var p victimP99s
	hits := readCacheMetrics(t, ctx, at.a).outcomes["hit"]
	p.cached = at.victimP99Of(t, ctx, nodePods+"&resourceVersion=0")
	p.cachedHits = readCacheMetrics(t, ctx, at.a).outcomes["hit"] - hits
	p.consistent = at.victimP99(t, ctx)
	close(stop)
	<-done
	return p, codes
}

// unreadWatchLists: given 300 pods on this node with 8 KiB of annotations
// each, when a pod allowed to read them opens 50 protobuf watch-lists over
// HTTP/2 with a 64 KiB receive window and never reads them, then the
// agent's heap stays bounded while they hang, and the streams are ended
// at the initial events' write timeout.
func (at *attacks) unreadWatchLists(t *testing.T) {
	ctx := context.Background()
	const pods = 300
	big := strings.Repeat("x", 8<<10)
	for i := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bulk-%03d", i), Annotations: map[string]string{"bulk": big}},
			Spec: corev1.PodSpec{NodeName: sandbox.NodeName,
				Containers: []corev1.Container{{Name: "main", Image: "sandbox.invalid/none:latest"}}},
		}
		if _, err := at.c.Admin.CoreV1().Pods(cacheNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	defer func() {
		_ = at.c.Admin.CoreV1().Pods(cacheNS).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)},
			metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName, LabelSelector: "!app"})
	}()
	waitFor(t, time.Minute, "the bulk pods in the cache", func() bool {
		code, body := at.send(ctx, at.victimClient, http.MethodGet, nodePods+"&resourceVersion=0", at.victim.Token, nil)
		return code == http.StatusOK && strings.Count(string(body), `"bulk-`) >= pods
	})
	// Measure after the cache holds them, so the baselines include them.
	base, _ := at.heap(t, ctx)
	quiet := at.victimP99(t, ctx)

	tr := &http.Transport{DialContext: at.victim.NetNS.DialContext, TLSClientConfig: &tls.Config{RootCAs: podCAPool(t, at.victim)},
		ForceAttemptHTTP2: true, HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 10 * 100}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	q := url.Values{"watch": {"true"}, "fieldSelector": {"spec.nodeName=" + sandbox.NodeName}, "sendInitialEvents": {"true"},
		"allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}
	// The streams must not outlive the agent's write timeout by much: once
	// read, an uncut one goes on as a watch.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Second)
	defer cancel()
	opened := time.Now()
	var open []*http.Response
	for range 50 {
		req, _ := http.NewRequestWithContext(wctx, http.MethodGet, vipURL("/api/v1/pods?"+q.Encode()), nil)
		req.Header.Set("Authorization", "Bearer "+at.victim.Token)
		req.Header.Set("Accept", runtime.ContentTypeProtobuf)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("watch-list: %d", resp.StatusCode)
		}
		open = append(open, resp)
	}
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	time.Sleep(2 * time.Second)
	at.checkHeap(t, ctx, "while 50 watch-lists of 2.4 MiB are unread", base)
	at.checkVictimAgainst(t, ctx, "during", quiet)

	// Then each stream is ended (reset) once a write has waited the
	// initial events' write timeout (30s): read after that, it fails short
	// of the whole snapshot.
	time.Sleep(time.Until(opened.Add(35 * time.Second)))
	start := time.Now()
	cut := 0
	for _, r := range open {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil || n < int64(pods*len(big)) {
			cut++
		}
	}
	figuref(t, "attacks/%s: %d of 50 unread watch-lists were ended by the agent (read in %v)", t.Name(), cut, time.Since(start).Round(time.Millisecond))
	if cut != len(open) {
		t.Errorf("%d of %d unread watch-lists were ended, want all", cut, len(open))
	}
	at.checkHeap(t, ctx, "after the attack", base)
}
