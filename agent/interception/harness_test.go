package interception

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// testSocketMark is the agent's default socket mark.
const testSocketMark = 0x1000

// validConfig is a configuration the agent would accept: one IPv4 VIP,
// no detect-local.
func validConfig() *Config {
	return &Config{
		NodeName:          "node-a",
		ListenAddress:     netip.MustParseAddrPort(DefaultListenAddress),
		ListenAddressIPv6: netip.MustParseAddrPort(DefaultListenAddressIPv6),
		ListenLink:        DefaultListenLink,
		ServiceVIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		ServicePort:       443,
		Chain:             DefaultChain,
		SyncPeriod:        time.Second,
		LivenessSet:       DefaultLivenessSet,
		LivenessTimeout:   DefaultLivenessTimeout,
		DetectLocalMode:   DetectLocalNone,
	}
}

// testEndpoint stands in for kube-apiserver: a TLS server answering with
// its handler, and the health the agent would see of it (sick: no healthy
// upstream endpoint).
type testEndpoint struct {
	srv  *httptest.Server
	url  *url.URL
	sick atomic.Bool
}

func newTestEndpoint(t *testing.T, handler http.HandlerFunc) *testEndpoint {
	t.Helper()
	e := &testEndpoint{srv: httptest.NewTLSServer(handler)}
	t.Cleanup(e.srv.Close)
	e.url, _ = url.Parse(e.srv.URL)
	return e
}

func ok(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, "ok")
}

// testAgent stands in for the agent around the interceptor under test: the
// TLS listener that reports self-check handshakes to the interceptor, an
// upstream whose health the test sets, a further health error (the
// warm-up's part), and the gauges the interceptor keeps.
type testAgent struct {
	cfg  *Config
	icpt *Interceptor
	ep   *testEndpoint
	cert tls.Certificate
	now  func() time.Time
	// healthErr, when set, is returned by the health the interceptor
	// sees once the upstream is healthy.
	healthErr atomic.Pointer[error]
	metrics   testMetrics
}

// testMetrics are the gauges and counter the agent hands the interceptor.
type testMetrics struct {
	registry            *prometheus.Registry
	ready, intercepting prometheus.Gauge
	ruleSyncs           *prometheus.CounterVec
}

func newTestMetrics() testMetrics {
	return testMetrics{
		registry:     prometheus.NewRegistry(),
		ready:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "ready"}),
		intercepting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "intercepting"}),
		ruleSyncs:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rule_syncs"}, []string{"result"}),
	}
}

// newTestAgent returns a test agent whose upstream is ep, without its
// interceptor (wireTestAgent).
func newTestAgent(ep *testEndpoint) *testAgent {
	return &testAgent{ep: ep, cert: ep.srv.TLS.Certificates[0], now: time.Now, metrics: newTestMetrics()}
}

// Deps is what the agent would hand the interceptor.
func (a *testAgent) Deps() Deps {
	return Deps{
		Health: func() error {
			if a.ep.sick.Load() {
				return errors.New("no healthy upstream endpoint")
			}
			if err := a.healthErr.Load(); err != nil {
				return *err
			}
			return nil
		},
		RESTConfig:      a.restConfig,
		LocalRESTConfig: a.restConfig,
		Upstream:        func() string { return a.ep.url.Host },
		Ready:           a.metrics.ready,
		Intercepting:    a.metrics.intercepting,
		RuleSyncs:       a.metrics.ruleSyncs,
		Registry:        a.metrics.registry,
	}
}

// setHealthErr makes the health the interceptor sees fail with err (nil:
// healthy again, as far as it goes).
func (a *testAgent) setHealthErr(err error) {
	if err == nil {
		a.healthErr.Store(nil)
		return
	}
	a.healthErr.Store(&err)
}

// restConfig reaches the test endpoint, trusting its certificate.
func (a *testAgent) restConfig() *rest.Config {
	return &rest.Config{Host: a.ep.srv.URL, Transport: a.ep.srv.Client().Transport.(*http.Transport).Clone()}
}

// getCertificate serves the test certificate and reports self-check
// handshakes to the interceptor, as the agent's listener does.
func (a *testAgent) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if a.icpt != nil {
		a.icpt.Probes().Observe(hello.ServerName)
	}
	return &a.cert, nil
}

func (a *testAgent) Ready() error        { return a.icpt.Ready() }
func (a *testAgent) Healthy() error      { return a.icpt.Healthy() }
func (a *testAgent) Intercepting() error { return a.icpt.Intercepting() }
func (a *testAgent) SetInterception(enabled bool, reason string) {
	a.icpt.SetInterception(enabled, reason)
}
