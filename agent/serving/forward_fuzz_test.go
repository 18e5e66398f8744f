package serving

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

// FuzzForwardRequest sends malformed and odd requests (method, path, query,
// content negotiation, an arbitrary header) through the agent's request
// path with the cache off. Every request must either reach upstream with the
// caller's Authorization unchanged and no X-Remote-* header, or be answered
// by the agent itself with an error status carrying a metav1.Status; it
// must never panic.
func FuzzForwardRequest(f *testing.F) {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Upstream", "1")
		w.Header().Set("X-Saw-Authorization", r.Header.Get("Authorization"))
		for k := range r.Header {
			if strings.HasPrefix(k, "X-Remote-") {
				w.Header().Set("X-Saw-Remote", k)
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	f.Cleanup(upstream.Close)

	for _, seed := range [][6]string{
		{"GET", "/api/v1/namespaces/default/pods", "resourceVersion=0", "application/json", "", ""},
		{"GET", "/api/v1/namespaces/default/pods", "watch=true&resourceVersion=5", "application/vnd.kubernetes.protobuf", "", ""},
		{"GET", "/apis/apps/v1/namespaces/x/deployments/y", "", "application/json;as=Table;v=v1;g=meta.k8s.io", "Impersonate-User", "admin"},
		{"POST", "/api/v1/namespaces/x/pods/p/exec", "command=sh", "", "Upgrade", "SPDY/3.1"},
		{"GET", "/api/v1/namespaces/%2e%2e/pods", "labelSelector=a%3D%3D%3Db", "*/*", "X-Remote-User", "system:admin"},
		{"DELETE", "/api//v1/../namespaces", "fieldSelector=spec.nodeName%3D", "application/yaml", "X-Remote-Group", "system:masters"},
		{"GET", "/api/v1/pods", "limit=-1&continue=%ff", "application/json, */*;q=0.1", "Accept-Encoding", "gzip"},
		{"G E T", "/", "", "", "Bad Header", "x"},
		{"PATCH", "/apis/", "resourceVersionMatch=Exact", "text/html", "Content-Type", "application/apply-patch+yaml"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4], seed[5])
	}
	f.Fuzz(func(t *testing.T, method, path, query, accept, hdrName, hdrValue string) {
		a := newTestAgent(t, upstream)
		t.Cleanup(a.up.Transport().CloseIdleConnections)
		// The request is parsed from its wire form, as net/http's server
		// parses what a pod sends: what it rejects never reaches the
		// agent.
		var raw strings.Builder
		raw.WriteString(method + " " + path)
		if query != "" {
			raw.WriteString("?" + query)
		}
		raw.WriteString(" HTTP/1.1\r\nHost: kubernetes.default.svc\r\nAuthorization: Bearer pod-token\r\n")
		if accept != "" {
			raw.WriteString("Accept: " + accept + "\r\n")
		}
		if hdrName != "" {
			raw.WriteString(hdrName + ": " + hdrValue + "\r\n")
		}
		raw.WriteString("\r\n")
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw.String())))
		if err != nil || req.ContentLength != 0 || len(req.TransferEncoding) > 0 {
			// Rejected by the server, or a request with a body, which
			// this target does not send.
			return
		}
		req.RemoteAddr = "10.244.0.10:40000"
		sentAuth := req.Header.Get("Authorization")
		w := httptest.NewRecorder()
		a.handler.ServeHTTP(w, req.WithContext(context.Background()))
		resp := w.Result()

		if resp.Header.Get("X-Upstream") == "1" {
			if got := resp.Header.Get("X-Saw-Authorization"); got != sentAuth {
				t.Errorf("upstream saw Authorization %q, want the caller's", got)
			}
			if k := resp.Header.Get("X-Saw-Remote"); k != "" {
				t.Errorf("upstream received %s", k)
			}
			return
		}
		if resp.StatusCode < 400 {
			t.Fatalf("answered %d without reaching upstream", resp.StatusCode)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(w.Body.Bytes(), nil, nil)
		if err != nil {
			t.Fatalf("error answer %d is not a Status: %v: %q", resp.StatusCode, err, w.Body.String())
		}
		if s, ok := obj.(*metav1.Status); !ok || s.Code != int32(resp.StatusCode) {
			t.Fatalf("error answer %d carries %#v", resp.StatusCode, obj)
		}
	})
}
