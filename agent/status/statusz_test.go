package status

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/version"
)

// TestStatusz: given an agent that intercepts but is not ready, two
// upstreams, cached reads and a serving certificate, when /statusz is
// asked (past the listener's authorization), then the answer is its Status as JSON,
// built from the checks and the registry's metrics.
func TestStatusz(t *testing.T) {
	reg := prometheus.NewRegistry()
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kube_apicache_cache_requests_total"}, []string{"resource", "outcome"})
	reads.WithLabelValues("pods", "hit").Add(3)
	reads.WithLabelValues("nodes", "hit").Add(2)
	reads.WithLabelValues("pods", "forwarded").Inc()
	notAfter := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	expiry := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kube_apicache_serving_certificate_expiration_timestamp_seconds"})
	expiry.Set(float64(notAfter.Unix()))
	reg.MustRegister(reads, expiry)
	ok := func() error { return nil }
	s, err := New(Config{
		NodeName:   "node-a",
		RESTConfig: func() *rest.Config { return &rest.Config{Host: "https://127.0.0.1:1"} },
	}, Checks{
		Healthy:         ok,
		Ready:           func() error { return errors.New("waiting for the pinned resources") },
		Intercepting:    ok,
		Note:            func() string { return "" },
		Dataplane:       "nftables",
		DataplaneReason: "auto: test",
		Upstreams: func() []UpstreamStatus {
			return []UpstreamStatus{{Endpoint: "10.0.0.1:6443", Healthy: true, Active: true}, {Endpoint: "10.0.0.2:6443"}}
		},
	}, reg)
	if err != nil {
		t.Fatal(err)
	}
	code, body, hdr := metricsGet(s.statuszHandler(), http.MethodGet, StatuszPath, "")
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s = %d %s %q, want 200 JSON", StatuszPath, code, hdr.Get("Content-Type"), body)
	}
	var got Status
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("GET %s: %v: %q", StatuszPath, err, body)
	}
	want := Status{
		Node:                "node-a",
		Version:             version.Get().GitVersion,
		Dataplane:           "nftables",
		Intercepting:        true,
		ReadyReason:         "waiting for the pinned resources",
		Upstreams:           []UpstreamStatus{{Endpoint: "10.0.0.1:6443", Healthy: true, Active: true}, {Endpoint: "10.0.0.2:6443"}},
		CertificateNotAfter: &notAfter,
		Cache:               map[string]float64{"hit": 5, "forwarded": 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Status (-want +got):\n%s", diff)
	}
}

// TestLocalPodsReported: given each source of this node's pods, when
// /intercepting, /readyz and /statusz are asked, then each names the
// source with its reason, and while no pod has been listed none of them
// claims pod interception.
func TestLocalPodsReported(t *testing.T) {
	ok := func() error { return nil }
	for _, tc := range []struct {
		name string
		pods LocalPods
		// wantBody is the /intercepting and /readyz answer; wantHostOnly
		// the Status's HostNetworkOnly.
		wantBody     string
		wantHostOnly bool
	}{{
		name:     "not followed",
		wantBody: "ok; dataplane nftables (auto: test)",
	}, {
		name:     "as the node",
		pods:     LocalPods{Source: "node"},
		wantBody: "ok; pods source node; dataplane nftables (auto: test)",
	}, {
		name:     "fallback to the agent",
		pods:     LocalPods{Source: "agent", Reason: "kube-apiserver refused to list them as the node: bind it"},
		wantBody: "ok; pods source agent (kube-apiserver refused to list them as the node: bind it); dataplane nftables (auto: test)",
	}, {
		name:         "refused both",
		pods:         LocalPods{Source: "none", Reason: "refused as the node and as the agent", HostNetworkOnly: true},
		wantBody:     "ok; pods not intercepted, host-network traffic only: pods source none (refused as the node and as the agent); dataplane nftables (auto: test)",
		wantHostOnly: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Config{
				NodeName:   "node-a",
				RESTConfig: func() *rest.Config { return &rest.Config{Host: "https://127.0.0.1:1"} },
			}, Checks{
				Healthy: ok, Ready: ok, Intercepting: ok,
				Note:      func() string { return "" },
				Dataplane: "nftables", DataplaneReason: "auto: test",
				Upstreams: func() []UpstreamStatus { return nil },
				LocalPods: func() LocalPods { return tc.pods },
			}, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"/intercepting", "/readyz"} {
				want := tc.wantBody
				if code, body, _ := metricsGet(s.listener.Handler(), http.MethodGet, path, ""); code != http.StatusOK || body != want {
					t.Errorf("GET %s = %d %q, want 200 %q", path, code, body, want)
				}
			}
			_, body, _ := metricsGet(s.statuszHandler(), http.MethodGet, StatuszPath, "")
			var got Status
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatal(err)
			}
			if got.PodsSource != tc.pods.Source || got.PodsSourceReason != tc.pods.Reason || got.HostNetworkOnly != tc.wantHostOnly {
				t.Errorf("Status pods source %q (%q), host-network only %v; want %q (%q), %v",
					got.PodsSource, got.PodsSourceReason, got.HostNetworkOnly, tc.pods.Source, tc.pods.Reason, tc.wantHostOnly)
			}
		})
	}
}
