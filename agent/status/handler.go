package status

import (
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// handler serves /metrics (the metrics in g), /healthz and /livez
// (healthy), /readyz (ready) and /intercepting (intercepting), each 200
// "ok" or 503 with the reason, the ready and intercepting answers followed
// by note (degraded mode, a blocked source), and with profiling the pprof
// endpoints. It checks no credentials: the
// metrics listener serves it behind metricsAuth.secure.
func handler(g prometheus.Gatherer, healthy, ready, intercepting func() error, note func() string, dataplane string, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		// pprof.Index also serves the named profiles (heap, goroutine,
		// allocs, ...) below /debug/pprof/.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	for path, check := range map[string]func() error{"/healthz": healthy, "/livez": healthy, "/readyz": ready, "/intercepting": intercepting} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			if err := check(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			msg := "ok"
			if n := note(); n != "" && (path == "/intercepting" || path == "/readyz") {
				msg += "; " + n
			}
			if dataplane != "" && path != "/healthz" && path != "/livez" {
				msg += "; dataplane " + dataplane
			}
			_, _ = w.Write([]byte(msg))
		})
	}
	return mux
}
