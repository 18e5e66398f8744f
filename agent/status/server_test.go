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
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	return metricsGetHeader(h, method, path, hdr)
}

// metricsGetHeader is metricsGet with the request's headers given.
func metricsGetHeader(h http.Handler, method, path string, hdr http.Header) (int, string, http.Header) {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = "10.244.1.7:40000"
	for k, v := range hdr {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String(), w.Header()
}

// TestListenerAccess: the agent's health paths answer anyone with no
// review, /metrics and /statusz only a caller RBAC allows, whose token may
// come in the Authorization header or, through kube-apiserver's pods proxy,
// in TokenHeader.
func TestListenerAccess(t *testing.T) {
	const (
		scraper = "system:serviceaccount:monitoring:prometheus"
		reader  = "system:serviceaccount:kube-apicache:kube-apicache-status"
		tenant  = "system:serviceaccount:team-a:app"
	)
	f := &metricsservertesting.Reviewer{
		Users:   map[string]string{"scraper-token": scraper, "status-token": reader, "tenant-token": tenant},
		Allowed: map[string][]string{scraper: {"/metrics"}, reader: {StatuszPath}},
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
	bearer := func(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }
	proxied := func(token string) http.Header { return http.Header{TokenHeader: {token}} }
	tests := []struct {
		name, path string
		header     http.Header
		want       int
		// body is a substring the answer must contain.
		body string
	}{
		{name: "anonymous healthz", path: "/healthz", want: http.StatusOK},
		{name: "anonymous livez", path: "/livez", want: http.StatusOK},
		{name: "anonymous readyz", path: "/readyz", want: http.StatusOK},
		{name: "anonymous intercepting", path: "/intercepting", want: http.StatusOK},
		{name: "anonymous statusz", path: StatuszPath, want: http.StatusForbidden, body: "system:anonymous"},
		{name: "anonymous metrics", path: "/metrics", want: http.StatusForbidden, body: "/intercepting"},
		{name: "allowed scraper", path: "/metrics", header: bearer("scraper-token"), want: http.StatusOK, body: "# TYPE kube_apicache_build_info gauge"},
		{name: "scraper not allowed statusz", path: StatuszPath, header: bearer("scraper-token"), want: http.StatusForbidden, body: scraper},
		{name: "status reader", path: StatuszPath, header: bearer("status-token"), want: http.StatusOK, body: `"node":"node-a"`},
		{name: "status reader through the pods proxy", path: StatuszPath, header: proxied("status-token"), want: http.StatusOK, body: `"node":"node-a"`},
		{name: "tenant through the pods proxy", path: StatuszPath, header: proxied("tenant-token"), want: http.StatusForbidden, body: tenant},
		{name: "made-up token through the pods proxy", path: StatuszPath, header: proxied("made-up"), want: http.StatusUnauthorized},
		{name: "Authorization wins over the header", path: StatuszPath, header: http.Header{"Authorization": {"Bearer tenant-token"}, TokenHeader: {"status-token"}}, want: http.StatusForbidden, body: tenant},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, _ := metricsGetHeader(s.listener.Handler(), http.MethodGet, tc.path, tc.header)
			if code != tc.want || !strings.Contains(body, tc.body) {
				t.Errorf("GET %s = %d %.300q, want %d with %q", tc.path, code, body, tc.want, tc.body)
			}
		})
	}
	// Anonymous callers are decided locally; each identity costs one
	// review of each path it asked for, reused after that.
	if _, sars := f.Counts(); sars != 4 {
		t.Errorf("%d SubjectAccessReviews, want 4: the scraper's two, the reader's and the tenant's", sars)
	}
}
