package approver

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the approver's Prometheus metrics, in a registry of their
// own (with the Go and process collectors).
type Metrics struct {
	Registry *prometheus.Registry

	decisions    *prometheus.CounterVec
	ignored      *prometheus.CounterVec
	updateErrors prometheus.Counter
	latency      prometheus.Histogram
	leader       prometheus.Gauge
}

// NewMetrics registers the approver's metrics in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_approver_decisions_total",
			Help: "CSRs approved or denied, by decision and reason (the condition's reason).",
		}, []string{"decision", "reason"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_approver_ignored_total",
			Help: "Pending CSRs left undecided because no agent waits for them any more, by reason: stale (older than --max-csr-age), superseded (a newer CSR from the same node exists).",
		}, []string{"reason"}),
		updateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kube_apicache_approver_update_errors_total",
			Help: "Decisions that could not be recorded (the CSR is retried with backoff).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kube_apicache_approver_decision_seconds",
			Help:    "Time from a CSR's creation to its recorded decision.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600},
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kube_apicache_approver_leader",
			Help: "1 while this replica holds the leader lease and decides CSRs.",
		}),
	}
	m.Registry.MustRegister(m.decisions, m.ignored, m.updateErrors, m.latency, m.leader,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves /metrics, /healthz and /livez (liveness: 200 unless
// healthz returns an error) and /readyz (200 unless readyz returns an
// error). It checks no credentials: NewListener serves it behind the
// metrics listener's authentication and authorization.
func (m *Metrics) Handler(healthz, readyz func(*http.Request) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	probe := func(check func(*http.Request) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(r); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(err.Error() + "\n"))
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		}
	}
	mux.Handle("/healthz", probe(healthz))
	mux.Handle("/livez", probe(healthz))
	mux.Handle("/readyz", probe(readyz))
	return mux
}
