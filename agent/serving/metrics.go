package serving

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/internal/series"
)

// metrics are the serving metrics: requests by how they were handled,
// the in-flight and connection bounds.
type metrics struct {
	// reg is where they are registered.
	reg prometheus.Registerer
	// resources bounds the resource label: paths come from clients before
	// any authentication, and must not grow the label set without limit.
	resources *labelSet

	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	// inFlight is the requests in flight by the limits that count them;
	// rejected counts requests turned away by those limits;
	// requestTimeouts the answers ended at the request timeout;
	// openConns is the client connections open now, closedConns those
	// closed by the connection limits.
	inFlight        *prometheus.GaugeVec
	rejected        *prometheus.CounterVec
	requestTimeouts prometheus.Counter
	openConns       prometheus.Gauge
	closedConns     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reg:       reg,
		resources: &labelSet{max: maxResourceLabels, seen: map[string]bool{}},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_requests_total",
			Help: "Requests received from clients, by verb, resource, how they were handled and response code.",
		}, []string{"verb", "resource", "handler", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kube_apicache_request_duration_seconds",
			Help:    "Time to answer a client request, excluding watches and upgraded connections.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"verb", "handler"}),
	}
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kube_apicache_inflight_requests",
		Help: "Requests in flight, as the in-flight limits count them: by handler (cache, forward, long-running) and kind (readOnly, mutating, long-running).",
	}, []string{"handler", "kind"})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_apicache_rejected_requests_total",
		Help: "Requests answered 429 because too many were in flight, by handler (cache, forward, long-running), kind (readOnly, mutating, long-running) and reason (per-source: the client IP holds its own bound; total: it holds its guaranteed share and the pool shared by all is used up).",
	}, []string{"handler", "kind", "reason"})
	m.requestTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kube_apicache_request_timeouts_total",
		Help: "Answers to requests that are not long-running ended at --request-timeout, most often because the client did not read them: the HTTP/2 stream was reset or the HTTP/1.1 connection closed, and the request's in-flight slot freed.",
	})
	m.openConns = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_apicache_open_connections",
		Help: "Client connections open on the serving port, including upgraded ones until they are handed over.",
	})
	m.closedConns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_apicache_closed_connections_total",
		Help: "Client connections the agent closed to bound them, by reason: per-source or total (closed as accepted: the client IP had --max-connections-per-source open, or its guaranteed share with --max-connections used up), first-request-timeout (no request within --first-request-timeout).",
	}, []string{"reason"})
	reg.MustRegister(m.requests, m.requestDuration, m.inFlight, m.rejected, m.requestTimeouts, m.openConns, m.closedConns)
	return m
}

// instrument records every request that passes through h under handler.
// Each series is looked up in the vectors once, when it is first seen:
// the label values (a bounded verb, a bounded resource, the code) key
// their children here, as many as the vectors would hold.
func (m *metrics) instrument(handler string, h http.Handler) http.Handler {
	counters := &series.Of[requestSeries, prometheus.Counter]{New: func(k requestSeries) prometheus.Counter {
		return m.requests.WithLabelValues(k.verb, k.resource, handler, strconv.Itoa(int(k.code)))
	}}
	durations := &series.Of[string, prometheus.Observer]{New: func(verb string) prometheus.Observer {
		return m.requestDuration.WithLabelValues(verb, handler)
	}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		verb, resource := "unknown", ""
		if info, ok := request.RequestInfoFrom(r.Context()); ok {
			verb = boundedVerb(info.Verb)
			if info.IsResourceRequest {
				resource = info.Resource
				if info.Subresource != "" {
					resource += "/" + info.Subresource
				}
				resource = m.resources.bound(resource)
			}
		}
		rec := &apihttp.StatusRecorder{ResponseWriter: w}
		// Deferred: httputil.ReverseProxy ends a response that broke off
		// mid-stream (a watch whose client left) by panicking with
		// http.ErrAbortHandler, and such requests must be counted too.
		defer func() {
			code := int32(rec.Code())
			if code == 0 {
				code = http.StatusOK
			}
			counters.Get(requestSeries{verb, resource, code}).Inc()
			if verb != "watch" && code != http.StatusSwitchingProtocols {
				durations.Get(verb).Observe(time.Since(start).Seconds())
			}
		}()
		h.ServeHTTP(rec, r)
	})
}

// requestSeries are the label values of a request's series under one
// handler.
type requestSeries struct {
	verb, resource string
	code           int32
}

// maxResourceLabels bounds the distinct resource label values; a cluster's
// resources, built-in and custom, fit well within it.
const maxResourceLabels = 1000

// labelSet admits up to max distinct values and maps the rest to "other".
type labelSet struct {
	max int

	mu   sync.Mutex // protects the field below
	seen map[string]bool
}

func (l *labelSet) bound(v string) string {
	if !utf8.ValidString(v) {
		// Prometheus refuses label values that are not UTF-8; a client
		// can put any bytes in a path.
		return "other"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[v] {
		return v
	}
	if len(l.seen) >= l.max {
		return "other"
	}
	l.seen[v] = true
	return v
}

// knownVerbs are the verbs RequestInfo produces for well-formed requests;
// non-resource requests carry the lower-cased HTTP method.
var knownVerbs = sets.NewString("get", "list", "watch", "create", "update", "patch", "delete",
	"deletecollection", "proxy", "head", "options", "post", "put", "connect")

func boundedVerb(v string) string {
	v = strings.ToLower(v)
	if knownVerbs.Has(v) {
		return v
	}
	return "other"
}
