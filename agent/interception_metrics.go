package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// interceptionMetrics are the metrics of the dead-man switch, the
// self-check and the upstream endpoints.
type interceptionMetrics struct {
	liveness   *prometheus.CounterVec
	selfChecks *prometheus.CounterVec
}

func newInterceptionMetrics(reg prometheus.Registerer, up *upstreams) *interceptionMetrics {
	m := &interceptionMetrics{
		liveness: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_liveness_refreshes_total",
			Help: "Liveness ticks, by result: refreshed (entry kept alive), unhealthy (entry deleted), skipped (not intercepting), error.",
		}, []string{"result"}),
		selfChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_self_checks_total",
			Help: "Checks that an unmarked connection to the Service VIP lands on the agent, by result (ok, failed).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.liveness, m.selfChecks, &upstreamCollector{up: up})
	return m
}

var (
	upstreamHealthyDesc = prometheus.NewDesc("kube_apicache_upstream_endpoint_healthy",
		"1 if the kube-apiserver endpoint passed its last health check.", []string{"endpoint"}, nil)
	upstreamActiveDesc = prometheus.NewDesc("kube_apicache_upstream_endpoint_active",
		"1 for the kube-apiserver endpoint requests are sent to.", []string{"endpoint"}, nil)
)

// upstreamCollector reports the endpoints as they are at scrape time, so
// endpoints that went away leave no stale series.
type upstreamCollector struct{ up *upstreams }

func (c *upstreamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upstreamHealthyDesc
	ch <- upstreamActiveDesc
}

func (c *upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.up.status() {
		ch <- prometheus.MustNewConstMetric(upstreamHealthyDesc, prometheus.GaugeValue, b2f(s.Healthy), s.Host)
		ch <- prometheus.MustNewConstMetric(upstreamActiveDesc, prometheus.GaugeValue, b2f(s.Active), s.Host)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
