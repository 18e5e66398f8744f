package status

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestProfilingHandlers checks that the metrics listener serves
// /debug/pprof/ only when profiling is asked for, next to its usual paths.
func TestProfilingHandlers(t *testing.T) {
	for _, profiling := range []bool{false, true} {
		t.Run(fmt.Sprintf("profiling=%v", profiling), func(t *testing.T) {
			ok := func() error { return nil }
			stepAside := func() error { return errors.New("unhealthy: no upstream") }
			srv := httptest.NewServer(handler(prometheus.NewRegistry(), ok, ok, stepAside, func() string { return "" }, "nftables (auto: test)", profiling))
			defer srv.Close()
			wantPprof := http.StatusNotFound
			if profiling {
				wantPprof = http.StatusOK
			}
			for path, want := range map[string]int{
				"/healthz":                       http.StatusOK,
				"/readyz":                        http.StatusOK,
				"/intercepting":                  http.StatusServiceUnavailable,
				"/metrics":                       http.StatusOK,
				"/debug/pprof/":                  wantPprof,
				"/debug/pprof/goroutine?debug=1": wantPprof,
				"/debug/pprof/cmdline":           wantPprof,
			} {
				resp, err := srv.Client().Get(srv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
				}
				if path == "/readyz" && string(body) != "ok; dataplane nftables (auto: test)" {
					t.Errorf("GET /readyz: %q, want ok and the dataplane with its reason", body)
				}
				if path == "/debug/pprof/goroutine?debug=1" && profiling && !strings.Contains(string(body), "goroutine profile:") {
					t.Errorf("GET %s: body is not a goroutine profile: %.100q", path, body)
				}
			}
		})
	}
}
