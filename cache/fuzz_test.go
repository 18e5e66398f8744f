package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/scheme"
)

// FuzzCacheDecision sends malformed and odd reads (path, query with
// selectors and resourceVersions, content negotiation, an arbitrary header,
// user agent) to the cache's handler over a cache holding node-a's pods and
// all services. A request the cache must not answer has to be forwarded;
// one it answers gets a decodable object or list, or a metav1.Status.
//
// What must never be answered from the cache, whatever the input:
//   - anything but GET of get, list or watch-list on pods or services at
//     v1, without subresource;
//   - impersonation, or a request without a bearer token;
//   - a watch of one object by the deprecated path form, continue tokens,
//     resourceVersionMatch=Exact, query parameters the cache does not know;
//   - YAML or pretty output;
//   - a pod list whose field selector does not pin spec.nodeName to the
//     cache's node (the cache holds only that node's pods).
func FuzzCacheDecision(f *testing.F) {
	for _, seed := range [][7]string{
		{"GET", "/api/v1/namespaces/ns/pods", "fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0", "application/json", "", "", "kubectl"},
		{"GET", "/api/v1/namespaces/ns/pods", "fieldSelector=spec.nodeName%3Dnode-b", "application/vnd.kubernetes.protobuf", "", "", ""},
		{"GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dnode-a%2Cspec.nodeName%21%3Dnode-a", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/pods", "fieldSelector=spec.nodeName%3D%3Dnode-a&labelSelector=app+in+%28p1%29", "*/*", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "labelSelector=a%3D%3D%3Db", "application/json", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services/s1", "resourceVersion=5", "application/json;as=Table;v=v1;g=meta.k8s.io", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "resourceVersion=10&resourceVersionMatch=Exact", "", "Impersonate-User", "admin", ""},
		{"GET", "/api/v1/namespaces/ns/services", "watch=1&resourceVersion=0", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "watch=1&resourceVersion=7", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "limit=1&continue=abc", "application/yaml", "", "", "curl/8"},
		{"GET", "/api/v1/namespaces/ns/pods/p1/log", "follow=true", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/pods/p1", "resourceVersion=18446744073709551616", "application/json", "Authorization", "Basic eDp5", ""},
		{"HEAD", "/api/v1/namespaces/ns/services/s1", "", "", "", "", ""},
		{"GET", "/api/v1/namespaces/ns/services", "pretty=true&timeoutSeconds=-1", "application/json;pretty=1", "", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4], seed[5], seed[6])
	}
	f.Fuzz(func(t *testing.T, method, path, query, accept, hdrName, hdrValue, userAgent string) {
		tc := newHandlerCache(t)
		req := &http.Request{
			Method:     method,
			URL:        &url.URL{Path: path, RawQuery: query},
			Proto:      "HTTP/1.1",
			ProtoMajor: 1,
			ProtoMinor: 1,
			Header:     http.Header{},
			Host:       "kubernetes.default.svc",
			RemoteAddr: "10.244.0.10:40000",
			Body:       http.NoBody,
		}
		req.Header.Set("Authorization", "Bearer token")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		if userAgent != "" {
			req.Header.Set("User-Agent", userAgent)
		}
		if hdrName != "" {
			req.Header.Add(hdrName, hdrValue)
		}
		// A watch the cache answers lasts until its context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		info, err := handlerInfoFactory.NewRequestInfo(req)
		if err == nil {
			ctx = request.WithRequestInfo(ctx, info)
		}
		rec := httptest.NewRecorder()
		tc.handler.ServeHTTP(rec, req.WithContext(ctx))
		if rec.Code == 299 {
			return // forwarded: kube-apiserver answers
		}

		// Answered by the cache: it must have been allowed to.
		if why := mustForward(req, info); why != "" {
			t.Fatalf("answered %d from the cache although %s: %s %s?%s Accept=%q %s=%q", rec.Code, why, method, path, query, accept, hdrName, hdrValue)
		}
		body := rec.Body.Bytes()
		if rec.Code >= 400 {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
			if err != nil {
				t.Fatalf("error %d from the cache is not a Status: %v: %q", rec.Code, err, body)
			}
			if st, ok := obj.(*metav1.Status); !ok || st.Code != int32(rec.Code) {
				t.Fatalf("error %d from the cache carries %#v", rec.Code, obj)
			}
			return
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("cache answered %d", rec.Code)
		}
		ct := rec.Header().Get("Content-Type")
		if !strings.HasPrefix(ct, "application/json") && !strings.HasPrefix(ct, "application/vnd.kubernetes.protobuf") {
			t.Fatalf("cache answered with Content-Type %q", ct)
		}
		// Whatever shape the answer has, a pod in it belongs to node-a.
		if info.Resource == "pods" && strings.HasPrefix(ct, "application/json") {
			for _, node := range nodeNames(body) {
				if node != "node-a" {
					t.Fatalf("the cache answered with a pod of node %q: %s", node, body)
				}
			}
		}
	})
}

// nodeNames returns every "nodeName" value in a JSON document or stream of
// documents.
func nodeNames(b []byte) []string {
	var out []string
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "nodeName" {
					out = append(out, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	for {
		var v any
		if dec.Decode(&v) != nil {
			return out
		}
		walk(v)
	}
}

// mustForward returns why req must not be answered from the cache, or "".
// It is written from the API's rules and the design, not from the
// classifier's code: forwarding is always allowed, so it lists only what
// must never be answered locally.
func mustForward(req *http.Request, info *request.RequestInfo) string {
	switch {
	case req.Method != http.MethodGet:
		return "the method is " + req.Method
	case info == nil || !info.IsResourceRequest:
		return "it is not a resource request"
	case info.Verb != "get" && info.Verb != "list" && info.Verb != "watch":
		return "the verb is " + info.Verb
	case info.Subresource != "":
		return "it names a subresource"
	case info.APIGroup != "" || info.APIVersion != "v1" || (info.Resource != "pods" && info.Resource != "services"):
		return "the resource is not cached"
	}
	for k := range req.Header {
		if strings.HasPrefix(strings.ToLower(k), "impersonate-") {
			return "it impersonates"
		}
	}
	auth := req.Header.Values("Authorization")
	if len(auth) == 0 || !strings.HasPrefix(strings.ToLower(auth[0]), "bearer ") {
		return "it carries no bearer token"
	}
	accept := strings.ToLower(strings.Join(req.Header.Values("Accept"), ","))
	for _, s := range []string{"yaml", "pretty"} {
		if strings.Contains(accept, s) {
			return "the Accept header asks for " + s
		}
	}
	// On a malformed query Go's parser keeps what it could parse, as
	// kube-apiserver's does.
	q, _ := url.ParseQuery(req.URL.RawQuery)
	known := map[string]bool{"resourceVersion": true, "resourceVersionMatch": true, "labelSelector": true,
		"fieldSelector": true, "limit": true, "timeoutSeconds": true}
	switch info.Verb {
	case "get":
		known = map[string]bool{"resourceVersion": true}
	case "watch":
		known = map[string]bool{"resourceVersion": true, "resourceVersionMatch": true, "labelSelector": true,
			"fieldSelector": true, "timeoutSeconds": true, "allowWatchBookmarks": true, "sendInitialEvents": true,
			"watch": true, "timeout": true}
	}
	for k := range q {
		if !known[k] && !(k == "includeObject" && strings.Contains(accept, "as=table")) {
			return "it has the query parameter " + k
		}
	}
	if q.Has("continue") {
		return "it has a continue token"
	}
	if strings.EqualFold(q.Get("resourceVersionMatch"), "Exact") {
		return "resourceVersionMatch is Exact"
	}
	if info.Verb == "watch" && info.Name != "" {
		// A watch of one object is answered only by a metadata.name field
		// selector naming it, not by the deprecated path form.
		sel, err := fields.ParseSelector(q.Get("fieldSelector"))
		if err != nil {
			return "its field selector does not parse"
		}
		if v, ok := sel.RequiresExactMatch("metadata.name"); !ok || v != info.Name {
			return "it watches one object by its path"
		}
	}
	if info.Verb != "get" && info.Resource == "pods" {
		sel, err := fields.ParseSelector(q.Get("fieldSelector"))
		if err != nil {
			return "its field selector does not parse"
		}
		if v, ok := sel.RequiresExactMatch("spec.nodeName"); !ok || v != "node-a" {
			return "its field selector does not pin spec.nodeName=node-a"
		}
	}
	return ""
}
