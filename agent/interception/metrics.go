package interception

import (
	"github.com/prometheus/client_golang/prometheus"
)

// interceptionMetrics are the metrics of the dead-man switch, the
// self-check and the rule syncs.
type interceptionMetrics struct {
	liveness   *prometheus.CounterVec
	selfChecks *prometheus.CounterVec
	// refreshGap is the time between consecutive refreshes of an
	// intercepting agent's liveness entries.
	refreshGap prometheus.Histogram
	// syncDuration is the time each rule sync took.
	syncDuration prometheus.Histogram
	// localPodsSource is 1 for the identity this node's pods are listed
	// with (LocalPods.Source), 0 for the others; no series while they are
	// not followed.
	localPodsSource *prometheus.GaugeVec
}

func newInterceptionMetrics(reg prometheus.Registerer) *interceptionMetrics {
	m := &interceptionMetrics{
		liveness: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_liveness_refreshes_total",
			Help: "Liveness ticks, by result: refreshed (entry kept alive), unhealthy (entry deleted), stepped-aside (entry deleted on purpose: the kill switch, Service VIPs that do not match the Service), skipped (not intercepting), error.",
		}, []string{"result"}),
		selfChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_self_checks_total",
			Help: "Checks that an unmarked connection to the Service VIP lands on the agent, by result (ok, failed).",
		}, []string{"result"}),
		refreshGap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kube_apicache_liveness_refresh_gap_seconds",
			Help:    "Time between consecutive refreshes of the liveness entries while intercepting. Near --fail-open-timeout the kernel expires the entries and interception flaps.",
			Buckets: []float64{0.1, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 5, 10},
		}),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kube_apicache_rule_sync_duration_seconds",
			Help:    "Time each reconciliation of the redirect (address, set, chain, jumps, self-check) took.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		localPodsSource: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kube_apicache_local_pods_source",
			Help: "1 for whose identity lists this node's pods (for detect-local PodIPs and the pod-path check): node (impersonated), agent (its own ServiceAccount: --cache-as-node=false, or the fallback while the node impersonation is refused), none (refused both, or not listed yet; in PodIPs mode only host-network traffic is intercepted until they are listed). No series when the agent does not follow this node's pods.",
		}, []string{"source"}),
	}
	reg.MustRegister(m.liveness, m.selfChecks, m.refreshGap, m.syncDuration, m.localPodsSource)
	return m
}
