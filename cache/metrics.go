package cache

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// metrics are the cache's Prometheus metrics.
type metrics struct {
	requests *prometheus.CounterVec
	starts   *prometheus.CounterVec
	stops    *prometheus.CounterVec
	state    *stateCollector
}

func newMetrics(c *Cache) *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_requests_total",
			Help: "Requests the cache considered, by verb, resource, outcome (hit, denied, forwarded) and the reason a request was forwarded.",
		}, []string{"verb", "resource", "outcome", "reason"}),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_informer_starts_total",
			Help: "Informers the cache started, by resource (customresourcedefinitions.apiextensions.k8s.io: the watch of the CRDs of cached custom resources).",
		}, []string{"resource"}),
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_informer_stops_total",
			Help: "Informers the cache stopped (idle, or at shutdown), by resource.",
		}, []string{"resource"}),
		state: &stateCollector{c: c},
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(m.requests), reg.Register(m.starts), reg.Register(m.stops), reg.Register(m.state))
}

func (m *metrics) started(resource string) { m.starts.WithLabelValues(resource).Inc() }
func (m *metrics) stopped(resource string) { m.stops.WithLabelValues(resource).Inc() }

// outcome counts a request. Only resources the cache is configured for
// get their own resource label; others count as "other", so clients
// cannot grow the label set.
func (m *metrics) outcome(info *request.RequestInfo, outcome, reason string) {
	verb, resource := "other", "other"
	if info != nil && (info.Verb == "get" || info.Verb == "list" || info.Verb == "watch") {
		verb = info.Verb
	}
	if info != nil && info.IsResourceRequest {
		if r := m.state.c.byGR[groupResource(info)]; r != nil && info.Subresource == "" {
			resource = r.label
		}
	}
	m.requests.WithLabelValues(verb, resource, outcome, reason).Inc()
}

func (m *metrics) forwarded(info *request.RequestInfo, reason string) {
	m.outcome(info, "forwarded", reason)
}

var (
	syncedDesc = prometheus.NewDesc("kube_apicache_cache_synced",
		"1 when the resource's cache has been filled from its watch.", []string{"resource"}, nil)
	healthyDesc = prometheus.NewDesc("kube_apicache_cache_watch_healthy",
		"1 while the resource's watch is open and synced (consistent reads may be answered).", []string{"resource"}, nil)
	objectsDesc = prometheus.NewDesc("kube_apicache_cache_objects",
		"Objects in the resource's cache.", []string{"resource"}, nil)
	rvDesc = prometheus.NewDesc("kube_apicache_cache_resource_version",
		"The resourceVersion the resource's cache is consistent at.", []string{"resource"}, nil)
	stateDesc = prometheus.NewDesc("kube_apicache_cache_state",
		"1 for the state the resource's informer is in: idle (none runs), starting (not synced yet) or synced.", []string{"resource", "state"}, nil)
	pinnedDesc = prometheus.NewDesc("kube_apicache_cache_pinned",
		"1 if the resource's informer always runs, 0 if it runs on demand.", []string{"resource"}, nil)
	informersDesc = prometheus.NewDesc("kube_apicache_cache_informers",
		"Informers running, each holding one list or watch open upstream: those of resources not idle, and the watch of CRDs while a custom resource's informer runs.", nil, nil)
)

// stateCollector reports each resource's state when scraped.
type stateCollector struct {
	c *Cache
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- syncedDesc
	ch <- healthyDesc
	ch <- objectsDesc
	ch <- rvDesc
	ch <- stateDesc
	ch <- pinnedDesc
	ch <- informersDesc
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, st := range s.c.Resources() {
		ch <- prometheus.MustNewConstMetric(syncedDesc, prometheus.GaugeValue, b(st.Synced), st.Resource)
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, b(st.Healthy), st.Resource)
		ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(st.Objects), st.Resource)
		ch <- prometheus.MustNewConstMetric(rvDesc, prometheus.GaugeValue, float64(st.ResourceVersion), st.Resource)
		for _, state := range []string{StateIdle, StateStarting, StateSynced} {
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, b(st.State == state), st.Resource, state)
		}
		ch <- prometheus.MustNewConstMetric(pinnedDesc, prometheus.GaugeValue, b(st.Pinned), st.Resource)
	}
	ch <- prometheus.MustNewConstMetric(informersDesc, prometheus.GaugeValue, float64(s.c.Informers()))
}
