package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/filters"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-apicache/kube-apicache/cache/access"
)

// Policies of the scenarios, in kube-apiserver's format.
const (
	// metadataPolicy records every request at Metadata level, every stage.
	metadataPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Metadata
`
	// secretsNonePolicy records nothing of secrets, the rest at Metadata.
	secretsNonePolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  resources:
  - group: ""
    resources: ["secrets"]
- level: Metadata
`
	// omitStagesPolicy omits RequestReceived everywhere and
	// ResponseStarted for watches.
	omitStagesPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["watch"]
  omitStages: ["ResponseStarted"]
- level: Metadata
`
)

// longRunning is the agent's test of long-running requests.
var longRunning = filters.BasicLongRunningRequestCheck(sets.NewString("watch", "proxy"), sets.NewString("attach", "exec", "proxy", "log", "portforward"))

var requestInfoFactory = &request.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// The caller of every scenario, as a TokenReview returns a bound
// ServiceAccount token's user.
var reader = &user.DefaultInfo{
	Name:   "system:serviceaccount:team:reader",
	UID:    "0b7e2d6c-4f0a-4c1e-9a57-3f1f3c7f2a10",
	Groups: []string{"system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"},
	Extra: map[string][]string{
		"authentication.kubernetes.io/pod-name":  {"reader-7d4f"},
		"authentication.kubernetes.io/node-name": {"node-a"},
	},
}

const (
	allowReason = `RBAC: allowed by RoleBinding "reader/team" of ClusterRole "view" to ServiceAccount "reader/team"`
	podIP       = "10.244.1.7"
	userAgent   = "kubectl/v1.36.3 (linux/amd64)"
)

// received is when every scenario's request arrived.
var received = time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC)

// fakeCache answers as the cache does: a denied review's 403 Status
// through responsewriters (which records it in the event), a watch as a
// stream, anything else as a 200 JSON body. It keeps the Audit-ID header
// of the last request it served.
type fakeCache struct {
	auditIDHeader string
}

func (f *fakeCache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.auditIDHeader = r.Header.Get(auditinternal.HeaderAuditID)
	info, _ := request.RequestInfoFrom(r.Context())
	if res, _ := access.ResultFrom(r.Context()); res.Verdict == access.Denied {
		responsewriters.ErrorNegotiated(res.Err, scheme.Codecs.WithoutConversion(), schema.GroupVersion{Version: "v1"}, w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if info.Verb == "watch" {
		w.WriteHeader(http.StatusOK)
		// As the cache does: the audit filter's writer passes a flush on
		// through Unwrap.
		if err := http.NewResponseController(w).Flush(); err != nil {
			panic(err)
		}
		fmt.Fprintln(w, `{"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":"42"}}}`)
		return
	}
	fmt.Fprintln(w, `{"kind":"Service","apiVersion":"v1","metadata":{"name":"svc-a"}}`)
}

// record is what a scenario checks of an event.
type record struct {
	Stage        auditv1.Stage
	User         authnv1.UserInfo
	Verb         string
	RequestURI   string
	UserAgent    string
	SourceIPs    []string
	ObjectRef    *auditv1.ObjectReference
	Code         int32
	StatusReason metav1.StatusReason
	Annotations  map[string]string
	Received     time.Time
}

func recordOf(ev auditv1.Event) record {
	r := record{Stage: ev.Stage, User: ev.User, Verb: ev.Verb, RequestURI: ev.RequestURI, UserAgent: ev.UserAgent,
		SourceIPs: ev.SourceIPs, ObjectRef: ev.ObjectRef, Annotations: ev.Annotations, Received: ev.RequestReceivedTimestamp.UTC()}
	if s := ev.ResponseStatus; s != nil {
		r.Code, r.StatusReason = s.Code, s.Reason
	}
	return r
}

// readerUser is reader as an event records it.
func readerUser() authnv1.UserInfo {
	return authnv1.UserInfo{Username: reader.Name, UID: reader.UID, Groups: reader.Groups, Extra: map[string]authnv1.ExtraValue{
		"authentication.kubernetes.io/pod-name":  {"reader-7d4f"},
		"authentication.kubernetes.io/node-name": {"node-a"},
	}}
}

// newLoggingAuditor returns a started Auditor with policy and a log
// backend in JSON to a file (mode is --audit-log-mode), and a function
// that reads the events logged so far.
func newLoggingAuditor(t *testing.T, policy, mode string) (*Auditor, func() []auditv1.Event) {
	t.Helper()
	dir := t.TempDir()
	o := NewOptions()
	o.PolicyFile = filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(o.PolicyFile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	o.LogOptions.Path = filepath.Join(dir, "audit", "audit.log")
	if mode != "" {
		o.LogOptions.BatchOptions.Mode = mode
	}
	a, err := New(o, longRunning)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ktesting.NewLogger(t, ktesting.NewConfig())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown)
	return a, func() []auditv1.Event { return readEvents(t, o.LogOptions.Path) }
}

// readEvents parses a JSON-lines audit log.
func readEvents(t *testing.T, path string) []auditv1.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditv1.Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("parsing audit event %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// newRequest builds a request as cache.Handler hands it to its hit
// handler: from podIP, with its RequestInfo, the review's result and the
// time it was received in the context.
func newRequest(t *testing.T, path string, res access.Result) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "https://10.96.0.1"+path, nil)
	r.RemoteAddr = podIP + ":41234"
	r.Header.Set("User-Agent", userAgent)
	info, err := requestInfoFactory.NewRequestInfo(r)
	if err != nil {
		t.Fatal(err)
	}
	ctx := request.WithRequestInfo(r.Context(), info)
	ctx = request.WithReceivedTimestamp(ctx, received)
	return r.WithContext(access.WithResult(ctx, res))
}

var (
	allowed = access.Result{Verdict: access.Allowed, User: reader, AuthorizationReason: allowReason}
	denied  = access.Result{Verdict: access.Denied, User: reader,
		Err: apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("access denied"))}
)

func TestWrap(t *testing.T) {
	allow := map[string]string{decisionAnnotationKey: decisionAllow, reasonAnnotationKey: allowReason}
	forbid := map[string]string{decisionAnnotationKey: decisionForbid, reasonAnnotationKey: ""}
	svcGet := "/api/v1/namespaces/team/services/svc-a?resourceVersion=0"
	sliceList := "/apis/discovery.k8s.io/v1/namespaces/team/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dsvc-a"
	svcWatch := "/api/v1/namespaces/team/services?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	base := func(stage auditv1.Stage, verb, uri string, ref *auditv1.ObjectReference) record {
		return record{Stage: stage, User: readerUser(), Verb: verb, RequestURI: uri, UserAgent: userAgent,
			SourceIPs: []string{podIP}, ObjectRef: ref, Received: received}
	}
	done := func(r record, code int32, reason metav1.StatusReason, annotations map[string]string) record {
		r.Code, r.StatusReason, r.Annotations = code, reason, annotations
		return r
	}
	svcRef := &auditv1.ObjectReference{Resource: "services", Namespace: "team", Name: "svc-a", APIVersion: "v1"}
	svcsRef := &auditv1.ObjectReference{Resource: "services", Namespace: "team", APIVersion: "v1"}
	slicesRef := &auditv1.ObjectReference{Resource: "endpointslices", Namespace: "team", APIGroup: "discovery.k8s.io", APIVersion: "v1"}
	secretsRef := &auditv1.ObjectReference{Resource: "secrets", Namespace: "team", APIVersion: "v1"}

	for _, tc := range []struct {
		name   string
		policy string
		path   string
		res    access.Result
		// clientAuditID is the request's Audit-ID header, if any.
		clientAuditID string
		wantCode      int
		want          []record
		// wantHeaderID: the handler saw the event's Audit-ID in the
		// request headers.
		wantHeaderID bool
	}{
		{
			// A cached get is recorded as kube-apiserver records it: the
			// reviewed user, verb, objectRef, source, user agent, 200 and
			// the review's decision and reason; RequestReceived before the
			// decision, without annotations.
			name: "cached get", policy: metadataPolicy, path: svcGet, res: allowed, wantCode: 200,
			want: []record{
				base(auditv1.StageRequestReceived, "get", svcGet, svcRef),
				done(base(auditv1.StageResponseComplete, "get", svcGet, svcRef), 200, "", allow),
			},
		},
		{
			// A cached list of a grouped resource names its apiGroup.
			name: "cached list", policy: metadataPolicy, path: sliceList, res: allowed, wantCode: 200,
			want: []record{
				base(auditv1.StageRequestReceived, "list", sliceList, slicesRef),
				done(base(auditv1.StageResponseComplete, "list", sliceList, slicesRef), 200, "", allow),
			},
		},
		{
			// The 403 the cache answers a denied caller is recorded with
			// its Status and the forbid decision.
			name: "denied", policy: metadataPolicy, path: "/api/v1/namespaces/team/secrets", res: denied, wantCode: 403,
			want: []record{
				base(auditv1.StageRequestReceived, "list", "/api/v1/namespaces/team/secrets", secretsRef),
				done(base(auditv1.StageResponseComplete, "list", "/api/v1/namespaces/team/secrets", secretsRef), 403, metav1.StatusReasonForbidden, forbid),
			},
		},
		{
			// A rule at level None records nothing; the request is
			// served as before.
			name: "level None", policy: secretsNonePolicy, path: "/api/v1/namespaces/team/secrets", res: allowed, wantCode: 200,
		},
		{
			// A watch (long-running) is recorded when its response starts
			// and when it ends, and its request carries the event's
			// Audit-ID on to kube-apiserver.
			name: "watch", policy: metadataPolicy, path: svcWatch, res: allowed, wantCode: 200, wantHeaderID: true,
			want: []record{
				base(auditv1.StageRequestReceived, "watch", svcWatch, svcsRef),
				done(base(auditv1.StageResponseStarted, "watch", svcWatch, svcsRef), 200, "", allow),
				done(base(auditv1.StageResponseComplete, "watch", svcWatch, svcsRef), 200, "", allow),
			},
		},
		{
			// omitStages of the policy and of a rule are honoured.
			name: "omitStages", policy: omitStagesPolicy, path: svcWatch, res: allowed, wantCode: 200, wantHeaderID: true,
			want: []record{
				done(base(auditv1.StageResponseComplete, "watch", svcWatch, svcsRef), 200, "", allow),
			},
		},
		{
			// A client's own Audit-ID is the event's, is echoed, and
			// stays in the request.
			name: "client Audit-ID", policy: omitStagesPolicy, path: svcGet, res: allowed, clientAuditID: "client-chosen-id", wantCode: 200, wantHeaderID: true,
			want: []record{
				done(base(auditv1.StageResponseComplete, "get", svcGet, svcRef), 200, "", allow),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, events := newLoggingAuditor(t, tc.policy, "")
			fake := &fakeCache{}
			h := a.Wrap(fake)
			r := newRequest(t, tc.path, tc.res)
			if tc.clientAuditID != "" {
				r.Header.Set(auditinternal.HeaderAuditID, tc.clientAuditID)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.wantCode {
				t.Errorf("code %d, want %d: %s", w.Code, tc.wantCode, w.Body)
			}
			id := w.Header().Get(auditinternal.HeaderAuditID)
			if id == "" {
				t.Errorf("no Audit-Id in the response")
			}
			if tc.clientAuditID != "" && id != tc.clientAuditID {
				t.Errorf("Audit-Id %q, want the client's %q", id, tc.clientAuditID)
			}
			if tc.wantHeaderID != (fake.auditIDHeader == id) {
				t.Errorf("the handler saw Audit-ID %q; the event's is %q", fake.auditIDHeader, id)
			}
			got := events()
			var records []record
			for _, ev := range got {
				records = append(records, recordOf(ev))
				if string(ev.AuditID) != id {
					t.Errorf("%s event has auditID %q, the response %q", ev.Stage, ev.AuditID, id)
				}
				if ev.Level != auditv1.LevelMetadata {
					t.Errorf("%s event at level %s", ev.Stage, ev.Level)
				}
			}
			if diff := cmp.Diff(tc.want, records); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWithReceivedTimestamp: the event's requestReceivedTimestamp is when
// the outermost handler got the request, not when the audited one did.
func TestWithReceivedTimestamp(t *testing.T) {
	a, events := newLoggingAuditor(t, omitStagesPolicy, "")
	const review = 50 * time.Millisecond
	audited := a.Wrap(&fakeCache{})
	h := a.WithReceivedTimestamp(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(review) // the access review
		audited.ServeHTTP(w, r.WithContext(access.WithResult(r.Context(), allowed)))
	}))
	r := httptest.NewRequest(http.MethodGet, "https://10.96.0.1/api/v1/namespaces/team/services/svc-a", nil)
	info, err := requestInfoFactory.NewRequestInfo(r)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(request.WithRequestInfo(r.Context(), info)))
	evs := events()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	got := evs[0].RequestReceivedTimestamp.Time
	if got.Before(before.Truncate(time.Microsecond)) || !got.Before(before.Add(review)) {
		t.Errorf("requestReceivedTimestamp %s, want between %s and the end of the review", got, before)
	}
	if evs[0].StageTimestamp.Sub(got) < review {
		t.Errorf("stageTimestamp %s is less than the review after requestReceivedTimestamp %s", evs[0].StageTimestamp.Time, got)
	}
}

// TestDisabled: without a policy file, or with a policy but no backend,
// nothing is recorded and Wrap and WithReceivedTimestamp return the
// handler itself (no cost on the request path).
func TestDisabled(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(metadataPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	noPolicy := NewOptions()
	noPolicy.LogOptions.Path = filepath.Join(dir, "unused.log")
	noBackend := NewOptions()
	noBackend.PolicyFile = policyFile
	for name, o := range map[string]*Options{"nil options": nil, "defaults": NewOptions(), "no policy": noPolicy, "no backend": noBackend} {
		t.Run(name, func(t *testing.T) {
			a, err := New(o, longRunning)
			if err != nil {
				t.Fatal(err)
			}
			if a.Enabled() {
				t.Errorf("enabled")
			}
			if err := a.Start(ktesting.NewLogger(t, ktesting.NewConfig())); err != nil {
				t.Fatal(err)
			}
			defer a.Shutdown()
			h := &fakeCache{}
			if got := a.Wrap(h); got != http.Handler(h) {
				t.Errorf("Wrap returned %T, want the handler itself", got)
			}
			if got := a.WithReceivedTimestamp(h); got != http.Handler(h) {
				t.Errorf("WithReceivedTimestamp returned %T, want the handler itself", got)
			}
		})
	}
	var nilAuditor *Auditor
	if h := (&fakeCache{}); nilAuditor.Wrap(h) != http.Handler(h) || nilAuditor.Enabled() {
		t.Errorf("a nil Auditor audits")
	}
	nilAuditor.Shutdown()
}

// TestInvalidOptions: options kube-apiserver would refuse are refused.
func TestInvalidOptions(t *testing.T) {
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Everything\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badPolicy := NewOptions()
	badPolicy.PolicyFile = policyFile
	badPolicy.LogOptions.Path = filepath.Join(dir, "audit.log")
	badMode := NewOptions()
	badMode.LogOptions.Path = filepath.Join(dir, "audit.log")
	badMode.LogOptions.BatchOptions.Mode = "sometimes"
	missing := NewOptions()
	missing.PolicyFile = filepath.Join(dir, "missing.yaml")
	missing.LogOptions.Path = filepath.Join(dir, "audit.log")
	for name, o := range map[string]*Options{"bad level": badPolicy, "bad mode": badMode, "missing policy": missing} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(o, longRunning); err == nil {
				t.Errorf("New accepted %s", name)
			}
		})
	}
}

// TestShutdownDeliversBatched: in batch mode, events still buffered when
// the server has stopped are written by Shutdown.
func TestShutdownDeliversBatched(t *testing.T) {
	a, events := newLoggingAuditor(t, omitStagesPolicy, "batch")
	h := a.Wrap(&fakeCache{})
	const requests = 20
	for i := 0; i < requests; i++ {
		h.ServeHTTP(httptest.NewRecorder(), newRequest(t, "/api/v1/namespaces/team/services/svc-a", allowed))
	}
	a.Shutdown()
	if got := len(events()); got != requests {
		t.Errorf("%d events after Shutdown, want %d", got, requests)
	}
}
