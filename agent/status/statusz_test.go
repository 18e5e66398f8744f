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
// upstreams, cached reads and a serving certificate, when anyone asks for
// /statusz without credentials, then the answer is its Status as JSON,
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
	code, body, hdr := metricsGet(s.handler, http.MethodGet, StatuszPath, "")
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
