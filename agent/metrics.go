package agent

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the agent's own Prometheus metrics, in a registry that its
// parts register theirs in too.
type metrics struct {
	registry     *prometheus.Registry
	ruleSyncs    *prometheus.CounterVec
	ready        prometheus.Gauge
	intercepting prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		ruleSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_rule_syncs_total",
			Help: "Reconciliations of the node's redirect rules and address, by result (unchanged, repaired, error).",
		}, []string{"result"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kube_apicache_ready",
			Help: "1 while the agent is ready (/readyz): it intercepts or has deliberately stepped aside; 0 while starting, shutting down or stuck.",
		}),
		intercepting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kube_apicache_intercepting",
			Help: "1 while the agent intercepts the kubernetes Service VIP, 0 while it goes to kube-proxy's path (/intercepting says why).",
		}),
	}
	m.registry.MustRegister(m.ruleSyncs, m.ready, m.intercepting,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler serves /metrics, /healthz and /livez (healthy), /readyz (ready)
// and /intercepting (intercepting), each 200 "ok" or 503 with the reason,
// the ready and intercepting answers followed by note (degraded mode, a
// blocked source),
// and with profiling the pprof endpoints. It checks no credentials: the
// metrics listener serves it behind metricsAuth.secure.
func (m *metrics) handler(healthy, ready, intercepting func() error, note func() string, dataplane string, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		// pprof.Index also serves the named profiles (heap, goroutine,
		// allocs, ...) below /debug/pprof/.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	for path, check := range map[string]func() error{"/healthz": healthy, "/livez": healthy, "/readyz": ready, "/intercepting": intercepting} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			msg := "ok"
			if n := note(); n != "" && (path == "/intercepting" || path == "/readyz") {
				msg += "; " + n
			}
			if dataplane != "" && path != "/healthz" && path != "/livez" {
				msg += "; dataplane " + dataplane
			}
			_, _ = w.Write([]byte(msg))
		})
	}
	return mux
}
