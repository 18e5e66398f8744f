package upstream

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	upstreamHealthyDesc = prometheus.NewDesc("kube_apicache_upstream_endpoint_healthy",
		"1 while the kube-apiserver endpoint's last request or probe succeeded.", []string{"endpoint"}, nil)
	upstreamActiveDesc = prometheus.NewDesc("kube_apicache_upstream_endpoint_active",
		"1 for the kube-apiserver endpoint requests are sent to.", []string{"endpoint"}, nil)
)

// upstreamCollector reports the endpoints as they are at scrape time, so
// endpoints that went away leave no stale series.
type upstreamCollector struct{ up *Set }

func (c *upstreamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upstreamHealthyDesc
	ch <- upstreamActiveDesc
}

func (c *upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.up.Status() {
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

// Collectors are the set's metrics, read at scrape time: each endpoint's
// health and activity, and the probes by reason.
func (u *Set) Collectors() []prometheus.Collector {
	return []prometheus.Collector{&upstreamCollector{up: u}, &healthCollector{up: u}}
}
