package webhookproxy

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the webhook proxy's: its requests by kind of review and
// code answered, and how long they took.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newMetrics registers the proxy's metrics in reg.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_webhook_proxy_requests_total",
			Help: "Requests to the webhook proxy, by kind (AdmissionReview, ConversionReview, other: refused before it was known to be a review) and code: the status answered (a webhook server's failure passed on keeps its code; 502 and 504 when it could not be reached or did not answer in time; 499 when kube-apiserver went away first).",
		}, []string{"kind", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kube_apicache_webhook_proxy_request_duration_seconds",
			Help:    "Time to answer a request to the webhook proxy, the webhook server's own time included, by kind (AdmissionReview, ConversionReview, other).",
			Buckets: []float64{0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe records one request; a nil m records nothing.
func (m *metrics) observe(kind string, code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(kind, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(kind).Observe(d.Seconds())
}
