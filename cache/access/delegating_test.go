package access

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// fakeAPIServer answers TokenReview and SubjectAccessReview like
// kube-apiserver, from a fixed set of tokens and a policy the test can
// change.
type fakeAPIServer struct {
	*httptest.Server

	mu sync.Mutex // protects the fields below
	// tokens maps a token to its user; any other token is rejected.
	tokens map[string]authenticationv1.UserInfo
	// policy decides a review; nil allows nothing.
	policy func(authorizationv1.SubjectAccessReviewSpec) (allowed bool, reason string)
	// failTokens and failAccess make the respective reviews answer 500.
	failTokens, failAccess bool
	tokenReviews           int
	accessReviews          []authorizationv1.SubjectAccessReviewSpec
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{tokens: map[string]authenticationv1.UserInfo{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out runtime.Object
	switch review := obj.(type) {
	case *authenticationv1.TokenReview:
		f.tokenReviews++
		if f.failTokens {
			writeJSON(w, http.StatusInternalServerError, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError})
			return
		}
		if u, ok := f.tokens[review.Spec.Token]; ok {
			review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
		} else {
			review.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		out = review
	case *authorizationv1.SubjectAccessReview:
		f.accessReviews = append(f.accessReviews, review.Spec)
		if f.failAccess {
			writeJSON(w, http.StatusInternalServerError, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError})
			return
		}
		if f.policy != nil {
			review.Status.Allowed, review.Status.Reason = f.policy(review.Spec)
		}
		out = review
	default:
		http.Error(w, fmt.Sprintf("unexpected %T", obj), http.StatusBadRequest)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func writeJSON(w http.ResponseWriter, code int, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
}

func (f *fakeAPIServer) setPolicy(p func(authorizationv1.SubjectAccessReviewSpec) (bool, string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policy = p
}

func (f *fakeAPIServer) counts() (tokenReviews, accessReviews int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenReviews, len(f.accessReviews)
}

func (f *fakeAPIServer) lastAccessReview() authorizationv1.SubjectAccessReviewSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accessReviews[len(f.accessReviews)-1]
}

// allowUser allows everything for one user name.
func allowUser(name string) func(authorizationv1.SubjectAccessReviewSpec) (bool, string) {
	return func(s authorizationv1.SubjectAccessReviewSpec) (bool, string) { return s.User == name, "" }
}

func newReviewer(t *testing.T, f *fakeAPIServer, opts Options) *Delegating {
	t.Helper()
	d, err := New(&rest.Config{Host: f.URL}, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

var infoFactory = &request.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// newRequest builds a GET for path with the given headers and its
// RequestInfo, parsed as kube-apiserver would.
func newRequest(t *testing.T, path string, header map[string]string) (*http.Request, *request.RequestInfo) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	info, err := infoFactory.NewRequestInfo(r)
	if err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	return r, info
}

func bearer(token string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + token}
}

var alice = authenticationv1.UserInfo{
	Username: "alice",
	UID:      "alice-uid",
	Groups:   []string{"team-a", "system:authenticated"},
	Extra:    map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"alice-pod"}},
}

func TestReview(t *testing.T) {
	for _, tc := range []struct {
		name   string
		path   string
		header map[string]string
		// setup prepares the fake; nil keeps it allowing alice.
		setup func(*fakeAPIServer)
		want  Result
		// wantMessage is the Status message of a denial.
		wantMessage string
		// wantTokenReviews and wantAccessReviews are the calls made.
		wantTokenReviews, wantAccessReviews int
	}{
		{
			// Impersonation is authorized by kube-apiserver itself, for
			// the impersonated user: never answered locally.
			name:   "impersonation is forwarded without review",
			path:   "/api/v1/namespaces/ns1/pods",
			header: map[string]string{"Authorization": "Bearer alice-token", "Impersonate-User": "system:admin"},
			want:   Result{Verdict: Forward, Reason: ReasonImpersonation},
		},
		{
			// Impersonate-Extra-* headers alone are impersonation too.
			name:   "impersonated extra is forwarded",
			path:   "/api/v1/namespaces/ns1/pods",
			header: map[string]string{"Authorization": "Bearer alice-token", "Impersonate-Extra-Scopes": "x"},
			want:   Result{Verdict: Forward, Reason: ReasonImpersonation},
		},
		{
			// Anonymous requests are kube-apiserver's to decide.
			name: "no token is forwarded",
			path: "/api/v1/namespaces/ns1/pods",
			want: Result{Verdict: Forward, Reason: ReasonNoToken},
		},
		{
			// Only bearer tokens are reviewed.
			name:   "basic auth is forwarded",
			path:   "/api/v1/namespaces/ns1/pods",
			header: map[string]string{"Authorization": "Basic YWxpY2U6cHc="},
			want:   Result{Verdict: Forward, Reason: ReasonNoToken},
		},
		{
			// An empty bearer token is no token.
			name:   "empty bearer is forwarded",
			path:   "/api/v1/namespaces/ns1/pods",
			header: map[string]string{"Authorization": "Bearer "},
			want:   Result{Verdict: Forward, Reason: ReasonNoToken},
		},
		{
			// kube-apiserver answers 401 to a token it rejects; the
			// forwarded request gets that answer.
			name:             "rejected token is forwarded",
			path:             "/api/v1/namespaces/ns1/pods",
			header:           bearer("stolen-token"),
			want:             Result{Verdict: Forward, Reason: ReasonTokenRejected},
			wantTokenReviews: 1,
		},
		{
			// A failed TokenReview decides nothing.
			name:             "failed token review is forwarded",
			path:             "/api/v1/namespaces/ns1/pods",
			header:           bearer("alice-token"),
			setup:            func(f *fakeAPIServer) { f.failTokens = true },
			want:             Result{Verdict: Forward, Reason: ReasonReviewError},
			wantTokenReviews: 2, // retried once
		},
		{
			// A failed SubjectAccessReview decides nothing.
			name:              "failed access review is forwarded",
			path:              "/api/v1/namespaces/ns1/pods",
			header:            bearer("alice-token"),
			setup:             func(f *fakeAPIServer) { f.failAccess = true },
			want:              Result{Verdict: Forward, Reason: ReasonReviewError},
			wantTokenReviews:  1,
			wantAccessReviews: 2, // retried once
		},
		{
			// An allowed namespaced get.
			name:              "allowed get",
			path:              "/api/v1/namespaces/ns1/pods/web-0",
			header:            bearer("alice-token"),
			want:              Result{Verdict: Allowed},
			wantTokenReviews:  1,
			wantAccessReviews: 1,
		},
		{
			// A denied list gets kube-apiserver's Forbidden text.
			name:              "denied namespaced list",
			path:              "/api/v1/namespaces/ns1/pods",
			header:            bearer("alice-token"),
			setup:             func(f *fakeAPIServer) { f.policy = nil },
			want:              Result{Verdict: Denied},
			wantMessage:       `pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "ns1"`,
			wantTokenReviews:  1,
			wantAccessReviews: 1,
		},
		{
			// A denied named get of a cluster-scoped resource in a group,
			// with the authorizer's reason appended.
			name:   "denied cluster-scoped get with reason",
			path:   "/apis/storage.k8s.io/v1/storageclasses/fast",
			header: bearer("alice-token"),
			setup: func(f *fakeAPIServer) {
				f.policy = func(authorizationv1.SubjectAccessReviewSpec) (bool, string) { return false, "no RBAC policy matched" }
			},
			want:              Result{Verdict: Denied},
			wantMessage:       `storageclasses.storage.k8s.io "fast" is forbidden: User "alice" cannot get resource "storageclasses" in API group "storage.k8s.io" at the cluster scope: no RBAC policy matched`,
			wantTokenReviews:  1,
			wantAccessReviews: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPIServer(t)
			f.tokens["alice-token"] = alice
			f.policy = allowUser("alice")
			if tc.setup != nil {
				tc.setup(f)
			}
			d := newReviewer(t, f, Options{})
			r, info := newRequest(t, tc.path, tc.header)
			got := d.Review(r, info)
			if got.Verdict != tc.want.Verdict || got.Reason != tc.want.Reason {
				t.Fatalf("Review = %v/%q, want %v/%q (err %v)", got.Verdict, got.Reason, tc.want.Verdict, tc.want.Reason, got.Err)
			}
			if tc.want.Verdict == Denied {
				if got.Err == nil {
					t.Fatal("denied without a Status")
				}
				st := got.Err.ErrStatus
				if st.Code != http.StatusForbidden || st.Reason != metav1.StatusReasonForbidden || st.Message != tc.wantMessage {
					t.Errorf("Status = %d %s %q, want 403 Forbidden %q", st.Code, st.Reason, st.Message, tc.wantMessage)
				}
			} else if got.Err != nil {
				t.Errorf("unexpected Err %v", got.Err)
			}
			tokens, access := f.counts()
			if tokens != tc.wantTokenReviews || access != tc.wantAccessReviews {
				t.Errorf("reviews sent: token %d, access %d; want %d, %d", tokens, access, tc.wantTokenReviews, tc.wantAccessReviews)
			}
		})
	}
}

// TestForbiddenDetails: the denial carries the details kube-apiserver
// sends (group, kind, name).
func TestForbiddenDetails(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	d := newReviewer(t, f, Options{})
	r, info := newRequest(t, "/apis/apps/v1/namespaces/ns1/deployments/web", bearer("alice-token"))
	got := d.Review(r, info)
	if got.Verdict != Denied {
		t.Fatalf("verdict %v, want Denied", got.Verdict)
	}
	want := &metav1.StatusDetails{Name: "web", Group: "apps", Kind: "deployments"}
	if diff := cmp.Diff(want, got.Err.ErrStatus.Details); diff != "" {
		t.Errorf("details (-want +got):\n%s", diff)
	}
}

// TestDecisionsExpire: allow and deny, token and access decisions are each
// reused within their TTL and reviewed again after it.
func TestDecisionsExpire(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.policy = allowUser("alice")
	d := newReviewer(t, f, Options{TokenTTL: ttl, AllowTTL: ttl, DenyTTL: ttl})
	review := func() Result {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods/web-0", bearer("alice-token"))
		return d.Review(r, info)
	}

	// Given an allowed decision,
	if got := review(); got.Verdict != Allowed {
		t.Fatalf("first review: %v %q", got.Verdict, got.Reason)
	}
	// when access is revoked, the allow is still reused within the TTL,
	f.setPolicy(nil)
	if got := review(); got.Verdict != Allowed {
		t.Fatalf("within TTL: %v, want the cached Allowed", got.Verdict)
	}
	if tokens, access := f.counts(); tokens != 1 || access != 1 {
		t.Fatalf("within TTL: %d token and %d access reviews, want 1 and 1", tokens, access)
	}
	// and after it the revocation shows.
	time.Sleep(ttl + 100*time.Millisecond)
	if got := review(); got.Verdict != Denied {
		t.Fatalf("after TTL: %v, want Denied", got.Verdict)
	}
	if tokens, access := f.counts(); tokens != 2 || access != 2 {
		t.Fatalf("after TTL: %d token and %d access reviews, want 2 and 2", tokens, access)
	}
	// A denial is cached the same way.
	f.setPolicy(allowUser("alice"))
	if got := review(); got.Verdict != Denied {
		t.Fatalf("deny within TTL: %v, want the cached Denied", got.Verdict)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if got := review(); got.Verdict != Allowed {
		t.Fatalf("after deny TTL: %v, want Allowed", got.Verdict)
	}
	// A token removed upstream is rejected once its TTL ran out.
	f.mu.Lock()
	delete(f.tokens, "alice-token")
	f.mu.Unlock()
	time.Sleep(ttl + 100*time.Millisecond)
	if got := review(); got.Reason != ReasonTokenRejected {
		t.Fatalf("revoked token: %v %q, want forwarded as %q", got.Verdict, got.Reason, ReasonTokenRejected)
	}
	// and the rejection itself is cached.
	before, _ := f.counts()
	if got := review(); got.Reason != ReasonTokenRejected {
		t.Fatalf("revoked token again: %v %q", got.Verdict, got.Reason)
	}
	if after, _ := f.counts(); after != before {
		t.Errorf("rejection not cached: %d token reviews, want %d", after, before)
	}
}

// TestTTLBounds: no decision may outlive kube-apiserver's own 10s.
func TestTTLBounds(t *testing.T) {
	for _, o := range []Options{{TokenTTL: 11 * time.Second}, {AllowTTL: time.Minute}, {DenyTTL: -time.Second}, {Timeout: -1}} {
		if _, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestCallersNeverShareDecisions: a decision made for one caller is never
// given to another whose identity differs in any way.
func TestCallersNeverShareDecisions(t *testing.T) {
	f := newFakeAPIServer(t)
	withGroups := alice
	withGroups.Groups = []string{"team-a", "admins", "system:authenticated"}
	withExtra := alice
	withExtra.Extra = map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"other-pod"}}
	withUID := alice
	withUID.UID = "another-alice"
	f.tokens = map[string]authenticationv1.UserInfo{
		"alice-token":       alice,
		"bob-token":         {Username: "bob", Groups: []string{"system:authenticated"}},
		"alice-admin-token": withGroups,
		"alice-other-pod":   withExtra,
		"alice-other-uid":   withUID,
	}
	// Only alice's exact identity is allowed.
	f.policy = func(s authorizationv1.SubjectAccessReviewSpec) (bool, string) {
		return s.User == "alice" && s.UID == "alice-uid" && len(s.Groups) == 2 && s.Extra["authentication.kubernetes.io/pod-name"][0] == "alice-pod", ""
	}
	d := newReviewer(t, f, Options{})
	review := func(token string) Result {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(token))
		return d.Review(r, info)
	}
	if got := review("alice-token"); got.Verdict != Allowed {
		t.Fatalf("alice: %v %q", got.Verdict, got.Reason)
	}
	for _, token := range []string{"bob-token", "alice-admin-token", "alice-other-pod", "alice-other-uid"} {
		if got := review(token); got.Verdict != Denied {
			t.Errorf("%s got %v, want Denied (its own decision, not alice's)", token, got.Verdict)
		}
	}
	// Each identity was reviewed once; alice's second request hit the cache.
	if got := review("alice-token"); got.Verdict != Allowed {
		t.Fatalf("alice again: %v", got.Verdict)
	}
	if tokens, access := f.counts(); tokens != 5 || access != 5 {
		t.Errorf("%d token and %d access reviews, want 5 and 5", tokens, access)
	}
}

// TestSelectorsReachAccessReview: label and field selectors are part of the
// reviewed attributes (and of the decision's cache key); a selector that
// does not parse is left out, as kube-apiserver does, and the review still
// succeeds (the list handler answers 400 for it).
func TestSelectorsReachAccessReview(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.policy = allowUser("alice")
	d := newReviewer(t, f, Options{})

	for _, tc := range []struct {
		name      string
		query     string
		wantField *authorizationv1.FieldSelectorAttributes
		wantLabel *authorizationv1.LabelSelectorAttributes
	}{
		{
			name:  "field and label selectors",
			query: "?fieldSelector=spec.nodeName%3Dnode-1&labelSelector=app%3Dweb%2Ctier%21%3Ddb",
			wantField: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
				{Key: "spec.nodeName", Operator: metav1.FieldSelectorOpIn, Values: []string{"node-1"}},
			}},
			wantLabel: &authorizationv1.LabelSelectorAttributes{Requirements: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}},
				{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}},
			}},
		},
		{
			name:  "a different field selector is a different decision",
			query: "?fieldSelector=spec.nodeName%3Dnode-2",
			wantField: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
				{Key: "spec.nodeName", Operator: metav1.FieldSelectorOpIn, Values: []string{"node-2"}},
			}},
		},
		{
			name:  "unparsable label selector is left out",
			query: "?labelSelector=app+in+%28&fieldSelector=spec.nodeName%3Dnode-1",
			wantField: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
				{Key: "spec.nodeName", Operator: metav1.FieldSelectorOpIn, Values: []string{"node-1"}},
			}},
		},
		{
			name:  "unparsable field selector is left out",
			query: "?fieldSelector=%3D%3D%3D",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, before := f.counts()
			r, info := newRequest(t, "/api/v1/pods"+tc.query, bearer("alice-token"))
			if got := d.Review(r, info); got.Verdict != Allowed {
				t.Fatalf("Review: %v %q %v", got.Verdict, got.Reason, got.Err)
			}
			if _, after := f.counts(); after != before+1 {
				t.Fatalf("%d access reviews, want 1 new", after-before)
			}
			got := f.lastAccessReview().ResourceAttributes
			want := &authorizationv1.ResourceAttributes{Verb: "list", Version: "v1", Resource: "pods", FieldSelector: tc.wantField, LabelSelector: tc.wantLabel}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("reviewed attributes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAccessReviewCarriesIdentity: the review asks about the caller exactly
// as TokenReview described it.
func TestAccessReviewCarriesIdentity(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.policy = allowUser("alice")
	d := newReviewer(t, f, Options{})
	r, info := newRequest(t, "/apis/discovery.k8s.io/v1/namespaces/ns1/endpointslices/web-abc", bearer("alice-token"))
	if got := d.Review(r, info); got.Verdict != Allowed {
		t.Fatalf("Review: %v %q", got.Verdict, got.Reason)
	}
	want := authorizationv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: "ns1", Verb: "get", Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices", Name: "web-abc",
		},
		User:   alice.Username,
		UID:    alice.UID,
		Groups: alice.Groups,
		Extra:  map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"alice-pod"}},
	}
	if diff := cmp.Diff(want, f.lastAccessReview()); diff != "" {
		t.Errorf("review spec (-want +got):\n%s", diff)
	}
}

// TestMetrics: reviews, lookups and verdicts are counted, and register into
// a Prometheus registry.
func TestMetrics(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.policy = allowUser("alice")
	d := newReviewer(t, f, Options{})
	reg := prometheus.NewRegistry()
	if err := d.Metrics().Register(reg); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer("alice-token"))
		d.Review(r, info)
	}
	r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", nil)
	d.Review(r, info)

	m := d.Metrics()
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"token reviews", testutil.ToFloat64(m.reviews.WithLabelValues("token", "authenticated")), 1},
		{"access reviews", testutil.ToFloat64(m.reviews.WithLabelValues("access", "allowed")), 1},
		{"token lookups", testutil.ToFloat64(m.lookups.WithLabelValues("token")), 3},
		{"access lookups", testutil.ToFloat64(m.lookups.WithLabelValues("access")), 3},
		{"allowed", testutil.ToFloat64(m.verdicts.WithLabelValues("allowed", "")), 3},
		{"no token", testutil.ToFloat64(m.verdicts.WithLabelValues("forwarded", ReasonNoToken)), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n == 0 {
		t.Errorf("registry gathered %d series, err %v", n, err)
	}
}

// TestTokensNeverLogged: at the highest verbosity, where client-go logs
// request and response bodies, no token reaches the log.
func TestTokensNeverLogged(t *testing.T) {
	var buf syncBuffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"v": "10", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
		klog.SetOutput(io.Discard)
	})

	const good, bad = "good-secret-token-1234567890", "bad-secret-token-0987654321"
	f := newFakeAPIServer(t)
	f.tokens[good] = alice
	f.policy = allowUser("alice")
	d := newReviewer(t, f, Options{})
	for _, token := range []string{good, bad} {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(token))
		d.Review(r, info)
	}
	// A failing TokenReview logs its error.
	f.mu.Lock()
	f.failTokens = true
	f.mu.Unlock()
	r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer("failing-secret-token-111"))
	d.Review(r, info)
	klog.Flush()

	logs := buf.String()
	// The log is live at this verbosity: the access review body is there.
	if !strings.Contains(logs, "subjectaccessreviews") || !strings.Contains(logs, "Request Body") {
		t.Fatalf("expected client-go request logging at -v=10; got:\n%s", logs)
	}
	for _, token := range []string{good, bad, "failing-secret-token-111"} {
		if strings.Contains(logs, token) {
			t.Errorf("token %q appears in the log", token)
		}
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
