package metricsserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	metricsservertesting "github.com/kube-apicache/kube-apicache/agent/internal/metricsserver/testing"
)

const (
	scraperUser = "system:serviceaccount:monitoring:prometheus"
	tenantUser  = "system:serviceaccount:tenant:app"
)

// newSecureMetricsTest returns the metrics listener's handler chain in front
// of testPaths, whose /healthz and /livez answer healthy, reviewing with a
// fake kube-apiserver and the token bucket limiter.
func newSecureMetricsTest(t *testing.T, limiter *rate.Limiter, healthy func() error, profiling bool) (http.Handler, *metricsservertesting.Reviewer, *metricsAuthMetrics) {
	t.Helper()
	f := &metricsservertesting.Reviewer{
		Users:   map[string]string{"scraper-token": scraperUser, "tenant-token": tenantUser},
		Allowed: map[string][]string{scraperUser: {"/metrics", "/debug/pprof/*"}},
	}
	cfg := f.Start(t)
	reg := prometheus.NewRegistry()
	am := newMetricsAuthMetrics(reg)
	auth, err := newMetricsAuthWith(cfg, testOpenPaths, am, limiter)
	if err != nil {
		t.Fatal(err)
	}
	return auth.secure(testPaths(reg, healthy, profiling), profiling), f, am
}

// testOpenPaths are the open paths of the listener under test.
var testOpenPaths = []string{"/healthz", "/livez", "/readyz"}

// testPaths serves /metrics (the metrics in reg and one gauge of its own),
// /healthz and /livez (healthy), /readyz ("ready") and with profiling the
// pprof endpoints, checking no credentials, as a component's paths do.
func testPaths(reg *prometheus.Registry, healthy func() error, profiling bool) http.Handler {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_component_up", Help: "1."})
	g.Set(1)
	reg.MustRegister(g)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for _, p := range []string{"/healthz", "/livez"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) {
			if err := healthy(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
		})
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ready") })
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	}
	return mux
}

// metricsGet sends one request through h and returns the code and body.
func metricsGet(h http.Handler, method, path, token string) (int, string, http.Header) {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = "10.244.1.7:40000"
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String(), w.Header()
}

// TestMetricsAccess checks who may read what on the metrics listener.
func TestMetricsAccess(t *testing.T) {
	ok := func() error { return nil }
	stuck := func() error { return errors.New("sync loop stuck: last sync finished 3m0s ago") }
	tests := []struct {
		name                string
		healthy             func() error
		profiling           bool
		method, path, token string
		want                int
		// body is a substring the answer must contain.
		body string
	}{{
		// The kubelet probes without credentials.
		name: "anonymous healthz", path: "/healthz", want: http.StatusOK, body: "ok",
	}, {
		name: "anonymous livez", path: "/livez", want: http.StatusOK, body: "ok",
	}, {
		name: "anonymous readyz", path: "/readyz", want: http.StatusOK, body: "ready",
	}, {
		// A failing check fails /healthz, with the reason.
		name: "healthz with a stuck sync loop", healthy: stuck, path: "/healthz", want: http.StatusServiceUnavailable, body: "sync loop stuck",
	}, {
		name: "anonymous metrics", path: "/metrics", want: http.StatusForbidden, body: `"reason":"Forbidden"`,
	}, {
		// Prometheus with a token RBAC allows.
		name: "allowed scraper", path: "/metrics", token: "scraper-token", want: http.StatusOK, body: "# TYPE test_component_up gauge",
	}, {
		name: "authenticated but not allowed", path: "/metrics", token: "tenant-token", want: http.StatusForbidden,
		body: `cannot get path \"/metrics\"`,
	}, {
		name: "made-up token", path: "/metrics", token: "made-up", want: http.StatusUnauthorized, body: `"reason":"Unauthorized"`,
	}, {
		// The health paths answer anyone, with no review of a token sent
		// along: a made-up one costs nothing.
		name: "made-up token on healthz", path: "/healthz", token: "made-up", want: http.StatusOK,
	}, {
		name: "a path not served", path: "/metrics2", token: "scraper-token", want: http.StatusNotFound, body: `"reason":"NotFound"`,
	}, {
		name: "a method not served", method: http.MethodPost, path: "/metrics", token: "scraper-token", want: http.StatusMethodNotAllowed,
		body: `"reason":"MethodNotAllowed"`,
	}, {
		name: "pprof without profiling", path: "/debug/pprof/heap", token: "scraper-token", want: http.StatusNotFound,
	}, {
		name: "anonymous pprof", profiling: true, path: "/debug/pprof/cmdline", want: http.StatusForbidden,
	}, {
		name: "pprof for a caller not allowed", profiling: true, path: "/debug/pprof/cmdline", token: "tenant-token", want: http.StatusForbidden,
	}, {
		name: "allowed pprof", profiling: true, path: "/debug/pprof/cmdline", token: "scraper-token", want: http.StatusOK,
	}, {
		// Made-up profile names are not reviewed, one SAR each.
		name: "unknown profile", profiling: true, path: "/debug/pprof/made-up", token: "scraper-token", want: http.StatusNotFound,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			healthy := tc.healthy
			if healthy == nil {
				healthy = ok
			}
			h, f, _ := newSecureMetricsTest(t, rate.NewLimiter(metricsReviewQPS, metricsReviewBurst), healthy, tc.profiling)
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			code, body, _ := metricsGet(h, method, tc.path, tc.token)
			if code != tc.want || !strings.Contains(body, tc.body) {
				t.Errorf("%s %s = %d %.300q, want %d with %q", method, tc.path, code, body, tc.want, tc.body)
			}
			for _, u := range f.ReviewedUsers() {
				if u == "system:anonymous" || u == "" {
					t.Errorf("an anonymous request cost a SubjectAccessReview")
				}
			}
		})
	}
}

// TestMetricsReviewsCached checks that a scraper costs one TokenReview and
// one SubjectAccessReview however often it scrapes within the cache
// lifetimes, and that anonymous probes cost none.
func TestMetricsReviewsCached(t *testing.T) {
	ok := func() error { return nil }
	h, f, am := newSecureMetricsTest(t, rate.NewLimiter(metricsReviewQPS, metricsReviewBurst), ok, false)
	for range 20 {
		if code, body, _ := metricsGet(h, http.MethodGet, "/metrics", "scraper-token"); code != http.StatusOK {
			t.Fatalf("scrape = %d %q", code, body)
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, _, _ := metricsGet(h, http.MethodGet, p, ""); code != http.StatusOK {
				t.Fatalf("probe of %s = %d", p, code)
			}
		}
		metricsGet(h, http.MethodGet, "/metrics", "")
	}
	if trs, sars := f.Counts(); trs != 1 || sars != 1 {
		t.Errorf("20 scrapes cost %d TokenReviews and %d SubjectAccessReviews, want 1 and 1", trs, sars)
	}
	if got := testutil.ToFloat64(am.reviews.WithLabelValues("tokenreview")); got != 1 {
		t.Errorf("tokenreview count = %v, want 1", got)
	}
	if got := testutil.ToFloat64(am.refused.WithLabelValues("forbidden")); got != 20 {
		t.Errorf("forbidden count = %v, want 20 (the anonymous scrapes)", got)
	}
}

// TestMetricsReviewThrottle checks that made-up tokens cost at most the
// token bucket's reviews, beyond which requests get 429 without a review,
// while a scraper whose token is cached is still served.
func TestMetricsReviewThrottle(t *testing.T) {
	ok := func() error { return nil }
	// Given a bucket of 3 reviews that does not refill, one of them spent
	// on the scraper's token,
	const burst = 3
	h, f, am := newSecureMetricsTest(t, rate.NewLimiter(0, burst), ok, false)
	if code, _, _ := metricsGet(h, http.MethodGet, "/metrics", "scraper-token"); code != http.StatusOK {
		t.Fatalf("first scrape = %d", code)
	}
	// when a tenant sends 50 made-up tokens and repeats one of them,
	codes := map[int]int{}
	var throttled string
	var retryAfter string
	for i := range 50 {
		code, body, hdr := metricsGet(h, http.MethodGet, "/metrics", fmt.Sprintf("made-up-%d", i))
		codes[code]++
		if code == http.StatusTooManyRequests {
			throttled, retryAfter = body, hdr.Get("Retry-After")
		}
	}
	if code, _, _ := metricsGet(h, http.MethodGet, "/metrics", "made-up-0"); code != http.StatusTooManyRequests {
		t.Errorf("a repeated made-up token = %d, want 429: rejections with an error are not cached", code)
	}
	// then only the bucket's remaining reviews were sent,
	if trs, _ := f.Counts(); trs != burst {
		t.Errorf("%d TokenReviews sent, want %d (the bucket)", trs, burst)
	}
	if codes[http.StatusUnauthorized] != burst-1 || codes[http.StatusTooManyRequests] != 50-(burst-1) {
		t.Errorf("answers by code %v, want %d 401 and the rest 429", codes, burst-1)
	}
	// the rest got a 429 Status asking to retry,
	var st metav1.Status
	if err := json.Unmarshal([]byte(throttled), &st); err != nil || st.Reason != metav1.StatusReasonTooManyRequests || st.Code != http.StatusTooManyRequests {
		t.Errorf("429 body %q is not a TooManyRequests Status (%v)", throttled, err)
	}
	if retryAfter != "1" {
		t.Errorf("Retry-After = %q, want 1", retryAfter)
	}
	if got := testutil.ToFloat64(am.refused.WithLabelValues("throttled")); got != 50-(burst-1)+1 {
		t.Errorf("throttled count = %v, want %d", got, 50-(burst-1)+1)
	}
	// and the scraper, whose token is cached, is still served, as are the
	// anonymous probes.
	if code, _, _ := metricsGet(h, http.MethodGet, "/metrics", "scraper-token"); code != http.StatusOK {
		t.Errorf("scrape during the flood = %d, want 200", code)
	}
	if code, _, _ := metricsGet(h, http.MethodGet, "/healthz", ""); code != http.StatusOK {
		t.Errorf("probe during the flood = %d, want 200", code)
	}
}

// TestMetricsServerTLS checks that the metrics listener serves HTTPS with a
// self-signed certificate naming the node and the bound IP, HTTP/1.1 only.
func TestMetricsServerTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: Config{Name: "node-a"}, handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) })}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 1)
	srv, err := s.Start(ctx, l, errs)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The certificate is self-signed: its names are checked below.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}},
		ForceAttemptHTTP2: true,
	}}
	resp, err := client.Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "HTTP/1.1" {
		t.Errorf("protocol %q, want HTTP/1.1", body)
	}
	leaf := resp.TLS.PeerCertificates[0]
	if err := leaf.VerifyHostname("node-a"); err != nil {
		t.Errorf("certificate does not name the node: %v", err)
	}
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("certificate does not name the bound IP: %v", err)
	}
}
