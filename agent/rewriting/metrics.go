package rewriting

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of the requests of selected callers.
const (
	// outcomeRewritten: renamed and restored.
	outcomeRewritten = "rewritten"
	// outcomePassed: renamed; the answer carried no names (logs).
	outcomePassed = "passed"
	// outcomeRefused: the request could not be rewritten (406, 413, 415).
	outcomeRefused = "refused"
	// outcomeFailed: the answer could not be rewritten (500).
	outcomeFailed = "failed"
	// outcomeUnidentified: the caller's token could not be reviewed now
	// (429, 503).
	outcomeUnidentified = "unidentified"
)

// Metrics count the filter's requests.
type Metrics struct {
	requests *prometheus.CounterVec
}

// NewMetrics returns the filter's metrics, registered with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_apicache_rewrite_requests_total",
		Help: "Requests of callers a rewrite profile selects, by profile and outcome (rewritten, passed, refused, failed, unidentified).",
	}, []string{"profile", "outcome"})}
	if reg != nil {
		if err := reg.Register(m.requests); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) request(profile, outcome string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(profile, outcome).Inc()
}
