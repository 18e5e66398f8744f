package rewriting

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apiserver/pkg/authentication/user"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
	"github.com/kube-apicache/kube-apicache/cache/access"
)

const (
	operatorSA = "system:serviceaccount:widgets:operator"
	otherSA    = "system:serviceaccount:widgets:other"
)

// fakeToken is a JWT-shaped token whose claims name sub; its signature
// is no signature at all: only the fake reviewer knows who it is.
func fakeToken(sub, id string) string {
	claims, _ := json.Marshal(map[string]string{"sub": sub, "jti": id})
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(claims) + ".c2ln"
}

// reviewer is a fake Identify: tokens it knows, and an error to return.
type reviewer struct {
	mu    sync.Mutex
	users map[string]string
	err   error
	calls int
}

func (f *reviewer) identify(r *http.Request) (user.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	tok, _ := access.BearerToken(r.Header)
	name, ok := f.users[tok]
	if !ok {
		return nil, nil
	}
	return &user.DefaultInfo{Name: name}, nil
}

func testProfiles(t testing.TB) rewrite.Profiles {
	t.Helper()
	keep := ""
	rw, err := rewrite.New(v1alpha1.RewriteProfile{
		Name:           "widgets",
		Selector:       v1alpha1.CallerSelector{ServiceAccounts: []string{"widgets/operator"}},
		Groups:         []v1alpha1.GroupRename{{From: "example.com", To: "renamed.example.io"}},
		KindPrefix:     "Renamed",
		ResourcePrefix: &keep,
		KeepCategories: []string{"all"},
		Labels:         []v1alpha1.KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
		Finalizers:     []v1alpha1.KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rewrite.Profiles{rw}
}

// seen is what the backend got.
type seen struct {
	method, path, query, accept, acceptEncoding, contentType, body string
}

// newChain returns the filter in front of backend, as serving composes
// it (request info first), and the backend's view of the last request.
func newChain(t *testing.T, rev *reviewer, backend http.HandlerFunc) (http.Handler, func() seen) {
	t.Helper()
	var mu sync.Mutex
	var last seen
	f, err := New(Options{Profiles: testProfiles(t), Identify: rev.identify})
	if err != nil {
		t.Fatal(err)
	}
	rec := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), r.Header.Get("Accept-Encoding"), r.Header.Get("Content-Type"), string(b)}
		mu.Unlock()
		backend(w, r)
	})
	return apihttp.WithRequestInfo(f.Wrap(rec)), func() seen {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

func jsonAnswer(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("Warning", `299 - "renamed.example.io/v1 RenamedWidget is deprecated; use renamed.example.io/v2 RenamedWidget"`)
		_, _ = io.WriteString(w, body+"\n")
	}
}

const renamedWidget = `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"finalizers":["renamed.example.io/cleanup"],"labels":{"renamed.example.io/tier":"gold"},"name":"w","namespace":"ns"},"spec":{"size":3}}`
const originalWidget = `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"finalizers":["example.com/cleanup"],"labels":{"example.com/tier":"gold"},"name":"w","namespace":"ns"},"spec":{"size":3}}`

func do(t *testing.T, h http.Handler, method, target, token, accept, contentType, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	r.Header.Set("Accept-Encoding", "gzip")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestNoProfilesIsNoFilter(t *testing.T) {
	next := http.NotFoundHandler()
	f, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Wrap(next); fmt.Sprintf("%p", got) != fmt.Sprintf("%p", next) {
		t.Error("Wrap without profiles put a handler in the chain")
	}
}

func TestUnselectedCallerUntouched(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	other := fakeToken(otherSA, "1")
	rev.users[other] = otherSA
	h, last := newChain(t, rev, jsonAnswer(renamedWidget))
	for _, tok := range []string{other, "not-a-jwt", ""} {
		w := do(t, h, "GET", "/apis/renamed.example.io/v1/namespaces/ns/widgets/w?labelSelector=renamed.example.io%2Ftier", tok, "application/vnd.kubernetes.protobuf,application/json", "", "")
		if got := w.Body.String(); got != renamedWidget+"\n" {
			t.Errorf("token %q: answer changed:\n%s", tok, got)
		}
		s := last()
		if s.path != "/apis/renamed.example.io/v1/namespaces/ns/widgets/w" || s.query != "labelSelector=renamed.example.io%2Ftier" || s.accept != "application/vnd.kubernetes.protobuf,application/json" || s.acceptEncoding != "gzip" {
			t.Errorf("token %q: request changed: %+v", tok, s)
		}
		if w := w.Header().Get("Warning"); !strings.Contains(w, "RenamedWidget") {
			t.Errorf("token %q: warning changed: %s", tok, w)
		}
	}
	if rev.calls != 0 {
		t.Errorf("%d token reviews for callers whose claims no profile selects, want 0", rev.calls)
	}
}

func TestSelectedCallerRenamedAndRestored(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, last := newChain(t, rev, jsonAnswer(renamedWidget))

	w := do(t, h, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w?labelSelector=example.com%2Ftier%3Dgold", op, "application/vnd.kubernetes.protobuf, application/json", "", "")
	if w.Code != 200 {
		t.Fatalf("code %d: %s", w.Code, w.Body)
	}
	if got := strings.TrimSpace(w.Body.String()); got != originalWidget {
		t.Errorf("answer:\n%s\nwant\n%s", got, originalWidget)
	}
	s := last()
	if s.path != "/apis/renamed.example.io/v1/namespaces/ns/widgets/w" || s.query != "labelSelector=renamed.example.io%2Ftier%3Dgold" {
		t.Errorf("upstream request %+v", s)
	}
	if s.accept != "application/json" || s.acceptEncoding != "" {
		t.Errorf("upstream Accept %q, Accept-Encoding %q; want JSON only, no compression", s.accept, s.acceptEncoding)
	}
	if warn := w.Header().Get("Warning"); !strings.Contains(warn, `"example.com/v1 Widget is deprecated; use example.com/v2 Widget"`) || strings.Contains(warn, "Renamed") {
		t.Errorf("warning not restored: %s", warn)
	}
	if cl := w.Header().Get("Content-Length"); cl != fmt.Sprint(w.Body.Len()) {
		t.Errorf("Content-Length %s for %d bytes", cl, w.Body.Len())
	}

	// A create: the body is renamed.
	w = do(t, h, "POST", "/apis/example.com/v1/namespaces/ns/widgets", op, "", "application/json", originalWidget)
	if w.Code != 200 {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	if got := last().body; got != renamedWidget {
		t.Errorf("create body upstream:\n%s\nwant\n%s", got, renamedWidget)
	}
	// A JSON patch of a label: its path is renamed.
	_ = do(t, h, "PATCH", "/apis/example.com/v1/namespaces/ns/widgets/w", op, "", "application/json-patch+json", `[{"op":"add","path":"/metadata/labels/example.com~1zone","value":"east"}]`)
	if got := last().body; got != `[{"op":"add","path":"/metadata/labels/renamed.example.io~1zone","value":"east"}]` {
		t.Errorf("JSON patch upstream: %s", got)
	}
}

func TestSelectedCallerRefusals(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, _ := newChain(t, rev, jsonAnswer(renamedWidget))
	for _, c := range []struct {
		name, method, accept, contentType, body string
		code                                    int
		reason                                  string
	}{
		{"protobuf only", "GET", "application/vnd.kubernetes.protobuf", "", "", 406, "NotAcceptable"},
		{"protobuf body", "POST", "application/json", "application/vnd.kubernetes.protobuf", "\x6b\x38\x73\x00", 415, "UnsupportedMediaType"},
		{"too large", "POST", "application/json", "application/json", `{"a":"` + strings.Repeat("x", DefaultMaxRequestBodyBytes) + `"}`, 413, "RequestEntityTooLarge"},
	} {
		w := do(t, h, c.method, "/apis/example.com/v1/namespaces/ns/widgets", op, c.accept, c.contentType, c.body)
		if c.accept == "application/vnd.kubernetes.protobuf" {
			// The Status comes in the one encoding the caller takes, as
			// kube-apiserver's would.
			if w.Code != c.code || !strings.Contains(w.Body.String(), c.reason) {
				t.Errorf("%s: %d %q, want %d %s", c.name, w.Code, w.Body, c.code, c.reason)
			}
			continue
		}
		var st struct {
			Kind, Reason string
			Code         int
		}
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
			t.Errorf("%s: answer %q is no Status: %v", c.name, w.Body, err)
			continue
		}
		if w.Code != c.code || st.Kind != "Status" || st.Reason != c.reason {
			t.Errorf("%s: %d %+v, want %d %s", c.name, w.Code, st, c.code, c.reason)
		}
	}
}

func TestUnreviewedCallerRetries(t *testing.T) {
	op := fakeToken(operatorSA, "1")
	for _, c := range []struct {
		err  error
		code int
	}{{access.ErrThrottled, 429}, {errors.New("connection refused"), 503}} {
		rev := &reviewer{err: c.err}
		h, _ := newChain(t, rev, jsonAnswer(renamedWidget))
		w := do(t, h, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w", op, "", "", "")
		if w.Code != c.code || w.Header().Get("Retry-After") == "" {
			t.Errorf("review error %v: %d (Retry-After %q), want %d with Retry-After", c.err, w.Code, w.Header().Get("Retry-After"), c.code)
		}
	}
}

// A token whose claims name a selected ServiceAccount but which
// kube-apiserver says is someone else's is not rewritten: the profile
// follows the review, never the claims.
func TestSelectionFollowsTheReview(t *testing.T) {
	forged := fakeToken(operatorSA, "forged")
	rev := &reviewer{users: map[string]string{forged: otherSA}}
	h, last := newChain(t, rev, jsonAnswer(renamedWidget))
	w := do(t, h, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w", forged, "", "", "")
	if last().path != "/apis/example.com/v1/namespaces/ns/widgets/w" || strings.TrimSpace(w.Body.String()) != renamedWidget {
		t.Errorf("a caller the review did not select was rewritten: %+v %s", last(), w.Body)
	}
	if rev.calls != 1 {
		t.Errorf("%d reviews, want 1", rev.calls)
	}
}

func TestUnrewritableAnswerFails(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, _ := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		_, _ = w.Write([]byte("k8s\x00renamed.example.io"))
	})
	w := do(t, h, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w", op, "", "", "")
	if w.Code != 500 || strings.Contains(w.Body.String(), "renamed.example.io") {
		t.Errorf("a protobuf answer reached a selected caller: %d %q", w.Code, w.Body)
	}
	// Plain text (logs) carries no names and passes.
	h, _ = newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("log line\n"))
	})
	w = do(t, h, "GET", "/api/v1/namespaces/ns/pods/p/log", op, "", "", "")
	if w.Code != 200 || w.Body.String() != "log line\n" {
		t.Errorf("logs: %d %q", w.Code, w.Body)
	}
}

// A watch is restored event by event: the first event reaches the client
// before the second is written.
func TestWatchStreamRestoredEventByEvent(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	second := make(chan struct{})
	h, last := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, `{"type":"ADDED","object":`+renamedWidget+"}\n")
		http.NewResponseController(w).Flush()
		<-second
		_, _ = io.WriteString(w, `{"type":"BOOKMARK","object":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/apis/example.com/v1/namespaces/ns/widgets?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+op)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	got := make(chan string, 2)
	go func() {
		for lines.Scan() {
			got <- lines.Text()
		}
		close(got)
	}()
	select {
	case l := <-got:
		if l != `{"object":`+originalWidget+`,"type":"ADDED"}` {
			t.Errorf("first event %s", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event did not arrive before the second was written")
	}
	close(second)
	if l := <-got; l != `{"object":{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"annotations":{"k8s.io/initial-events-end":"true"},"resourceVersion":"9"}},"type":"BOOKMARK"}` {
		t.Errorf("bookmark %s", l)
	}
	if p := last().path; p != "/apis/renamed.example.io/v1/namespaces/ns/widgets" {
		t.Errorf("upstream path %s", p)
	}
}

func TestMemoRewritesOnce(t *testing.T) {
	m := newMemo(1 << 10)
	calls := 0
	fn := func(b []byte) ([]byte, error) { calls++; return append([]byte("x"), b...), nil }
	for range 3 {
		out, err := m.do([]byte("obj"), fn)
		if err != nil || string(out) != "xobj" {
			t.Fatalf("%q %v", out, err)
		}
	}
	if calls != 1 {
		t.Errorf("rewritten %d times, want 1", calls)
	}
	big := make([]byte, 2<<10)
	if _, err := m.do(big, fn); err != nil {
		t.Fatal(err)
	}
	if _, err := m.do(big, fn); err != nil || calls != 3 {
		t.Errorf("an answer larger than the memo was kept (calls %d)", calls)
	}
}

func TestUnverifiedSubject(t *testing.T) {
	for tok, want := range map[string]string{
		fakeToken(operatorSA, "1"):               operatorSA,
		"abc":                                    "",
		"a.b.c":                                  "",
		"a." + strings.Repeat("x", 20000) + ".c": "",
		// Not compact, or escaped: read with the JSON decoder.
		"h." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub" : "system:serviceaccount:a:b"}`)) + ".s":    "system:serviceaccount:a:b",
		"h." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"system:serviceaccount:a:\u0062"}`)) + ".s": "system:serviceaccount:a:b",
		"h." + base64.URLEncoding.EncodeToString([]byte(`{"sub":"x"}`)) + ".s":                                 "x",
	} {
		if got := unverifiedSubject(tok); got != want {
			t.Errorf("unverifiedSubject(%.20q) = %q, want %q", tok, got, want)
		}
	}
}

func TestOnlyAPIPathsRewritten(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, last := newChain(t, rev, jsonAnswer(renamedWidget))
	for _, p := range []string{"/openapi/v2", "/openapi/v3x", "/version", "/apisx/renamed.example.io"} {
		w := do(t, h, "GET", p, op, "application/com.github.proto-openapi.spec.v3@v1.0+protobuf", "", "")
		if last().path != p || last().accept != "application/com.github.proto-openapi.spec.v3@v1.0+protobuf" || w.Body.String() != renamedWidget+"\n" {
			t.Errorf("%s was rewritten: %+v", p, last())
		}
	}
	if rev.calls != 0 {
		t.Errorf("%d reviews for paths that are never rewritten", rev.calls)
	}
	for p, want := range map[string]bool{"/api": true, "/apis": true, "/api/v1": true, "/apis/": true, "/apiary": false, "/": false} {
		if got := apiPath(p); got != want {
			t.Errorf("apiPath(%q) = %v", p, got)
		}
	}
}

// A built-in object sent in protobuf goes on as JSON, renamed.
func TestProtobufBodyTranscoded(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, last := newChain(t, rev, jsonAnswer(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`))
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "c", OwnerReferences: []metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Widget", Name: "w", UID: "u"}}}}
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme).Encode(cm, &buf); err != nil {
		t.Fatal(err)
	}
	w := do(t, h, "POST", "/api/v1/namespaces/ns/configmaps", op, "application/vnd.kubernetes.protobuf, application/json", "application/vnd.kubernetes.protobuf", buf.String())
	if w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	s := last()
	if s.contentType != "application/json" || !strings.Contains(s.body, `"ownerReferences":[{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget"`) {
		t.Errorf("upstream got %q:\n%s", s.contentType, s.body)
	}
}

// A watch's headers reach the client when the watch starts, before any
// event: clients wait for them.
func TestWatchHeadersBeforeFirstEvent(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	release := make(chan struct{})
	h, _ := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		<-release
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(release)
	req, _ := http.NewRequest("GET", srv.URL+"/apis/example.com/v1/widgets?watch=1", nil)
	req.Header.Set("Authorization", "Bearer "+op)
	done := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch's headers did not reach the client before its first event")
	}
}

// Protobuf bodies nested past the bound, or with too many fields, are
// refused before they are decoded.
func TestProtobufBombsRefused(t *testing.T) {
	// A CRD whose schema nests "not" (field 28 of JSONSchemaProps) deeply.
	nested := []byte{}
	for range 200 {
		nested = append(append([]byte{0xe2, 0x01}, uvarint(len(nested))...), nested...)
	}
	if _, err := protobufFields(append([]byte("k8s\x00"), nested...)); err == nil {
		t.Error("a body nested 200 deep passed the walk")
	}
	// Many empty repeated elements.
	many := bytes.Repeat([]byte{0x12, 0x00}, maxProtobufFields+1)
	if _, err := protobufFields(append([]byte("k8s\x00"), many...)); err == nil {
		t.Error("a body of too many fields passed the walk")
	}
	// The same nesting, each level behind an unknown empty group (field
	// 1000), which the decoders skip and go on.
	hidden := []byte{}
	for range 200 {
		level := append([]byte{0xc3, 0x3e, 0xc4, 0x3e}, append([]byte{0xe2, 0x01}, uvarint(len(hidden))...)...)
		hidden = append(level, hidden...)
	}
	if _, err := protobufFields(append([]byte("k8s\x00"), hidden...)); err == nil {
		t.Error("a body nested 200 deep behind groups passed the walk")
	}
	// A ten-byte varint the decoders take.
	if v, n := varint([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f}); n != 10 || v>>63 != 1 {
		t.Errorf("varint of ten bytes = %x, %d", v, n)
	}
	work := maxProtobufFields
	if !withinBounds([]byte("k8s\x00\x0a\x05hello\x12\x03\x08\x96\x01"), 0, &work) {
		t.Error("a small ordinary message was refused")
	}
}

func uvarint(n int) []byte {
	var b [10]byte
	return b[:binary.PutUvarint(b[:], uint64(n))]
}

// Proxies, logs and exec pass as they are, for every caller: their bytes
// are a pod's, and they are not bounded as other requests are.
func TestStreamsAndProxiesUntouched(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, last := newChain(t, rev, jsonAnswer(renamedWidget))
	for _, p := range []string{
		"/api/v1/namespaces/ns/pods/p/proxy/apis/example.com",
		"/api/v1/namespaces/ns/services/s:80/proxy/x",
		"/api/v1/namespaces/ns/pods/p/log",
		"/api/v1/namespaces/ns/pods/p/exec?command=ls",
	} {
		w := do(t, h, "GET", p, op, "application/vnd.kubernetes.protobuf", "", "")
		if last().path != strings.SplitN(p, "?", 2)[0] || last().accept != "application/vnd.kubernetes.protobuf" || w.Body.String() != renamedWidget+"\n" {
			t.Errorf("%s was rewritten: %+v", p, last())
		}
	}
	if rev.calls != 0 {
		t.Errorf("%d reviews for requests that are never rewritten", rev.calls)
	}
}

// An answer past the size bound becomes a 500 Status, not a reset; an
// answer the budget has no room for becomes a 503.
func TestAnswerBounds(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	big := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for range 64 {
			_, _ = io.WriteString(w, strings.Repeat(" ", 1024))
		}
		_, _ = io.WriteString(w, renamedWidget)
	}
	for _, c := range []struct {
		name string
		o    Options
		code int
	}{
		{"too large", Options{MaxResponseBytes: 32 << 10}, 500},
		{"no room", Options{MaxHeldBytes: 16 << 10}, 503},
		{"fits", Options{}, 200},
	} {
		c.o.Profiles, c.o.Identify = testProfiles(t), rev.identify
		f, err := New(c.o)
		if err != nil {
			t.Fatal(err)
		}
		h := apihttp.WithRequestInfo(f.Wrap(http.HandlerFunc(big)))
		w := do(t, h, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w", op, "", "", "")
		if w.Code != c.code || strings.Contains(w.Body.String(), "renamed.example.io") {
			t.Errorf("%s: %d %.200s", c.name, w.Code, w.Body)
		}
		if f.budget.TryAcquire(f.budgetCap) {
			f.budget.Release(f.budgetCap)
		} else {
			t.Errorf("%s: the answer kept part of the budget", c.name)
		}
	}
}

// The same bytes as a whole answer and as a watch event are two rewrites:
// one memo never answers for the other.
func TestMemoKeepsObjectsAndEventsApart(t *testing.T) {
	rw := testProfiles(t)[0]
	m := &memos{objects: newMemo(1 << 20), events: newMemo(1 << 20)}
	ev := []byte(`{"type":"ADDED","object":` + renamedWidget + `}`)
	obj, err := m.objects.do(ev, rw.ObjectJSON)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.events.do(ev, rw.WatchEventJSON)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) == string(obj) || strings.Contains(string(got), "renamed.example.io") {
		t.Errorf("the event came from the objects' memo: %s", got)
	}
}

// A watch answered in something else than JSON is not held until it
// ends: the stream ends at once.
func TestNonJSONWatchNotHeld(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	h, _ := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.WriteHeader(200)
		for range 1000 {
			if _, err := io.WriteString(w, "type: ADDED\nobject: {}\n---\n"); err != nil {
				return
			}
		}
		t.Error("the watch's writes went on after the stream could not be read")
	})
	w := do(t, h, "GET", "/apis/example.com/v1/widgets?watch=1", op, "", "", "")
	if strings.Contains(w.Body.String(), "ADDED") {
		t.Errorf("a YAML watch reached the caller: %q", w.Body)
	}
}

// TestOpenAPIV3Rewritten: a selected caller reads the index of OpenAPI v3
// documents and a renamed group's document in the original names, with
// validators of the profile's own, and follows a stale hash's redirect to
// the original name; documents of other groups, and every document for
// other callers, go as they are.
func TestOpenAPIV3Rewritten(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	fp := testProfiles(t)[0].Fingerprint()
	const (
		renamedIndex = `{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=01"},"apis/renamed.example.io/v1":{"serverRelativeURL":"/openapi/v3/apis/renamed.example.io/v1?hash=02"}}}`
		renamedDoc   = `{"components":{"schemas":{"io.example.renamed.v1.RenamedWidget":{"x-kubernetes-group-version-kind":[{"group":"renamed.example.io","kind":"RenamedWidget","version":"v1"}]}}},"paths":{"/apis/renamed.example.io/v1/widgets":{"get":{"responses":{"200":{"$ref":"#/components/schemas/io.example.renamed.v1.RenamedWidget"}}}}}}`
		originalDoc  = `{"components":{"schemas":{"com.example.v1.Widget":{"x-kubernetes-group-version-kind":[{"group":"example.com","kind":"Widget","version":"v1"}]}}},"paths":{"/apis/example.com/v1/widgets":{"get":{"responses":{"200":{"$ref":"#/components/schemas/com.example.v1.Widget"}}}}}}`
	)
	originalIndex := `{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=01"},"apis/example.com/v1":{"serverRelativeURL":"/openapi/v3/apis/example.com/v1?hash=02-` + fp + `"}}}`
	indexType := "text/plain; charset=utf-8"
	var lastHeader http.Header
	h, last := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		lastHeader = r.Header.Clone()
		switch {
		case r.URL.Path == "/openapi/v3":
			w.Header().Set("Content-Type", indexType)
			w.Header().Set("Etag", `"I"`)
			w.Header().Set("Last-Modified", "Sun, 29 Nov 2026 05:43:55 GMT")
			_, _ = io.WriteString(w, renamedIndex)
		case r.URL.Query().Get("hash") == "old":
			http.Redirect(w, r, r.URL.Path+"?hash=02", http.StatusMovedPermanently)
		case r.URL.Path == "/openapi/v3/apis/renamed.example.io/v1" && r.Header.Get("If-None-Match") == `"02"`:
			w.Header().Set("Etag", `"02"`)
			w.WriteHeader(http.StatusNotModified)
		case r.URL.Path == "/openapi/v3/apis/renamed.example.io/v1" && r.Header.Get("X-Test-Partial") != "":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPartialContent)
			_, _ = io.WriteString(w, renamedDoc[:20])
		case r.URL.Path == "/openapi/v3/apis/renamed.example.io/v1":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Etag", `"02"`)
			_, _ = io.WriteString(w, renamedDoc)
		default:
			w.Header().Set("Content-Type", "application/com.github.proto-openapi.spec.v3@v1.0+protobuf")
			_, _ = io.WriteString(w, "\x0a\x05proto")
		}
	})
	get := func(target, accept string, header ...string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest("GET", target, nil)
		r.Header.Set("Authorization", "Bearer "+op)
		r.Header.Set("Accept", accept)
		r.Header.Set("Accept-Encoding", "gzip")
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	// The index, as kube-apiserver types it (text/plain) and as JSON,
	// whatever the caller accepts.
	for _, typ := range []string{"text/plain; charset=utf-8", "application/json"} {
		indexType = typ
		w := get("/openapi/v3", "application/com.github.proto-openapi.spec.v3@v1.0+protobuf", "Range", "bytes=0-9", "If-Modified-Since", "Sun, 29 Nov 2026 05:43:55 GMT")
		if w.Code != 200 || w.Body.String() != originalIndex || w.Header().Get("Etag") != `"I-`+fp+`"` || w.Header().Get("Last-Modified") != "" {
			t.Errorf("the index as %s: %d %s %v\nwant %s", typ, w.Code, w.Body, w.Header(), originalIndex)
		}
		if lastHeader.Get("Accept") != "application/json" || lastHeader.Get("Range") != "" || lastHeader.Get("If-Modified-Since") != "" {
			t.Errorf("the index was asked for with %v", lastHeader)
		}
	}
	// The document, at the hash the index gave.
	w := get("/openapi/v3/apis/example.com/v1?hash=02-"+fp, "application/json")
	if w.Code != 200 || w.Body.String() != originalDoc || w.Header().Get("Etag") != `"02-`+fp+`"` {
		t.Errorf("the renamed group's document: %d %s %v\nwant %s", w.Code, w.Body, w.Header(), originalDoc)
	}
	if s := last(); s.path != "/openapi/v3/apis/renamed.example.io/v1" || s.query != "hash=02" || s.accept != "application/json" || s.acceptEncoding != "" {
		t.Errorf("upstream request %+v", s)
	}
	// Revalidated with the tag the agent gave: kube-apiserver's 304,
	// passed on with that tag.
	w = get("/openapi/v3/apis/example.com/v1", "application/json", "If-None-Match", `"02-`+fp+`"`)
	if w.Code != http.StatusNotModified || w.Header().Get("Etag") != `"02-`+fp+`"` || w.Body.Len() != 0 || w.Header().Get("Content-Length") != "" {
		t.Errorf("a revalidation: %d %v %q", w.Code, w.Header(), w.Body)
	}
	// A tag the agent did not give (the cluster's names, or another
	// profile's) is not sent: the whole document comes back.
	for _, tag := range []string{`"02"`, `"02-000000000000"`} {
		if w := get("/openapi/v3/apis/example.com/v1", "application/json", "If-None-Match", tag); w.Code != 200 || w.Body.String() != originalDoc {
			t.Errorf("If-None-Match %s: %d %s", tag, w.Code, w.Body)
		}
		if lastHeader.Get("If-None-Match") != "" {
			t.Errorf("If-None-Match %s was sent as %q", tag, lastHeader.Get("If-None-Match"))
		}
	}
	// A stale hash: kube-apiserver's redirect, to the original name and
	// the profile's hash, without its body.
	w = get("/openapi/v3/apis/example.com/v1?hash=old-"+fp, "application/json")
	if loc := w.Header().Get("Location"); w.Code != http.StatusMovedPermanently || loc != "/openapi/v3/apis/example.com/v1?hash=02-"+fp || w.Body.Len() != 0 {
		t.Errorf("a stale hash: %d, Location %q, body %q", w.Code, loc, w.Body)
	}
	// A part of a document is not passed on.
	if w := get("/openapi/v3/apis/example.com/v1", "application/json", "X-Test-Partial", "1"); w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "renamed.example.io") {
		t.Errorf("a partial document: %d %s", w.Code, w.Body)
	}
	if w := get("/openapi/v3/apis/example.com/v1", "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"); w.Code != http.StatusNotAcceptable {
		t.Errorf("the renamed group's document in protobuf only: %d %s, want 406", w.Code, w.Body)
	}
	// Other groups' documents are passed as they are, in any encoding.
	if w := get("/openapi/v3/apis/apps/v1", "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"); w.Code != 200 || w.Body.String() != "\x0a\x05proto" {
		t.Errorf("another group's document: %d %q", w.Code, w.Body)
	}
	if s := last(); s.path != "/openapi/v3/apis/apps/v1" || s.acceptEncoding != "gzip" {
		t.Errorf("another group's document was asked for as %+v", s)
	}
	// A caller no profile selects gets the cluster's names.
	calls := rev.calls
	other := fakeToken(otherSA, "2")
	if w := do(t, h, "GET", "/openapi/v3", other, "application/json", "", ""); w.Body.String() != renamedIndex || w.Header().Get("Etag") != `"I"` {
		t.Errorf("the index for another caller: %s %v", w.Body, w.Header())
	}
	if rev.calls != calls {
		t.Errorf("%d reviews of a caller no profile selects", rev.calls-calls)
	}
	for p, want := range map[string]bool{"/openapi/v3": true, "/openapi/v3/": true, "/openapi/v3/apis/x/v1": true, "/openapi/v3x": false, "/openapi/v2": false} {
		if got := openAPIV3Path(p); got != want {
			t.Errorf("openAPIV3Path(%q) = %v", p, got)
		}
	}
}

// TestValidatorsTagged: a rewritten answer's entity tag carries the
// profile's fingerprint (kube-apiserver tags aggregated discovery), and
// only such a tag revalidates; dates and ranges are not sent on.
func TestValidatorsTagged(t *testing.T) {
	rev := &reviewer{users: map[string]string{}}
	op := fakeToken(operatorSA, "1")
	rev.users[op] = operatorSA
	fp := testProfiles(t)[0].Fingerprint()
	var sent http.Header
	h, _ := newChain(t, rev, func(w http.ResponseWriter, r *http.Request) {
		sent = r.Header.Clone()
		w.Header().Set("Etag", `"D"`)
		if r.Header.Get("If-None-Match") == `"D"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Last-Modified", "Sun, 29 Nov 2026 05:43:55 GMT")
		_, _ = io.WriteString(w, `{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`)
	})
	for _, c := range []struct {
		ifNoneMatch, wantSent string
		wantCode              int
	}{
		{"", "", 200},
		{`"D-` + fp + `"`, `"D"`, http.StatusNotModified},
		{`"D"`, "", 200},
		{`W/"X-` + fp + `", "D-` + fp + `"`, `W/"X", "D"`, http.StatusOK},
	} {
		r := httptest.NewRequest("GET", "/apis", nil)
		r.Header.Set("Authorization", "Bearer "+op)
		r.Header.Set("Range", "bytes=0-3")
		r.Header.Set("If-Modified-Since", "Sun, 29 Nov 2026 05:43:55 GMT")
		if c.ifNoneMatch != "" {
			r.Header.Set("If-None-Match", c.ifNoneMatch)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.wantCode || w.Header().Get("Etag") != `"D-`+fp+`"` || w.Header().Get("Last-Modified") != "" {
			t.Errorf("If-None-Match %q: %d %v, want %d with the tag %q", c.ifNoneMatch, w.Code, w.Header(), c.wantCode, `"D-`+fp+`"`)
		}
		if sent.Get("If-None-Match") != c.wantSent || sent.Get("Range") != "" || sent.Get("If-Modified-Since") != "" {
			t.Errorf("If-None-Match %q: sent %v", c.ifNoneMatch, sent)
		}
	}
}
