package status

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	metricsservertesting "github.com/kube-apicache/kube-apicache/agent/internal/metricsserver/testing"
)

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

// TestListenerAccess: the agent's health paths and /statusz answer anyone
// with no review, /metrics only a caller RBAC allows.
func TestListenerAccess(t *testing.T) {
	const scraper = "system:serviceaccount:monitoring:prometheus"
	f := &metricsservertesting.Reviewer{
		Users:   map[string]string{"scraper-token": scraper},
		Allowed: map[string][]string{scraper: {"/metrics"}},
	}
	cfg := f.Start(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(BuildInfo())
	ok := func() error { return nil }
	s, err := New(Config{NodeName: "node-a", RESTConfig: func() *rest.Config { return cfg }},
		Checks{Healthy: ok, Ready: ok, Intercepting: ok, Upstreams: func() []UpstreamStatus { return nil }}, reg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, token string
		want              int
		// body is a substring the answer must contain.
		body string
	}{
		{name: "anonymous healthz", path: "/healthz", want: http.StatusOK},
		{name: "anonymous livez", path: "/livez", want: http.StatusOK},
		{name: "anonymous readyz", path: "/readyz", want: http.StatusOK},
		{name: "anonymous intercepting", path: "/intercepting", want: http.StatusOK},
		{name: "anonymous statusz", path: StatuszPath, want: http.StatusOK, body: `"node":"node-a"`},
		{name: "anonymous metrics", path: "/metrics", want: http.StatusForbidden, body: "/intercepting"},
		{name: "allowed scraper", path: "/metrics", token: "scraper-token", want: http.StatusOK, body: "# TYPE kube_apicache_build_info gauge"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, _ := metricsGet(s.listener.Handler(), http.MethodGet, tc.path, tc.token)
			if code != tc.want || !strings.Contains(body, tc.body) {
				t.Errorf("GET %s = %d %.300q, want %d with %q", tc.path, code, body, tc.want, tc.body)
			}
		})
	}
	if _, sars := f.Counts(); sars != 1 {
		t.Errorf("%d SubjectAccessReviews, want 1: only the scraper's", sars)
	}
}
