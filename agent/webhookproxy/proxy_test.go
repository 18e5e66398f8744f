package webhookproxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

// testRewriter renames example.com to renamed.example.io, kinds with the
// prefix Renamed (resources renamed), and label and finalizer keys of
// example.com to renamed.example.io.
func testRewriter(t *testing.T) *rewrite.Rewriter {
	t.Helper()
	domains := []v1alpha1.KeyDomainRename{{From: "example.com", To: "renamed.example.io"}}
	r, err := rewrite.New(v1alpha1.RewriteProfile{
		Name:       "p",
		Selector:   v1alpha1.CallerSelector{ServiceAccounts: []string{"ns/op"}},
		Groups:     []v1alpha1.GroupRename{{From: "example.com", To: "renamed.example.io"}},
		KindPrefix: "Renamed",
		Labels:     domains,
		Finalizers: domains,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// backend is a test webhook server: it counts its calls and hands each
// to handle.
type backend struct {
	*httptest.Server
	calls  atomic.Int32
	handle func(t *testing.T, w http.ResponseWriter, r *http.Request)
}

func newBackend(t *testing.T, handle func(t *testing.T, w http.ResponseWriter, r *http.Request)) *backend {
	t.Helper()
	b := &backend{handle: handle}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		b.handle(t, w, r)
	}))
	t.Cleanup(b.Close)
	return b
}

// newProxy builds a proxy in front of backendURL (with an optional
// path suffix) and its metrics registry.
func newProxy(t *testing.T, backendURL string, o Options) (*Proxy, *prometheus.Registry) {
	t.Helper()
	u, err := url.Parse(backendURL)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o.Rewriter, o.Backend, o.Registry = testRewriter(t), u, reg
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p, reg
}

// post sends body to the proxy as kube-apiserver does.
func post(p http.Handler, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)
	return rec
}

// decode parses JSON into a map, failing the test on error.
func decode(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, data)
	}
	return m
}

// TestAdmissionReviewRoundTrip: kube-apiserver's review of a renamed
// Widget reaches the webhook server with the original names, and the
// server's JSON patch, warnings and answer come back renamed.
func TestAdmissionReviewRoundTrip(t *testing.T) {
	const review = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
		"uid":"u-1",
		"kind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},
		"resource":{"group":"renamed.example.io","version":"v1","resource":"renamedwidgets"},
		"requestKind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},
		"requestResource":{"group":"renamed.example.io","version":"v1","resource":"renamedwidgets"},
		"name":"w","namespace":"default","operation":"CREATE",
		"userInfo":{"username":"admin"},
		"object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget",
			"metadata":{"name":"w","namespace":"default","labels":{"renamed.example.io/tier":"gold","app":"w"}},
			"spec":{"size":3}},
		"oldObject":null,"dryRun":false,
		"options":{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}}}`
	// What the webhook server must get: the original names, its request
	// otherwise as sent.
	const wantRequest = `{
		"uid":"u-1",
		"kind":{"group":"example.com","version":"v1","kind":"Widget"},
		"resource":{"group":"example.com","version":"v1","resource":"widgets"},
		"requestKind":{"group":"example.com","version":"v1","kind":"Widget"},
		"requestResource":{"group":"example.com","version":"v1","resource":"widgets"},
		"name":"w","namespace":"default","operation":"CREATE",
		"userInfo":{"username":"admin"},
		"object":{"apiVersion":"example.com/v1","kind":"Widget",
			"metadata":{"name":"w","namespace":"default","labels":{"example.com/tier":"gold","app":"w"}},
			"spec":{"size":3}},
		"oldObject":null,"dryRun":false,
		"options":{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}}`
	// The webhook server's patch, in its names. /kind is there to show
	// that the patch is rewritten as a patch of the request's kind,
	// although the answer carries no request.
	const patch = `[{"op":"add","path":"/metadata/labels/example.com~1managed","value":"yes"},` +
		`{"op":"add","path":"/metadata/finalizers","value":["example.com/cleanup"]},` +
		`{"op":"replace","path":"/kind","value":"Widget"}]`
	const wantPatch = `[{"op":"add","path":"/metadata/labels/renamed.example.io~1managed","value":"yes"},` +
		`{"op":"add","path":"/metadata/finalizers","value":["renamed.example.io/cleanup"]},` +
		`{"op":"replace","path":"/kind","value":"RenamedWidget"}]`

	b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/prefix/mutate-widget" || r.URL.RawQuery != "timeout=10s" {
			t.Errorf("webhook server got %s %s, want POST /prefix/mutate-widget?timeout=10s", r.Method, r.URL)
		}
		if ct, accept := r.Header.Get("Content-Type"), r.Header.Get("Accept"); ct != "application/json" || accept != "application/json" {
			t.Errorf("webhook server got Content-Type %q, Accept %q; want application/json", ct, accept)
		}
		for _, h := range []string{"Authorization", "X-Hop", "X-Custom", "Keep-Alive"} {
			if v := r.Header.Get(h); v != "" {
				t.Errorf("webhook server got the caller's %s header %q", h, v)
			}
		}
		body, _ := io.ReadAll(r.Body)
		got := decode(t, body)
		if got["apiVersion"] != "admission.k8s.io/v1" || got["kind"] != "AdmissionReview" {
			t.Errorf("webhook server got apiVersion %v kind %v", got["apiVersion"], got["kind"])
		}
		if diff := cmp.Diff(decode(t, []byte(wantRequest)), got["request"]); diff != "" {
			t.Errorf("webhook server's request (-want +got):\n%s", diff)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u-1","allowed":true,`+
			`"patchType":"JSONPatch","patch":"`+base64.StdEncoding.EncodeToString([]byte(patch))+`",`+
			`"warnings":["example.com/v1 Widget is deprecated; use example.com/v2 Widget"]}}`)
	})
	p, _ := newProxy(t, b.URL+"/prefix/", Options{})

	req := httptest.NewRequest(http.MethodPost, "/mutate-widget?timeout=10s", strings.NewReader(review))
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Authorization", "Bearer kube-apiserver-token")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("X-Custom", "1")
	req.Header.Set("Keep-Alive", "timeout=5")
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, req)

	if rec.Code != http.StatusOK {
		t.Fatalf("proxy answered %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	want := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"allowed":true,` +
		`"patch":"` + base64.StdEncoding.EncodeToString([]byte(wantPatch)) + `","patchType":"JSONPatch","uid":"u-1",` +
		`"warnings":["renamed.example.io/v1 RenamedWidget is deprecated; use renamed.example.io/v2 RenamedWidget"]}}`
	if got := rec.Body.String(); got != want {
		t.Errorf("proxy answered\n%s\nwant\n%s", got, want)
		if m := decode(t, rec.Body.Bytes()); m["response"] != nil {
			if s, ok := m["response"].(map[string]any)["patch"].(string); ok {
				raw, _ := base64.StdEncoding.DecodeString(s)
				t.Errorf("its patch: %s", raw)
			}
		}
	}
	if n := b.calls.Load(); n != 1 {
		t.Errorf("webhook server called %d times, want 1", n)
	}
	if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues("AdmissionReview", "200")); n != 1 {
		t.Errorf("kube_apicache_webhook_proxy_requests_total{kind=AdmissionReview,code=200} = %v, want 1", n)
	}
	if n := testutil.CollectAndCount(p.metrics.duration); n != 1 {
		t.Errorf("duration series %d, want 1", n)
	}
}

// TestAdmissionReviewDenied: a denial's status comes back renamed, and an
// answer that carries its request keeps it.
func TestAdmissionReviewDenied(t *testing.T) {
	b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview",`+
			`"request":{"uid":"u-2","kind":{"group":"example.com","version":"v1","kind":"Widget"}},`+
			`"response":{"uid":"u-2","allowed":false,"status":{"code":403,"message":"widgets.example.com \"w\" is forbidden: size too large","details":{"group":"example.com","kind":"widgets","name":"w"}}}}`)
	})
	p, _ := newProxy(t, b.URL, Options{})
	rec := post(p, "/validate", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u-2","kind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"},"name":"w","operation":"UPDATE"}}`)
	want := `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview",` +
		`"request":{"kind":{"group":"renamed.example.io","kind":"RenamedWidget","version":"v1"},"uid":"u-2"},` +
		`"response":{"allowed":false,"status":{"code":403,"details":{"group":"renamed.example.io","kind":"renamedwidgets","name":"w"},"message":"renamedwidgets.renamed.example.io \"w\" is forbidden: size too large"},"uid":"u-2"}}`
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("proxy answered %d\n%s\nwant 200\n%s", rec.Code, rec.Body, want)
	}
}

// TestConversionReviewRoundTrip: the desired version and the objects
// reach the webhook server with the original names, and the converted
// objects come back renamed.
func TestConversionReviewRoundTrip(t *testing.T) {
	const review = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"c-1",
		"desiredAPIVersion":"renamed.example.io/v2",
		"objects":[
			{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"a","labels":{"renamed.example.io/tier":"gold"},"finalizers":["renamed.example.io/cleanup"]},"spec":{"size":1}},
			{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"name":"b"},"spec":{"size":2.50}}]}}`
	const wantRequest = `{"uid":"c-1",
		"desiredAPIVersion":"example.com/v2",
		"objects":[
			{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a","labels":{"example.com/tier":"gold"},"finalizers":["example.com/cleanup"]},"spec":{"size":1}},
			{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"b"},"spec":{"size":2.50}}]}`
	b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/convert" {
			t.Errorf("webhook server got path %q, want /convert", r.URL.Path)
		}
		body, _ := io.ReadAll(r.Body)
		got := decode(t, body)
		if got["apiVersion"] != "apiextensions.k8s.io/v1" || got["kind"] != "ConversionReview" {
			t.Errorf("webhook server got apiVersion %v kind %v", got["apiVersion"], got["kind"])
		}
		if diff := cmp.Diff(decode(t, []byte(wantRequest)), got["request"]); diff != "" {
			t.Errorf("webhook server's request (-want +got):\n%s", diff)
		}
		if !strings.Contains(string(body), `"size":2.50`) {
			t.Errorf("a number was not passed digit for digit: %s", body)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","response":{"uid":"c-1",`+
			`"convertedObjects":[`+
			`{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"a","labels":{"example.com/tier":"gold"},"finalizers":["example.com/cleanup"]},"spec":{"replicas":1}},`+
			`{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"name":"b"},"spec":{"replicas":2.50}}],`+
			`"result":{"status":"Success"}}}`)
	})
	p, _ := newProxy(t, b.URL, Options{})
	rec := post(p, "/convert", review)
	want := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","response":{` +
		`"convertedObjects":[` +
		`{"apiVersion":"renamed.example.io/v2","kind":"RenamedWidget","metadata":{"finalizers":["renamed.example.io/cleanup"],"labels":{"renamed.example.io/tier":"gold"},"name":"a"},"spec":{"replicas":1}},` +
		`{"apiVersion":"renamed.example.io/v2","kind":"RenamedWidget","metadata":{"name":"b"},"spec":{"replicas":2.50}}],` +
		`"result":{"status":"Success"},"uid":"c-1"}}`
	if rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("proxy answered %d\n%s\nwant 200\n%s", rec.Code, rec.Body, want)
	}
	if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues("ConversionReview", "200")); n != 1 {
		t.Errorf("kube_apicache_webhook_proxy_requests_total{kind=ConversionReview,code=200} = %v, want 1", n)
	}
}

// validReview is a minimal AdmissionReview.
const validReview = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}`

// TestRefused: what is not a JSON POST of a review, or is too large, is
// answered by the proxy and never reaches the webhook server.
func TestRefused(t *testing.T) {
	large := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + strings.Repeat("x", 2000) + `"}}`
	for _, tc := range []struct {
		name        string
		method      string
		contentType string
		body        string
		chunked     bool
		wantCode    int
		wantKind    string
		wantMsg     string
	}{
		{name: "GET", method: http.MethodGet, contentType: "application/json", wantCode: 405, wantMsg: "method GET is not allowed"},
		{name: "PUT", method: http.MethodPut, contentType: "application/json", body: validReview, wantCode: 405, wantMsg: "only POST"},
		{name: "text/plain", contentType: "text/plain", body: validReview, wantCode: 415, wantMsg: `Content-Type "text/plain" is not supported`},
		{name: "no Content-Type", body: validReview, wantCode: 415, wantMsg: "is not supported"},
		{name: "JSON patch media type", contentType: "application/json-patch+json", body: validReview, wantCode: 415, wantMsg: "is not supported"},
		{name: "too large", contentType: "application/json", body: large, wantCode: 413, wantMsg: "larger than 1024 bytes"},
		{name: "too large, chunked", contentType: "application/json", body: large, chunked: true, wantCode: 413, wantMsg: "larger than 1024 bytes"},
		{name: "not JSON", contentType: "application/json", body: `{"apiVersion":`, wantCode: 400, wantMsg: "not JSON"},
		{name: "trailing data", contentType: "application/json", body: validReview + `{}`, wantCode: 400, wantMsg: "not JSON"},
		{name: "array", contentType: "application/json", body: `[{"kind":"AdmissionReview"}]`, wantCode: 400, wantMsg: "not a JSON object"},
		{name: "a Pod", contentType: "application/json", body: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, wantCode: 400, wantMsg: `apiVersion "v1" kind "Pod" is not a review`},
		{name: "unknown review version", contentType: "application/json", body: `{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{}}`, wantCode: 400, wantMsg: "is not a review"},
		{name: "review kind of the wrong group", contentType: "application/json", body: `{"apiVersion":"apiextensions.k8s.io/v1","kind":"AdmissionReview","request":{}}`, wantCode: 400, wantMsg: "is not a review"},
		{name: "no request", contentType: "application/json", body: `{"apiVersion":"apiextensions.k8s.io/v1beta1","kind":"ConversionReview"}`, wantCode: 400, wantKind: "ConversionReview", wantMsg: "the ConversionReview has no request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
				t.Error("the webhook server was called")
			})
			p, _ := newProxy(t, b.URL, Options{MaxBodyBytes: 1024})
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, "/validate", strings.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			if tc.chunked {
				req.ContentLength = -1
			}
			rec := httptest.NewRecorder()
			p.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Errorf("code %d, want %d (%s)", rec.Code, tc.wantCode, rec.Body)
			}
			if !strings.Contains(rec.Body.String(), tc.wantMsg) {
				t.Errorf("body %q, want it to say %q", rec.Body, tc.wantMsg)
			}
			if strings.Count(rec.Body.String(), "\n") != 1 || !strings.HasSuffix(rec.Body.String(), "\n") {
				t.Errorf("body %q is not one line", rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q, want text/plain", ct)
			}
			if tc.wantCode == 405 && rec.Header().Get("Allow") != "POST" {
				t.Errorf("Allow %q, want POST", rec.Header().Get("Allow"))
			}
			kind := tc.wantKind
			if kind == "" {
				kind = "other"
			}
			if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues(kind, strconv.Itoa(tc.wantCode))); n != 1 {
				t.Errorf("requests_total{kind=%s,code=%d} = %v, want 1", kind, tc.wantCode, n)
			}
		})
	}
}

// TestBackendFailures: a webhook server that fails, answers what is not
// a review, cannot be reached or does not answer in time.
func TestBackendFailures(t *testing.T) {
	t.Run("500 passed through", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("X-Backend", "1")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "widget webhook: example.com/v1 Widget broke\n")
		})
		p, _ := newProxy(t, b.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != 500 || rec.Body.String() != "widget webhook: example.com/v1 Widget broke\n" {
			t.Errorf("proxy answered %d %q, want the webhook server's 500 and body unchanged", rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
			t.Errorf("Content-Type %q, want text/plain", ct)
		}
		if rec.Header().Get("X-Backend") != "" {
			t.Error("the webhook server's headers were passed on")
		}
		if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues("AdmissionReview", "500")); n != 1 {
			t.Errorf("requests_total{kind=AdmissionReview,code=500} = %v, want 1", n)
		}
	})
	t.Run("error body bounded", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, strings.Repeat("y", 200<<10))
		})
		p, _ := newProxy(t, b.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != 503 || rec.Body.Len() != maxErrorBodyBytes {
			t.Errorf("proxy answered %d with %d bytes, want 503 with %d", rec.Code, rec.Body.Len(), maxErrorBodyBytes)
		}
	})
	t.Run("200 not JSON passed through", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>login</html>")
		})
		p, _ := newProxy(t, b.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != 200 || rec.Body.String() != "<html>login</html>" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
			t.Errorf("proxy answered %d %q %q, want 200 as plain text", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
	})
	t.Run("redirect not followed", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		})
		p, _ := newProxy(t, b.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != http.StatusTemporaryRedirect || b.calls.Load() != 1 {
			t.Errorf("proxy answered %d after %d calls, want 307 after 1", rec.Code, b.calls.Load())
		}
	})
	t.Run("200 JSON not an object", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `["no"]`)
		})
		p, _ := newProxy(t, b.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "not a JSON object") {
			t.Errorf("proxy answered %d %q, want 502", rec.Code, rec.Body)
		}
	})
	t.Run("answer too large", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"AdmissionReview","response":{"uid":"`+strings.Repeat("z", 2000)+`"}}`)
		})
		p, _ := newProxy(t, b.URL, Options{MaxBodyBytes: 1024})
		rec := post(p, "/validate", validReview)
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "larger than 1024 bytes") {
			t.Errorf("proxy answered %d %q, want 502", rec.Code, rec.Body)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		down := httptest.NewServer(http.NotFoundHandler())
		down.Close()
		p, _ := newProxy(t, down.URL, Options{})
		rec := post(p, "/validate", validReview)
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "calling the webhook server") || strings.Count(rec.Body.String(), "\n") != 1 {
			t.Errorf("proxy answered %d %q, want 502 and one line", rec.Code, rec.Body)
		}
		if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues("AdmissionReview", "502")); n != 1 {
			t.Errorf("requests_total{kind=AdmissionReview,code=502} = %v, want 1", n)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			// Read: net/http notices a closed connection once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		})
		p, _ := newProxy(t, b.URL, Options{Timeout: 50 * time.Millisecond})
		rec := post(p, "/validate", validReview)
		if rec.Code != http.StatusGatewayTimeout || !strings.Contains(rec.Body.String(), "did not answer within 50ms") {
			t.Errorf("proxy answered %d %q, want 504", rec.Code, rec.Body)
		}
	})
	t.Run("caller gone", func(t *testing.T) {
		reached := make(chan struct{})
		b := newBackend(t, func(t *testing.T, w http.ResponseWriter, r *http.Request) {
			// Read: net/http notices a closed connection once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			close(reached)
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		})
		p, _ := newProxy(t, b.URL, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-reached
			cancel()
		}()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/validate", strings.NewReader(validReview))
		req.Header.Set("Content-Type", "application/json")
		p.ServeHTTP(httptest.NewRecorder(), req)
		if n := testutil.ToFloat64(p.metrics.requests.WithLabelValues("AdmissionReview", "499")); n != 1 {
			t.Errorf("requests_total{kind=AdmissionReview,code=499} = %v, want 1", n)
		}
	})
}

// TestBackendURL: the backend's path prefix and the request's path and
// query join.
func TestBackendURL(t *testing.T) {
	for _, tc := range []struct{ backend, request, want string }{
		{"https://127.0.0.1:9443", "/validate?timeout=10s", "https://127.0.0.1:9443/validate?timeout=10s"},
		{"https://127.0.0.1:9443/", "/validate", "https://127.0.0.1:9443/validate"},
		{"https://h:9443/prefix", "/validate-example-com-v1-widget", "https://h:9443/prefix/validate-example-com-v1-widget"},
		{"https://h:9443/prefix/", "/a/b?x=1&y=2", "https://h:9443/prefix/a/b?x=1&y=2"},
		{"https://h/p%2Fq", "/a%2Fb", "https://h/p%2Fq/a%2Fb"},
		{"http://h:8080/p", "/", "http://h:8080/p/"},
	} {
		b, _ := url.Parse(tc.backend)
		in, _ := url.ParseRequestURI(tc.request)
		p := &Proxy{backend: b}
		if got := p.backendURL(in).String(); got != tc.want {
			t.Errorf("backend %s, request %s: %s, want %s", tc.backend, tc.request, got, tc.want)
		}
	}
}

// TestNewChecks: New refuses what it cannot proxy with, and registers
// nothing without a registry.
func TestNewChecks(t *testing.T) {
	r := testRewriter(t)
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, o := range []Options{
		{Backend: u("https://h:9443")},
		{Rewriter: r},
		{Rewriter: r, Backend: u("ftp://h")},
		{Rewriter: r, Backend: u("https://")},
		{Rewriter: r, Backend: u("https://user:pw@h:9443")},
		{Rewriter: r, Backend: u("https://h:9443?x=1")},
		{Rewriter: r, Backend: u("https://h:9443#f")},
		{Rewriter: r, Backend: u("https://h:9443"), MaxBodyBytes: -1},
		{Rewriter: r, Backend: u("https://h:9443"), Timeout: -time.Second},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v): no error", o)
		}
	}
	p, err := New(Options{Rewriter: r, Backend: u("https://h:9443")})
	if err != nil {
		t.Fatal(err)
	}
	if p.metrics != nil || p.maxBody != DefaultMaxBodyBytes || p.timeout != DefaultTimeout {
		t.Errorf("defaults: metrics %v, max body %d, timeout %s", p.metrics, p.maxBody, p.timeout)
	}
	// Not registered twice in one registry.
	reg := prometheus.NewRegistry()
	if _, err := New(Options{Rewriter: r, Backend: u("https://h:9443"), Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Rewriter: r, Backend: u("https://h:9443"), Registry: reg}); err == nil {
		t.Error("a second proxy registered in the same registry: no error")
	}
}
