package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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
