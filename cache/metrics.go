package cache

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/internal/series"
)

// metrics are the cache's Prometheus metrics.
type metrics struct {
	requests *prometheus.CounterVec
	// requestSeries are the children of requests already seen, by their
	// label values (verb, resource, outcome, reason).
	requestSeries series.Of[[4]string, prometheus.Counter]
	starts        *prometheus.CounterVec
	stops         *prometheus.CounterVec
	state         *stateCollector
	// Watches served from the cache (watch.go).
	watchers    *prometheus.GaugeVec
	watchEvents *prometheus.CounterVec
	watchEnds   *prometheus.CounterVec
	// Watches forwarded with their timeout capped (forwarded.go).
	watchesCapped *prometheus.CounterVec
	// Consistent-read probes (probe.go) and the reads that waited.
	probes        *prometheus.CounterVec
	probeObjects  *prometheus.CounterVec
	probesRefused *prometheus.CounterVec
	probeDuration *prometheus.HistogramVec
	probeWaits    *prometheus.HistogramVec
}

func newMetrics(c *Cache) *metrics {
	m := &metrics{
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
		watchers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kube_apicache_cache_watchers",
			Help: "Client watches served from the cache now, by resource; the upstream holds one watch per resource for all of them.",
		}, []string{"resource"}),
		watchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_watch_events_total",
			Help: "Events sent to client watches served from the cache (initial events and bookmarks excluded), by resource.",
		}, []string{"resource"}),
		watchEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_watches_ended_total",
			Help: "Client watches served from the cache that ended, by resource and reason: client (it went away, or the agent drained), timeout, relisted (the cache's own watch relisted), slow (it fell behind the event window or stopped reading), informer-stopped, too-old (it asked for a resourceVersion older than the window while kube-apiserver was unreachable: 410 Gone; otherwise such a watch is forwarded, reason resource-version-too-old), resource-version-went-back (the upstream's resourceVersion went back: 410 Gone, the client relists).",
		}, []string{"resource", "reason"}),
		watchesCapped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_watches_forwarded_capped_total",
			Help: "Client watches forwarded only because the resource's cache was not ready yet (starting, or its own watch broken), whose timeoutSeconds the agent capped at 60 to 90 seconds so that they come back to be served from the cache, by resource.",
		}, []string{"resource"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_consistent_probes_total",
			Help: "Probes of kube-apiserver's current state for consistent reads (a metadata-only consistent list of the cached scope; at most one in flight per resource, shared by every read that waits for it), by resource and result (ok, error).",
		}, []string{"resource", "result"}),
		probeObjects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_consistent_probe_objects_total",
			Help: "Objects that consistent-read probes listed (what the probes cost kube-apiserver under the agent's identity), by resource.",
		}, []string{"resource"}),
		probesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_cache_consistent_probes_refused_total",
			Help: "Consistent-read probes not sent because the budget that pays for them was spent: the share of the source whose read would have started the probe (budget=source) or the node's (budget=node); the read was forwarded (reason consistent-probe-budget), by resource and budget.",
		}, []string{"resource", "budget"}),
		probeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kube_apicache_cache_consistent_probe_duration_seconds",
			Help:    "How long consistent-read probes took, by resource.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}, []string{"resource"}),
		probeWaits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kube_apicache_cache_consistent_read_wait_seconds",
			Help:    "How long consistent reads waited for a probe and for the cache to hold the probed state, by resource and outcome (current: answered from the cache; behind: the cache did not catch up within the wait, forwarded; probe-failed: forwarded).",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}, []string{"resource", "outcome"}),
	}
	m.requestSeries.New = func(k [4]string) prometheus.Counter { return m.requests.WithLabelValues(k[:]...) }
	return m
}

// probeDone returns the observer of one resource's probes.
func (m *metrics) probeDone(resource string) func(time.Duration, probeResult) {
	ok, failed := m.probes.WithLabelValues(resource, "ok"), m.probes.WithLabelValues(resource, "error")
	objects := m.probeObjects.WithLabelValues(resource)
	d := m.probeDuration.WithLabelValues(resource)
	return func(took time.Duration, res probeResult) {
		if res.err != nil {
			failed.Inc()
		} else {
			ok.Inc()
			objects.Add(float64(len(res.versions)))
		}
		d.Observe(took.Seconds())
	}
}

// probeRefused counts a probe the budget refused.
func (m *metrics) probeRefused(resource, budget string) {
	m.probesRefused.WithLabelValues(resource, budget).Inc()
}

func (m *metrics) probeWait(resource, outcome string, took time.Duration) {
	m.probeWaits.WithLabelValues(resource, outcome).Observe(took.Seconds())
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(m.requests), reg.Register(m.starts), reg.Register(m.stops), reg.Register(m.state),
		reg.Register(m.watchers), reg.Register(m.watchEvents), reg.Register(m.watchEnds), reg.Register(m.watchesCapped),
		reg.Register(m.probes), reg.Register(m.probeObjects), reg.Register(m.probesRefused), reg.Register(m.probeDuration),
		reg.Register(m.probeWaits))
}

func (m *metrics) watchCapped(resource string) { m.watchesCapped.WithLabelValues(resource).Inc() }

// watchStarted counts a watch r serves until the returned function is
// called with the reason it ended. While it runs, r is in use: an idle
// timeout does not stop its informer.
func (m *metrics) watchStarted(r *informer) func(reason string) {
	r.watchers.Add(1)
	g := m.watchers.WithLabelValues(r.label)
	g.Inc()
	return func(reason string) {
		g.Dec()
		r.lastUsed.Store(m.state.c.clock.Now().UnixNano())
		r.watchers.Add(-1)
		m.watchEnded(r.label, reason)
	}
}

func (m *metrics) watchEnded(resource, reason string) {
	m.watchEnds.WithLabelValues(resource, reason).Inc()
}

func (m *metrics) eventSent(resource string) { m.watchEvents.WithLabelValues(resource).Inc() }

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
	m.requestSeries.Get([4]string{verb, resource, outcome, reason}).Inc()
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
	listsDesc = prometheus.NewDesc("kube_apicache_cache_lists",
		"Lists the resource's running informer made: the first, and a relist each time its watch could not resume (each relist ends the client watches served from the resource).", []string{"resource"}, nil)
	historyEventsDesc = prometheus.NewDesc("kube_apicache_cache_history_events",
		"Events in the resource's event window, which watches from a resourceVersion are served from.", []string{"resource"}, nil)
	historyBytesDesc = prometheus.NewDesc("kube_apicache_cache_history_bytes",
		"Estimated memory the resource's event window keeps alive.", []string{"resource"}, nil)
	historyAgeDesc = prometheus.NewDesc("kube_apicache_cache_history_age_seconds",
		"Age of the oldest event in the resource's event window; a watch from an older resourceVersion is forwarded to kube-apiserver.", []string{"resource"}, nil)
	upstreamWatchesDesc = prometheus.NewDesc("kube_apicache_cache_upstream_watches",
		"Watches the cache holds open upstream for the resource: 1 while its informer's watch is open (its initial events included), 0 while it lists, retries or is idle. Every client watch of the resource served from the cache shares it.", []string{"resource"}, nil)
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
	ch <- listsDesc
	ch <- historyEventsDesc
	ch <- historyBytesDesc
	ch <- historyAgeDesc
	ch <- upstreamWatchesDesc
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
		ch <- prometheus.MustNewConstMetric(listsDesc, prometheus.GaugeValue, float64(st.Lists), st.Resource)
		ch <- prometheus.MustNewConstMetric(historyEventsDesc, prometheus.GaugeValue, float64(st.History.Events), st.Resource)
		ch <- prometheus.MustNewConstMetric(historyBytesDesc, prometheus.GaugeValue, float64(st.History.Bytes), st.Resource)
		age := 0.0
		if !st.History.Oldest.IsZero() {
			age = s.c.clock.Since(st.History.Oldest).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(historyAgeDesc, prometheus.GaugeValue, age, st.Resource)
		ch <- prometheus.MustNewConstMetric(upstreamWatchesDesc, prometheus.GaugeValue, b(st.Watching), st.Resource)
	}
	ch <- prometheus.MustNewConstMetric(informersDesc, prometheus.GaugeValue, float64(s.c.Informers()))
}
