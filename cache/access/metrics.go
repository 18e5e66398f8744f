package access

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Review types, as metric labels.
const (
	reviewToken  = "token"
	reviewAccess = "access"
)

// Metrics count the reviewer's work. The share of decisions served from
// its caches is 1 - reviews/lookups, per review type.
type Metrics struct {
	reviews   *prometheus.CounterVec
	lookups   *prometheus.CounterVec
	verdicts  *prometheus.CounterVec
	throttles *prometheus.CounterVec
	degradedL *prometheus.CounterVec
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_access_reviews_total",
			Help: "TokenReviews (review=token; result authenticated, rejected, error) and SubjectAccessReviews (review=access; result allowed, denied, error) sent to kube-apiserver.",
		}, []string{"review", "result"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_access_lookups_total",
			Help: "Token and access decisions needed to answer from the cache, whether found in the decision cache or reviewed.",
		}, []string{"review"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_access_verdicts_total",
			Help: "Outcomes of reviewing requests the cache could answer: allowed, denied, or forwarded with a reason.",
		}, []string{"verdict", "reason"}),
		throttles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_access_reviews_throttled_total",
			Help: "Reviews not sent because the caller's share (limit=source) or the node's was used up: for callers already authenticated (limit=global) or for tokens never seen authenticated (limit=unverified); the request was forwarded instead.",
		}, []string{"review", "limit"}),
		degradedL: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_access_degraded_decisions_total",
			Help: "Decisions looked up in degraded mode, by result: allowed (a recent allow for the same token and request), no-decision, stale (older than --degraded-decision-ttl), token-expired. Only allowed requests are answered from the cache.",
		}, []string{"result"}),
	}
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.reviews, m.lookups, m.verdicts, m.throttles, m.degradedL} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) reviewed(review, result string) {
	m.reviews.WithLabelValues(review, result).Inc()
}

func (m *Metrics) throttled(review, limit string) {
	m.throttles.WithLabelValues(review, limit).Inc()
}

func (m *Metrics) degraded(result string) {
	m.degradedL.WithLabelValues(result).Inc()
}

func (m *Metrics) lookup(review string) {
	m.lookups.WithLabelValues(review).Inc()
}

func (m *Metrics) observe(r Result) {
	switch r.Verdict {
	case Allowed:
		m.verdicts.WithLabelValues("allowed", "").Inc()
	case Denied:
		m.verdicts.WithLabelValues("denied", "").Inc()
	default:
		m.verdicts.WithLabelValues("forwarded", r.Reason).Inc()
	}
}
