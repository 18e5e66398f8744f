package rewriting

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// FuzzSelectedRequest sends a selected caller's request of any method,
// path, content type and body through the filter, to a backend that
// answers with any content type and body: the filter must answer every
// one, never panic, never relay a protobuf or CBOR answer, and give back
// its budget.
func FuzzSelectedRequest(f *testing.F) {
	f.Add("POST", "/apis/example.com/v1/namespaces/ns/widgets", "application/json", []byte(originalWidget), "application/json", []byte(renamedWidget))
	f.Add("PATCH", "/apis/example.com/v1/namespaces/ns/widgets/w", "application/json-patch+json", []byte(`[{"op":"add","path":"/metadata/labels/a","value":"b"}]`), "application/json", []byte(renamedWidget))
	f.Add("PUT", "/api/v1/namespaces/ns/configmaps/c", "application/vnd.kubernetes.protobuf", []byte("k8s\x00\x0a\x04\x0a\x02v1"), "application/yaml", []byte("kind: Status\n"))
	f.Add("GET", "/apis/example.com/v1/widgets?watch=1", "", []byte(nil), "application/json", []byte(`{"type":"ADDED","object":{}}{"type":`))
	f.Add("GET", "/apis", "", []byte(nil), "application/vnd.kubernetes.protobuf", []byte("k8s\x00"))
	f.Add("GET", "/api/v1/namespaces/ns/pods/p/log", "", []byte(nil), "text/plain", []byte("renamed.example.io"))
	f.Fuzz(func(t *testing.T, method, path, contentType string, body []byte, answerType string, answer []byte) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") || strings.ContainsAny(method, " \r\n\t/") || method == "" {
			return
		}
		rev := &reviewer{users: map[string]string{}}
		op := fakeToken(operatorSA, "1")
		rev.users[op] = operatorSA
		filter, err := New(Options{Profiles: testProfiles(t), Identify: rev.identify, MaxHeldBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", answerType)
			_, _ = w.Write(answer)
		})
		h := apihttp.WithRequestInfo(filter.Wrap(backend))
		r, err := http.NewRequest(method, "http://agent"+path, strings.NewReader(string(body)))
		if err != nil {
			return
		}
		r.Header.Set("Authorization", "Bearer "+op)
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == 0 {
			t.Fatal("no answer")
		}
		if mediaKind(answerType) == mediaBinary && len(answer) > 0 && w.Body.String() == string(answer) && apiPath(r.URL.Path) && !untouched(requestInfoOf(r)) && r.Method != http.MethodHead {
			t.Fatalf("a %s answer reached the selected caller as it came", answerType)
		}
		if !filter.budget.TryAcquire(filter.budgetCap) {
			t.Fatal("the request kept part of the budget")
		}
	})
}

// requestInfoOf returns r with its RequestInfo, as the chain parses it.
func requestInfoOf(r *http.Request) *http.Request {
	var out *http.Request
	apihttp.WithRequestInfo(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { out = r })).ServeHTTP(nil, r)
	return out
}
