package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// Figures of the degraded-mode scenario.
const (
	// degradedOutage is how long every apiserver stays killed.
	degradedOutage = 60 * time.Second
	// degradedTTL is the agent's --degraded-decision-ttl here: longer than
	// the outage, so that the reader's decisions (made at most about 10s
	// before it) last through it, and short enough that a decision made
	// 45s before the outage runs out within it.
	degradedTTL = 75 * time.Second
	// revokedIdle is how long before the outage the revoked pod last read
	// (and kube-apiserver last allowed it).
	revokedIdle = 45 * time.Second
	degradedNS  = "e2e-degraded"
)

// readOutcome is one read through the agent.
type readOutcome struct {
	at   time.Time
	path string
	code int
	err  error
	took time.Duration
}

// readLoop reads paths in turn through the agent every interval until
// stopped, and records every outcome.
type readLoop struct {
	stop func()
	done chan struct{}

	mu  sync.Mutex // protects out
	out []readOutcome
}

func startReadLoop(t *testing.T, pod *sandbox.Pod, interval time.Duration, paths ...string) *readLoop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &readLoop{stop: cancel, done: make(chan struct{})}
	client := vipClient(t, pod, true)
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			path := paths[i%len(paths)]
			code, _, took, err := podGet(ctx, client, pod, http.MethodGet, path, nil)
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			l.out = append(l.out, readOutcome{at: time.Now(), path: path, code: code, err: err, took: took})
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-l.done })
	return l
}

// outcomes returns the reads made between from and to.
func (l *readLoop) outcomes(from, to time.Time) []readOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []readOutcome
	for _, o := range l.out {
		if !o.at.Before(from) && o.at.Before(to) {
			out = append(out, o)
		}
	}
	return out
}

// podGet sends one request with the pod's token and returns the status
// code, body and how long it took.
func podGet(ctx context.Context, client *http.Client, pod *sandbox.Pod, method, url string, body io.Reader) (int, []byte, time.Duration, error) {
	if !strings.HasPrefix(url, "https://") {
		url = vipURL(url)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+pod.Token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, time.Since(start), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, time.Since(start), err
}

// statusOf decodes a metav1.Status answer ("" reason if it is none).
func statusOf(b []byte) metav1.Status {
	var st metav1.Status
	_ = json.Unmarshal(b, &st)
	return st
}

// TestDegradedMode is the outage of every kube-apiserver.
//
// Given an agent with --degraded-decision-ttl=75s caching pods, services and
// a custom resource, a reader pod that reads this node's pods, services and
// widgets through it (so it holds recent allow decisions) and runs
// informers, a pod whose RoleBinding is deleted just before the outage and
// that kube-apiserver last allowed 45s before it, and a new pod that never
// made a request,
// when every apiserver is SIGKILLed for 60s,
// then the agent enters degraded mode and says so on /readyz and its
// metrics; every read of the reader is answered; the new pod's read fails
// as kube-apiserver's absence makes it fail; writes get 503 with
// Retry-After within 1s; consistent reads get the 504 timeout status; the
// revoked pod is answered at most --degraded-decision-ttl after its last
// allow decision, and so after the revocation;
// and when the apiservers are back, the agent leaves degraded mode and the
// informers converge with at most one relist each.
func TestDegradedMode(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	dc := dynamic.NewForConfigOrDie(c.AdminConfig)

	// Given the custom resource and the pods,
	createWidgetCRD(t, ctx, c)
	widgetRule := rbacv1.PolicyRule{APIGroups: []string{widgetsGVR.Group}, Resources: []string{"widgets"}, Verbs: readVerbs}
	grantClusterRead(t, ctx, c, "e2e-degraded-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace}, widgetRule)
	reader := newClientPod(t, ctx, c, degradedNS, "reader")
	grantClusterRead(t, ctx, c, "e2e-degraded-reader",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "reader", Namespace: degradedNS},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "services"}, Verbs: readVerbs}, widgetRule)
	revoked, err := c.NewPod(ctx, sandbox.PodSpec{Name: "revoked", Namespace: degradedNS, ServiceAccount: "revoked"})
	if err != nil {
		t.Fatal(err)
	}
	if err := revoked.Grant(ctx, "view"); err != nil {
		t.Fatal(err)
	}
	newcomer, err := c.NewPod(ctx, sandbox.PodSpec{Name: "newcomer", Namespace: degradedNS, ServiceAccount: "newcomer"})
	if err != nil {
		t.Fatal(err)
	}
	if err := newcomer.Grant(ctx, "view"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*sandbox.Pod{reader, revoked, newcomer} {
		if err := p.WaitAllowed(ctx, "list", "services"); err != nil {
			t.Fatal(err)
		}
	}
	createServices(t, ctx, c, degradedNS, "svc", 3)
	for i := range 3 {
		if _, err := dc.Resource(widgetsGVR).Namespace(degradedNS).Create(ctx, widgetObject(fmt.Sprintf("w%d", i), "red", int64(i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	a := startAgent(t, ctx, c, "--cache-resources="+cache.DefaultResources+",widgets."+widgetsGVR.Group+"/v1",
		fmt.Sprintf("--degraded-decision-ttl=%s", degradedTTL))
	waitCacheSynced(t, ctx, a)
	waitResourceSynced(t, ctx, a, "widgets."+widgetsGVR.Group)

	nodePods := "/api/v1/pods?fieldSelector=spec.nodeName%3D" + sandbox.NodeName + "&resourceVersion=0"
	services := "/api/v1/namespaces/" + degradedNS + "/services?resourceVersion=0"
	widgets := "/apis/" + widgetsGVR.Group + "/v1/namespaces/" + degradedNS + "/widgets?resourceVersion=0"

	// The revoked pod reads, and is allowed, now; then it is idle.
	revokedClient := vipClient(t, revoked, true)
	var revokedLastAllowed time.Time
	for range 3 {
		code, b, _, err := podGet(ctx, revokedClient, revoked, http.MethodGet, services, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("revoked pod's read before revocation: %d %v %.200s", code, err, b)
		}
		revokedLastAllowed = time.Now()
		time.Sleep(200 * time.Millisecond)
	}

	// The reader's informers (watch-list, served from the cache) and its
	// counting informer for services.
	informers := startInformerSet(t, ctx, reader, "reader informers", true)
	if _, err := informers.waitLine("SYNCED", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	relists := startPodClient(t, reader, "relists", "--resource", "services")
	if err := relists.wait("SYNCED", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, ctx, c, dc, informers)
	loop := startReadLoop(t, reader, 200*time.Millisecond, nodePods, services, widgets)
	// Metrics are scraped with a token whose review the agent keeps for
	// minutes, so they are readable during the outage.
	_ = agentMetrics(t, ctx, a)

	// Just before the outage, the revoked pod's RoleBinding goes.
	time.Sleep(time.Until(revokedLastAllowed.Add(revokedIdle)))
	if err := c.Admin.RbacV1().RoleBindings(degradedNS).Delete(ctx, "revoked-view", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()

	// When every apiserver is killed,
	all := c.APIServers()
	killedAt := time.Now()
	restart := killAllAPIServers(t, c)
	figuref(t, "degraded: apiservers killed %s after the revocation", killedAt.Sub(revokedAt).Round(time.Millisecond))

	// then the agent enters degraded mode and says so,
	var ready string
	enteredAfter := waitFor(t, 30*time.Second, "/readyz saying degraded", func() bool {
		_, ready, _ = agentEndpoint(ctx, c, "/readyz")
		return strings.Contains(ready, "degraded since")
	})
	figuref(t, "degraded: /readyz said degraded %s after the kill: %q", enteredAfter.Round(10*time.Millisecond), ready)
	if text, err := a.Metrics(ctx); err != nil {
		t.Logf("metrics not readable during the outage: %v", err)
	} else if v := gaugeValue(t, text, "kube_apicache_degraded"); v != 1 {
		t.Errorf("kube_apicache_degraded %v during the outage, want 1", v)
	} else {
		since := gaugeValue(t, text, "kube_apicache_degraded_since_timestamp_seconds")
		figuref(t, "degraded: metrics kube_apicache_degraded 1, since %s", time.Unix(int64(since), 0).UTC().Format(time.RFC3339))
	}

	// writes fail fast with 503 and Retry-After,
	writer := vipClient(t, reader, true)
	var worstWrite time.Duration
	for i := range 5 {
		body := strings.NewReader(fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"during-outage-%d"}}`, i))
		code, b, took, err := podGet(ctx, writer, reader, http.MethodPost, "/api/v1/namespaces/"+degradedNS+"/configmaps", body)
		worstWrite = max(worstWrite, took)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("write during the outage: %d %v %.200s, want 503", code, err, b)
		}
		if took > time.Second {
			t.Errorf("write answered after %s, want within 1s", took)
		}
	}
	figuref(t, "degraded: 5 writes answered 503 (Retry-After) in at most %s", worstWrite.Round(time.Millisecond))

	// consistent reads get kube-apiserver's timeout status,
	code, b, took, err := podGet(ctx, writer, reader, http.MethodGet, "/api/v1/namespaces/"+degradedNS+"/services", nil)
	if st := statusOf(b); err != nil || code != http.StatusGatewayTimeout || st.Reason != metav1.StatusReasonTimeout {
		t.Errorf("consistent read during the outage: %d %v %.200s, want 504 Timeout", code, err, b)
	}
	figuref(t, "degraded: a consistent list got %d %s in %s", code, statusOf(b).Reason, took.Round(time.Millisecond))

	// and a pod with no decision yet fails as it would straight at
	// kube-apiserver.
	newClient := vipClient(t, newcomer, true)
	code, b, _, err = podGet(ctx, newClient, newcomer, http.MethodGet, services, nil)
	if err == nil && code == http.StatusOK {
		t.Errorf("a new pod's read was answered during the outage: a decision was invented")
	}
	viaAgent := fmt.Sprintf("%d %s", code, statusOf(b).Reason)
	if err != nil {
		viaAgent = err.Error()
	}
	dcode, _, _, derr := podGet(ctx, newClient, newcomer, http.MethodGet, all[0].URL+services, nil)
	direct := fmt.Sprint(dcode)
	if derr != nil {
		direct = derr.Error()
	}
	figuref(t, "degraded: a new pod's read through the agent: %s; straight at kube-apiserver: %s", viaAgent, direct)

	// The revoked pod reads until it is refused.
	revokedLoop := startReadLoop(t, revoked, 500*time.Millisecond, services)

	time.Sleep(time.Until(killedAt.Add(degradedOutage)))
	outageEnd := time.Now()
	restart(ctx)
	restartedAt := time.Now()
	figuref(t, "degraded: apiservers down %s, restarted in %s", outageEnd.Sub(killedAt).Round(time.Millisecond), restartedAt.Sub(outageEnd).Round(time.Millisecond))

	// Then every read of the reader was answered,
	reads := loop.outcomes(killedAt, outageEnd)
	var failed []string
	perPath := map[string]int{}
	for _, o := range reads {
		if o.err != nil || o.code != http.StatusOK {
			failed = append(failed, fmt.Sprintf("%s +%s %s: %d %v", o.at.Format(time.StampMilli), o.at.Sub(killedAt).Round(time.Millisecond), o.path, o.code, o.err))
		} else {
			perPath[o.path]++
		}
	}
	figuref(t, "degraded: the reader made %d reads during the outage, %d answered (node pods %d, services %d, widgets %d)",
		len(reads), len(reads)-len(failed), perPath[nodePods], perPath[services], perPath[widgets])
	if len(failed) > 0 {
		t.Errorf("%d reads failed during the outage:\n%s", len(failed), strings.Join(lastN(failed, 20), "\n"))
	}
	if len(reads) < 100 {
		t.Errorf("only %d reads during the outage", len(reads))
	}

	// the revoked pod was answered at most the TTL after its last allow,
	var lastHonoured, firstRefused time.Time
	var refusal string
	for _, o := range revokedLoop.outcomes(killedAt, outageEnd) {
		if o.err == nil && o.code == http.StatusOK {
			lastHonoured = o.at
		} else if firstRefused.IsZero() {
			firstRefused, refusal = o.at, fmt.Sprint(o.code, o.err)
		}
	}
	revokedLoop.stop()
	figuref(t, "degraded: revoked pod last allowed %s before the revocation; honoured until +%s after the revocation, refused from +%s (%s); --degraded-decision-ttl %s",
		revokedAt.Sub(revokedLastAllowed).Round(time.Millisecond), lastHonoured.Sub(revokedAt).Round(time.Millisecond),
		firstRefused.Sub(revokedAt).Round(time.Millisecond), refusal, degradedTTL)
	if !lastHonoured.IsZero() && lastHonoured.Sub(revokedLastAllowed) > degradedTTL {
		t.Errorf("the revoked pod was answered %s after its last allow, more than --degraded-decision-ttl %s", lastHonoured.Sub(revokedLastAllowed), degradedTTL)
	}
	if lastHonoured.Sub(revokedAt) > degradedTTL {
		t.Errorf("the revoked pod was answered %s after the revocation, more than --degraded-decision-ttl", lastHonoured.Sub(revokedAt))
	}
	if firstRefused.IsZero() {
		t.Errorf("the revoked pod was never refused during the outage")
	}

	// and once the apiservers answer, the agent leaves degraded mode,
	left := waitFor(t, 90*time.Second, "/readyz no longer degraded", func() bool {
		code, ready, _ = agentEndpoint(ctx, c, "/readyz")
		return code == http.StatusOK && !strings.Contains(ready, "degraded")
	})
	figuref(t, "degraded: left degraded mode %s after the apiservers answered /readyz", left.Round(10*time.Millisecond))
	// The log says when it entered and left.
	agentLog := a.Process.Log()
	for _, want := range []string{"Entering degraded mode", "Leaving degraded mode"} {
		if !strings.Contains(agentLog, want) {
			t.Errorf("the agent's log does not say %q", want)
		}
	}
	for _, l := range strings.Split(agentLog, "\n") {
		if strings.Contains(l, "degraded mode") {
			figuref(t, "degraded: log: %.400s", l)
		}
	}
	loop.stop()

	// the informers converge with at most one relist each,
	createServices(t, ctx, c, degradedNS, "after-outage", 1)
	if _, err := dc.Resource(widgetsGVR).Namespace(degradedNS).Create(ctx, widgetObject("after-outage", "blue", 9), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	figuref(t, "degraded: informers converged %s after the recovery", waitConverged(t, ctx, c, dc, informers).Round(time.Millisecond))
	if err := relists.wait("ADDED after-outage", 90*time.Second); err != nil {
		t.Errorf("services informer did not see a service created after the outage: %v", err)
	}
	relists.stop(t)
	log := relists.log()
	podRelists := strings.Count(log, "LIST ") + strings.Count(log, "WATCH initial=true") - 1
	figuref(t, "degraded: the pod's services informer relisted %d times, resumed %d watches", podRelists, strings.Count(log, "WATCH initial=false"))
	if podRelists > 1 {
		t.Errorf("the pod's services informer relisted %d times:\n%s", podRelists, log)
	}
	agentRel := agentRelists(t, c, killedAt)
	figuref(t, "degraded: the agent's own lists and watch-lists after the outage, by informer: %v", agentRel)
	for inf, n := range agentRel {
		if n > 1 {
			t.Errorf("the agent's informer %s relisted %d times", inf, n)
		}
	}
}

// killAllAPIServers SIGKILLs every apiserver and returns a func that starts
// them again (once; it also runs when the test ends).
func killAllAPIServers(t *testing.T, c *sandbox.Cluster) func(context.Context) {
	t.Helper()
	all := c.APIServers()
	for _, as := range all {
		if err := as.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for _, as := range all {
		_ = as.Process.Wait(10 * time.Second)
	}
	var once sync.Once
	restart := func(ctx context.Context) {
		once.Do(func() {
			errs := make(chan error, len(all))
			for _, as := range all {
				go func() { errs <- c.StartAPIServer(ctx, as) }()
			}
			for range all {
				if err := <-errs; err != nil {
					t.Errorf("restarting apiservers: %v", err)
				}
			}
			// Not done until kube-controller-manager works again: the
			// next scenario's namespaces need their ServiceAccounts.
			start := time.Now()
			if err := c.WaitControllersWorking(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("after restarting the apiservers: %v", err)
				return
			}
			t.Logf("after restarting the apiservers, kube-controller-manager acted on a new namespace within %s", time.Since(start).Round(time.Millisecond))
		})
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		restart(ctx)
	})
	return restart
}

// TestDegradedAgentKilled: fail-open holds in degraded mode.
//
// Given an agent in degraded mode (every apiserver killed) and a pod that
// reads through it,
// when the agent is SIGKILLed,
// then its liveness entry expires within --fail-open-timeout and the pod's
// new connections take kube-proxy's path, where they fail as they would
// without the agent (connection refused); once the apiservers are back,
// the pod reads through kube-proxy's path.
func TestDegradedAgentKilled(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-degraded-killed", "client")
	a := startAgent(t, ctx, c)
	waitCacheSynced(t, ctx, a)
	services := "/api/v1/namespaces/e2e-degraded-killed/services?resourceVersion=0"
	// One connection per request, so that each takes the path of the
	// moment.
	client := vipClient(t, pod, false)
	for range 3 {
		if code, b, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil); err != nil || code != http.StatusOK {
			t.Fatalf("read before the outage: %d %v %.200s", code, err, b)
		}
	}

	restart := killAllAPIServers(t, c)
	waitFor(t, 30*time.Second, "/readyz saying degraded", func() bool {
		_, ready, _ := agentEndpoint(ctx, c, "/readyz")
		return strings.Contains(ready, "degraded since")
	})
	if code, b, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil); err != nil || code != http.StatusOK {
		t.Fatalf("degraded read: %d %v %.200s", code, err, b)
	}

	// When the agent is killed,
	killed := time.Now()
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// then its entry expires without anyone acting on it,
	for len(liveEntries(t, ctx, c)) > 0 {
		if time.Since(killed) > livenessTimeout+time.Second {
			t.Fatalf("liveness entry still there %s after the kill", time.Since(killed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	expired := time.Since(killed)
	// and the pod's connections go to kube-proxy's path: refused, as
	// without the agent.
	_, _, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("read after the agent died during the outage: %v, want connection refused (kube-proxy's path to dead apiservers)", err)
	}
	figuref(t, "degraded, agent SIGKILLed: liveness entry expired %s after the kill; the pod's next read: %v", expired.Round(time.Millisecond), err)

	// Once the apiservers are back, the pod reads through kube-proxy.
	restart(ctx)
	waitFor(t, 60*time.Second, "a read through kube-proxy's path", func() bool {
		code, _, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil)
		return err == nil && code == http.StatusOK
	})
	cleanNode(t, ctx, c)
}

// TestDegradedStepsAsideForKubeProxy: degraded mode is only for an outage
// the pods would suffer anyway.
//
// Given an agent that loses its own connections to every apiserver (a
// partition between the agent and the endpoints: the node rejects
// connections to them that kube-proxy did not DNAT) while kube-proxy's
// path still reaches them,
// then the agent hands the VIP back to kube-proxy with a reason naming
// kube-proxy's path, never enters degraded mode, and the pod's reads keep
// succeeding on kube-proxy's path; once the partition heals, the agent
// intercepts again.
func TestDegradedStepsAsideForKubeProxy(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-degraded-partition", "client")
	a := startAgent(t, ctx, c)
	waitCacheSynced(t, ctx, a)
	services := "/api/v1/namespaces/e2e-degraded-partition/services?resourceVersion=0"
	client := vipClient(t, pod, false)
	if code, b, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil); err != nil || code != http.StatusOK {
		t.Fatalf("read before the partition: %d %v %.200s", code, err, b)
	}

	// When the agent's own connections to the apiservers are cut,
	var rules [][]string
	for _, as := range c.APIServers() {
		rules = append(rules, []string{"OUTPUT", "-d", as.Addr + "/32", "-p", "tcp", "--dport", "6443",
			"-m", "conntrack", "!", "--ctstate", "DNAT", "-j", "REJECT", "--reject-with", "tcp-reset"})
	}
	healed := false
	heal := func() {
		if healed {
			return
		}
		healed = true
		for _, r := range rules {
			if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-D"}, r...)...); err != nil {
				t.Error(err)
			}
		}
	}
	for _, r := range rules {
		if err := c.Node.Run(ctx, append([]string{"iptables", "-w", "-I"}, r...)...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(heal)
	cut := time.Now()

	// then it steps aside, naming kube-proxy's path,
	var body string
	took := waitFor(t, 60*time.Second, "/intercepting naming kube-proxy's path", func() bool {
		_, body, _ = agentEndpoint(ctx, c, "/intercepting")
		return strings.Contains(body, "kube-proxy's path")
	})
	figuref(t, "partition from the agent only: stepped aside %s after the cut: %q", took.Round(10*time.Millisecond), body)
	// never degraded, and the pod reads on kube-proxy's path.
	var failures int
	for time.Since(cut) < 15*time.Second {
		if _, ready, _ := agentEndpoint(ctx, c, "/readyz"); strings.Contains(ready, "degraded") {
			t.Fatalf("degraded while kube-proxy's path answers: %q", ready)
		}
		if code, _, _, err := podGet(ctx, client, pod, http.MethodGet, services, nil); err != nil || code != http.StatusOK {
			failures++
		}
		time.Sleep(250 * time.Millisecond)
	}
	figuref(t, "partition from the agent only: %d of the pod's reads failed after it stepped aside", failures)
	if failures > 0 {
		t.Errorf("%d reads failed on kube-proxy's path", failures)
	}

	// Once it heals, the agent intercepts again.
	heal()
	waitFor(t, 60*time.Second, "intercepting again", func() bool {
		code, _, _ := agentEndpoint(ctx, c, "/intercepting")
		return code == http.StatusOK
	})
}
