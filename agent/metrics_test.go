package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

func TestInstrumentLabels(t *testing.T) {
	tests := []struct {
		name, method, target string
		code                 int
		want                 string // verb,resource,code
	}{{
		name: "namespaced list", method: "GET", target: "/api/v1/namespaces/x/configmaps", code: 200,
		want: "list,configmaps,200",
	}, {
		name: "watch via query", method: "GET", target: "/api/v1/namespaces/x/configmaps?watch=true", code: 200,
		want: "watch,configmaps,200",
	}, {
		name: "subresource", method: "POST", target: "/api/v1/namespaces/x/pods/p/exec", code: 500,
		want: "create,pods/exec,500",
	}, {
		name: "group resource delete", method: "DELETE", target: "/apis/apps/v1/namespaces/x/deployments/d", code: 404,
		want: "delete,deployments,404",
	}, {
		name: "non-resource", method: "GET", target: "/version", code: 200,
		want: "get,,200",
	}, {
		// Prometheus panics on a label value that is not UTF-8; a path
		// can hold any bytes.
		name: "resource not UTF-8", method: "GET", target: "/api/v1/namespaces/x/%FA", code: 404,
		want: "list,other,404",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics()
			h := apihttp.WithRequestInfo(m.instrument("forward", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.code)
			})))
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(tc.method, tc.target, nil))
			l := strings.Split(tc.want, ",")
			if got := testutil.ToFloat64(m.requests.WithLabelValues(l[0], l[1], "forward", l[2])); got != 1 {
				t.Errorf("requests{%s} = %v, want 1", tc.want, got)
			}
		})
	}
}

// TestResourceLabelsBounded checks that arbitrary paths cannot grow the
// label set without limit.
func TestResourceLabelsBounded(t *testing.T) {
	m := newMetrics()
	m.resources.max = 3
	h := apihttp.WithRequestInfo(m.instrument("forward", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	for i := range 10 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/api/v1/junk"+strings.Repeat("x", i), nil))
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("BREW", "/api/v1/pods", nil))
	if got := testutil.CollectAndCount(m.requests); got != 5 {
		t.Errorf("%d series, want 3 admitted resources + other + one for the unknown verb", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("list", "other", "forward", "200")); got != 7 {
		t.Errorf("other = %v, want 7", got)
	}
}
