package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The agent's review budget for new tokens on its metrics listener
// (agent/internal/metricsserver/auth.go).
const (
	metricsReviewQPS   = 0.2
	metricsReviewBurst = 5
)

// TestMetricsAccessControl checks the agent's metrics listener as an
// in-cluster Prometheus and a tenant on the pod network meet it: HTTPS,
// tokens checked with kube-apiserver, RBAC deciding, the health paths open,
// and made-up tokens unable to make the agent flood kube-apiserver with
// TokenReviews.
func TestMetricsAccessControl(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := startAgent(t, ctx, c)
	get := func(path, token string) (int, string) {
		t.Helper()
		code, b, err := sandbox.AgentGetWithToken(ctx, c.Node, sandbox.AgentMetricsAddr, path, token, 10*time.Second)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return code, string(b)
	}

	// Given a scraper whose ServiceAccount is bound to
	// kube-apicache:metrics-reader, it reads /metrics over HTTPS.
	scraper, err := c.ScraperToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get("/metrics", scraper); code != http.StatusOK || !strings.Contains(body, "kube_apicache_intercepting 1") {
		t.Fatalf("scrape with the metrics-reader token = %d %.200q, want 200 with the metrics", code, body)
	}
	// A ServiceAccount without the grant is authenticated and forbidden.
	const tenantNS = "e2e-metrics-tenant"
	if err := c.EnsureServiceAccount(ctx, tenantNS, "app"); err != nil {
		t.Fatal(err)
	}
	tenant, _, err := c.ServiceAccountToken(ctx, tenantNS, "app")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get("/metrics", tenant); code != http.StatusForbidden || !strings.Contains(body, "system:serviceaccount:"+tenantNS+":app") {
		t.Errorf("scrape with a token RBAC does not allow = %d %.200q, want 403 naming the user", code, body)
	}
	// Without a token: anonymous, forbidden /metrics, open health paths.
	if code, body := get("/metrics", ""); code != http.StatusForbidden || !strings.Contains(body, "system:anonymous") {
		t.Errorf("anonymous scrape = %d %.200q, want 403 for system:anonymous", code, body)
	}
	for _, p := range []string{"/healthz", "/livez", "/readyz", "/intercepting"} {
		if code, body := get(p, ""); code != http.StatusOK {
			t.Errorf("anonymous GET %s = %d %q, want 200", p, code, body)
		}
	}
	// /statusz is a z-page: the shipped status-reader ServiceAccount reads
	// it, anonymous callers, tenants and the scraper (allowed /metrics
	// only) are refused.
	statusToken, err := c.StatusToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(status.StatuszPath, statusToken); code != http.StatusOK || !strings.Contains(body, `"node":"`+sandbox.NodeName+`"`) {
		t.Errorf("GET %s as %s = %d %.200q, want 200 with the node's Status", status.StatuszPath, sandbox.StatusServiceAccount, code, body)
	}
	for who, token := range map[string]string{"system:anonymous": "", "system:serviceaccount:" + tenantNS + ":app": tenant, "system:serviceaccount:" + sandbox.AgentNamespace + ":" + sandbox.ScraperServiceAccount: scraper} {
		if code, body := get(status.StatuszPath, token); code != http.StatusForbidden || !strings.Contains(body, who) {
			t.Errorf("GET %s as %s = %d %.200q, want 403 naming the user", status.StatuszPath, who, code, body)
		}
	}
	// Profiles are not served without --profiling.
	if code, _ := get("/debug/pprof/heap", scraper); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/heap without --profiling = %d, want 404", code)
	}

	// When a tenant sends a burst of made-up tokens,
	reviewsBefore, throttledBefore := metricsListenerFigures(t, ctx, a)
	apiBefore := apiserverTokenReviews(t, ctx, c)
	const burst, workers = 300, 20
	codes := map[int]int{}
	var mu sync.Mutex
	var throttledBody string
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < burst; i += workers {
				code, b, err := sandbox.AgentGetWithToken(ctx, c.Node, sandbox.AgentMetricsAddr, "/metrics", fmt.Sprintf("made-up-%d-%d", time.Now().UnixNano(), i), 10*time.Second)
				mu.Lock()
				if err != nil {
					codes[0]++
				} else {
					codes[code]++
					if code == http.StatusTooManyRequests {
						throttledBody = string(b)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	reviewsAfter, throttledAfter := metricsListenerFigures(t, ctx, a)
	apiAfter := apiserverTokenReviews(t, ctx, c)
	sent := reviewsAfter - reviewsBefore
	budget := metricsReviewBurst + math.Ceil(metricsReviewQPS*elapsed.Seconds()) + 1
	figuref(t, "metrics: %d made-up tokens in %s: %d answered 401, %d 429, %d failed; the agent sent %.0f TokenReviews (budget %.0f), kube-apiserver counted %.0f",
		burst, elapsed.Round(time.Millisecond), codes[http.StatusUnauthorized], codes[http.StatusTooManyRequests], codes[0], sent, budget, apiAfter-apiBefore)
	// then each got 401 (reviewed and rejected) or 429 (not reviewed),
	if codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != burst {
		t.Errorf("answers by code %v, want only 401 and 429", codes)
	}
	if codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("no request was throttled: %v", codes)
	}
	var st metav1.Status
	if err := json.Unmarshal([]byte(throttledBody), &st); codes[http.StatusTooManyRequests] > 0 && (err != nil || st.Reason != metav1.StatusReasonTooManyRequests) {
		t.Errorf("429 body %.200q is not a TooManyRequests Status", throttledBody)
	}
	// the agent sent no more TokenReviews than its token bucket allows,
	if sent > budget || float64(codes[http.StatusUnauthorized]) > budget {
		t.Errorf("%.0f TokenReviews sent (%d answered 401) in %s, want at most %.0f", sent, codes[http.StatusUnauthorized], elapsed, budget)
	}
	// and kube-apiserver saw no more than that (the sandbox sends it no
	// other TokenReviews meanwhile; a few of its own are allowed for).
	if got := apiAfter - apiBefore; got > sent+5 {
		t.Errorf("kube-apiserver counted %.0f TokenReviews during the burst, the agent %.0f", got, sent)
	}
	if got := throttledAfter - throttledBefore; got != float64(codes[http.StatusTooManyRequests]) {
		t.Errorf("throttled counter moved by %v, want %d", got, codes[http.StatusTooManyRequests])
	}
	// Meanwhile the scraper, whose token is cached, is still served, and
	// so are the kubelet's probes.
	if code, _ := get("/metrics", scraper); code != http.StatusOK {
		t.Errorf("scrape right after the burst = %d, want 200", code)
	}
	if code, _ := get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz right after the burst = %d, want 200", code)
	}
}

// TestApproverMetricsAccessControl checks the approver's metrics listener
// as the approver PodMonitor and a tenant meet it: HTTPS, tokens checked
// with kube-apiserver under the approver's own RBAC (approver.yaml), RBAC
// deciding, the probes open.
func TestApproverMetricsAccessControl(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Given an approver replica (leading or standing by: its listener is
	// the same),
	pod, proc := startApproverReplica(t, ctx, c)
	var code int
	var body string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if done, err := proc.Exited(); done {
			return false, fmt.Errorf("approver exited (%v): %s", err, tailLines(proc.Log(), 20))
		}
		var err error
		code, body, err = approverGet(ctx, pod, "/healthz", "")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the approver's listener never answered: %v", err)
	}
	// when the kubelet probes without credentials, it is answered,
	if code != http.StatusOK {
		t.Errorf("anonymous /healthz = %d %q, want 200", code, body)
	}
	// (/readyz answers 503 to anyone while the leader's CSR informer
	// syncs: what matters here is that it answers without credentials)
	for _, p := range []string{"/livez", "/readyz"} {
		code, body, err := approverGet(ctx, pod, p, "")
		if err != nil || (code != http.StatusOK && !(p == "/readyz" && code == http.StatusServiceUnavailable)) {
			t.Errorf("anonymous GET %s = %d %q (%v), want it answered", p, code, body, err)
		}
	}
	// an anonymous scrape is forbidden,
	if code, body, err := approverGet(ctx, pod, "/metrics", ""); err != nil || code != http.StatusForbidden || !strings.Contains(body, "system:anonymous") {
		t.Errorf("anonymous scrape = %d %.200q (%v), want 403 for system:anonymous", code, body, err)
	}
	// a made-up token is unauthenticated,
	if code, body, err := approverGet(ctx, pod, "/metrics", "made-up"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("scrape with a made-up token = %d %.200q (%v), want 401", code, body, err)
	}
	// a ServiceAccount without the grant is forbidden,
	const tenantNS = "e2e-metrics-tenant"
	if err := c.EnsureServiceAccount(ctx, tenantNS, "app"); err != nil {
		t.Fatal(err)
	}
	tenant, _, err := c.ServiceAccountToken(ctx, tenantNS, "app")
	if err != nil {
		t.Fatal(err)
	}
	if code, body, err := approverGet(ctx, pod, "/metrics", tenant); err != nil || code != http.StatusForbidden || !strings.Contains(body, "system:serviceaccount:"+tenantNS+":app") {
		t.Errorf("scrape with a token RBAC does not allow = %d %.200q (%v), want 403 naming the user", code, body, err)
	}
	// then a scraper bound to kube-apicache:metrics-reader reads the
	// approver's metrics.
	scraper, err := c.ScraperToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, body, err := approverGet(ctx, pod, "/metrics", scraper); err != nil || code != http.StatusOK ||
		!strings.Contains(body, "kube_apicache_approver_leader") || !strings.Contains(body, "kube_apicache_build_info{") {
		t.Errorf("scrape with the metrics-reader token = %d %.200q (%v), want 200 with the approver's metrics and its build information", code, body, err)
	}
}

// metricsListenerFigures returns the TokenReviews the agent's metrics
// listener has sent and the requests it has throttled.
func metricsListenerFigures(t *testing.T, ctx context.Context, a *sandbox.Agent) (tokenReviews, throttled float64) {
	t.Helper()
	m := scrapeAgent(t, ctx, a)
	return sumWhere(m["kube_apicache_metrics_reviews_total"], map[string]string{"kind": "tokenreview"}),
		sumWhere(m["kube_apicache_metrics_refused_requests_total"], map[string]string{"reason": "throttled"})
}

// apiserverTokenReviews sums the TokenReviews every kube-apiserver of the
// sandbox has answered (apiserver_request_total).
func apiserverTokenReviews(t *testing.T, ctx context.Context, c *sandbox.Cluster) float64 {
	t.Helper()
	return sumAPIServerMetric(t, ctx, c, "apiserver_request_total", map[string]string{"resource": "tokenreviews"})
}
