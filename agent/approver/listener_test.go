package approver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metricsservertesting "github.com/kube-apicache/kube-apicache/agent/internal/metricsserver/testing"
)

const (
	scraperUser = "system:serviceaccount:monitoring:kube-apicache-scraper"
	tenantUser  = "system:serviceaccount:tenant:app"
)

// newTestListener returns an approver listener whose readiness is ready,
// reviewing with a fake kube-apiserver where scraper-token may get
// /metrics and tenant-token nothing.
func newTestListener(t *testing.T, ready func(*http.Request) error) (*Listener, *metricsservertesting.Reviewer) {
	t.Helper()
	f := &metricsservertesting.Reviewer{
		Users:   map[string]string{"scraper-token": scraperUser, "tenant-token": tenantUser},
		Allowed: map[string][]string{scraperUser: {"/metrics"}},
	}
	healthy := func(*http.Request) error { return nil }
	l, err := NewListener(ListenerConfig{Name: "approver-0", RESTConfig: f.Start(t)}, NewMetrics(), healthy, ready)
	if err != nil {
		t.Fatal(err)
	}
	return l, f
}

// TestListenerAccess checks who may read what on the approver's listener.
func TestListenerAccess(t *testing.T) {
	tests := []struct {
		name        string
		ready       func(*http.Request) error
		path, token string
		want        int
		// body is a substring the answer must contain.
		body string
	}{{
		// The kubelet probes without credentials.
		name: "anonymous healthz", path: "/healthz", want: http.StatusOK, body: "ok",
	}, {
		name: "anonymous livez", path: "/livez", want: http.StatusOK, body: "ok",
	}, {
		name: "anonymous readyz", path: "/readyz", want: http.StatusOK, body: "ok",
	}, {
		// A leader whose informer has not synced is not ready, and says why.
		name: "readyz not ready", path: "/readyz", want: http.StatusServiceUnavailable, body: "not synced",
		ready: func(*http.Request) error { return errors.New("leading, informer not synced yet") },
	}, {
		// A token sent with a probe is not reviewed: a made-up one passes.
		name: "made-up token on healthz", path: "/healthz", token: "made-up", want: http.StatusOK,
	}, {
		name: "anonymous metrics", path: "/metrics", want: http.StatusForbidden, body: "system:anonymous",
	}, {
		// Prometheus with a token RBAC allows.
		name: "allowed scraper", path: "/metrics", token: "scraper-token", want: http.StatusOK, body: "kube_apicache_approver_leader 0",
	}, {
		name: "authenticated but not allowed", path: "/metrics", token: "tenant-token", want: http.StatusForbidden, body: tenantUser,
	}, {
		name: "made-up token", path: "/metrics", token: "made-up", want: http.StatusUnauthorized,
	}, {
		// The approver has no /statusz, /intercepting or profiles.
		name: "a path not served", path: "/intercepting", token: "scraper-token", want: http.StatusNotFound,
	}, {
		name: "no profiles", path: "/debug/pprof/heap", token: "scraper-token", want: http.StatusNotFound,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ready := tc.ready
			if ready == nil {
				ready = func(*http.Request) error { return nil }
			}
			l, f := newTestListener(t, ready)
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.token != "" {
				r.Header.Set("Authorization", "Bearer "+tc.token)
			}
			w := httptest.NewRecorder()
			l.Handler().ServeHTTP(w, r)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.body) {
				t.Errorf("GET %s = %d %.300q, want %d with %q", tc.path, w.Code, w.Body.String(), tc.want, tc.body)
			}
			for _, u := range f.ReviewedUsers() {
				if u == "system:anonymous" || u == "" {
					t.Errorf("an anonymous request cost a SubjectAccessReview")
				}
			}
		})
	}
}

// TestListenerHTTPS: given no certificate files, when the kubelet probes
// and a scraper scrapes, then both are answered over HTTPS with a
// self-signed certificate naming the pod.
func TestListenerHTTPS(t *testing.T) {
	l, _ := newTestListener(t, func(*http.Request) error { return nil })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := l.Start(ctx, ln, make(chan error, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The certificate is self-signed: its name is checked below.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	for path, token := range map[string]string{"/healthz": "", "/metrics": "scraper-token"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ln.Addr().String()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d %.200q, want 200", path, resp.StatusCode, body)
		}
		if err := resp.TLS.PeerCertificates[0].VerifyHostname("approver-0"); err != nil {
			t.Errorf("certificate does not name the pod: %v", err)
		}
	}
	// Plain HTTP is not served.
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + ln.Addr().String() + "/healthz")
	if err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain-HTTP /healthz = 200, want a TLS-only listener")
		}
		resp.Body.Close()
	}
}
