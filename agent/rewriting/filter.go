package rewriting

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"golang.org/x/sync/semaphore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
	"github.com/kube-apicache/kube-apicache/cache/access"
)

// Defaults of Options.
const (
	// DefaultMaxRequestBodyBytes is kube-apiserver's own limit on request
	// bodies: no body it would take is refused here.
	DefaultMaxRequestBodyBytes = 3 << 20
	// DefaultMaxResponseBytes bounds a whole answer held for rewriting
	// (lists; watches stream event by event). Lists past it should be
	// paginated, as informers and kubectl do (500 objects a page).
	DefaultMaxResponseBytes = 32 << 20
	// DefaultMaxHeldBytes bounds what the rewriting holds at once.
	DefaultMaxHeldBytes = 256 << 20
	// decodeFactor is what decoding JSON into maps costs, per byte of
	// JSON, roughly: the budget counts a body this many times.
	decodeFactor = 8
)

// Identify tells who a request's bearer token belongs to, as
// kube-apiserver's TokenReview says: nil and no error when the request
// has no token or the token is not authenticated.
type Identify func(*http.Request) (user.Info, error)

// Options configure a Filter.
type Options struct {
	// Profiles are the rewrite profiles; none: the filter does nothing.
	Profiles rewrite.Profiles
	// Identify reviews the tokens of callers a profile may select.
	Identify Identify
	// MaxRequestBodyBytes and MaxResponseBytes bound what a selected
	// caller's request makes the agent hold (defaults above).
	MaxRequestBodyBytes int64
	MaxResponseBytes    int64
	// MaxHeldBytes bounds what all selected callers' requests make the
	// agent hold at once for rewriting: bodies read and answers held, each
	// counted with what decoding it costs (decodeFactor). Past it, a
	// request gets 429 and an answer 503, both with Retry-After.
	MaxHeldBytes int64
	// Metrics counts the filter's requests; nil: not counted.
	Metrics *Metrics
}

// Filter renames the requests of selected callers and restores their
// answers.
type Filter struct {
	profiles    rewrite.Profiles
	identify    Identify
	maxBody     int64
	maxResponse int64
	memos       map[*rewrite.Rewriter]*memos
	metrics     *Metrics
	// budget bounds the bytes held for rewriting at once, across callers;
	// budgetCap is its capacity.
	budget    *semaphore.Weighted
	budgetCap int64
}

// New returns the filter of o.
func New(o Options) (*Filter, error) {
	if len(o.Profiles) > 0 && o.Identify == nil {
		return nil, errors.New("rewriting: profiles without a way to review tokens")
	}
	f := &Filter{
		profiles:    o.Profiles,
		identify:    o.Identify,
		maxBody:     o.MaxRequestBodyBytes,
		maxResponse: o.MaxResponseBytes,
		memos:       map[*rewrite.Rewriter]*memos{},
		metrics:     o.Metrics,
	}
	if f.maxBody <= 0 {
		f.maxBody = DefaultMaxRequestBodyBytes
	}
	if f.maxResponse <= 0 {
		f.maxResponse = DefaultMaxResponseBytes
	}
	for _, p := range o.Profiles {
		f.memos[p] = &memos{objects: newMemo(defaultMemoBytes), events: newMemo(defaultMemoBytes)}
	}
	f.budgetCap = o.MaxHeldBytes
	if f.budgetCap <= 0 {
		f.budgetCap = DefaultMaxHeldBytes
	}
	f.budget = semaphore.NewWeighted(f.budgetCap)
	return f, nil
}

// Wrap returns next behind the filter. Without profiles it returns next
// itself: callers pay nothing for a mode that is off. next sees a
// selected caller's request renamed, with its RequestInfo parsed again
// from the renamed path; it must run after the request's deadlines and
// body bounds are set, since the filter reads the body.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	if f == nil || len(f.profiles) == 0 {
		return next
	}
	renamed := apihttp.WithRequestInfo(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openAPI := openAPIV3Path(r.URL.Path)
		if (!apiPath(r.URL.Path) && !openAPI) || untouched(r) {
			// /version, health and metrics carry no API names; the
			// OpenAPI v2 document, proxies, logs and streams are
			// passed as they are (docs/concepts/rewriting.md).
			next.ServeHTTP(w, r)
			return
		}
		rw, err := f.profileFor(r)
		switch {
		case err != nil:
			f.refuseUnidentified(w, r, err)
		case rw == nil:
			next.ServeHTTP(w, r)
		case openAPI:
			f.serveOpenAPIV3(w, r, rw, renamed)
		default:
			f.serve(w, r, rw, renamed)
		}
	})
}

// relay lets next answer out, a request renamed for rw, and restores the
// answer before w sees it; with, if not nil, sets how.
func (f *Filter) relay(w http.ResponseWriter, out *http.Request, rw *rewrite.Rewriter, next http.Handler, with func(*response)) {
	rec := newResponse(w, out, rw, f.memos[rw], f.maxResponse, f.budget, f.budgetCap)
	if with != nil {
		with(rec)
	}
	completed := false
	defer func() {
		rec.end(completed)
		f.metrics.request(rw.Name(), rec.outcome())
	}()
	next.ServeHTTP(rec, out)
	completed = true
}

// untouchedSubresources carry no API names, or carry bytes a pod chose:
// a proxy's answer, logs, exec, attach and port-forward streams. They are
// long-running, outside the request timeout and in-flight bounds, so
// holding their bodies for a rewrite would let a pod make the agent hold
// what it pleases.
var untouchedSubresources = map[string]bool{"proxy": true, "log": true, "exec": true, "attach": true, "portforward": true}

// untouched says whether r is a request the filter leaves as it is for
// every caller.
func untouched(r *http.Request) bool {
	info, ok := request.RequestInfoFrom(r.Context())
	if !ok || !info.IsResourceRequest {
		return false
	}
	return info.Verb == "proxy" || untouchedSubresources[info.Subresource]
}

// apiPath says whether path is under /api or /apis, the paths of API
// objects and their discovery: the only ones the filter rewrites.
func apiPath(path string) bool {
	for _, p := range []string{"/api", "/apis"} {
		if rest, ok := strings.CutPrefix(path, p); ok && (rest == "" || rest[0] == '/') {
			return true
		}
	}
	return false
}

// profileFor returns the rewriter of the profile that selects r's caller,
// or nil. Only a token whose unverified subject a profile selects is
// reviewed; the profile is then chosen by the reviewed user name.
func (f *Filter) profileFor(r *http.Request) (*rewrite.Rewriter, error) {
	token, ok := access.BearerToken(r.Header)
	if !ok {
		return nil, nil
	}
	sub := unverifiedSubject(token)
	if sub == "" || f.profiles.For(sub) == nil {
		return nil, nil
	}
	u, err := f.identify(r)
	if err != nil || u == nil {
		return nil, err
	}
	return f.profiles.For(u.GetName()), nil
}

// refuseUnidentified answers a caller that may be selected but whose
// token could not be reviewed now. Forwarding it unrewritten would hand a
// selected caller the cluster's names, so it is told to retry: 429 when
// its share of reviews is used up, 503 when the review failed.
func (f *Filter) refuseUnidentified(w http.ResponseWriter, r *http.Request, err error) {
	f.metrics.request("", outcomeUnidentified)
	w.Header().Set("Retry-After", "1")
	if errors.Is(err, access.ErrThrottled) {
		apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests("the node's agent is reviewing too many of this client's tokens to rewrite its requests; retry", 1))
		return
	}
	klog.FromContext(r.Context()).V(2).Info("Reviewing the token of a caller a rewrite profile may select failed", "err", err)
	apihttp.WriteStatus(w, r, apierrors.NewServiceUnavailable("the node's agent could not review this client's token to rewrite its request; retry"))
}

// serve renames r for rw, lets next answer it and restores the answer.
func (f *Filter) serve(w http.ResponseWriter, r *http.Request, rw *rewrite.Rewriter, next http.Handler) {
	profile := rw.Name()
	out, status := f.renameRequest(r, rw)
	if status != nil {
		f.metrics.request(profile, outcomeRefused)
		if status.ErrStatus.Code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		apihttp.WriteStatus(w, r, status)
		return
	}
	if apihttp.IsUpgrade(r) {
		// exec, attach and port-forward carry no API names once
		// upgraded: only their path was renamed.
		f.metrics.request(profile, outcomeRewritten)
		next.ServeHTTP(w, out)
		return
	}
	f.relay(w, out, rw, next, func(rec *response) { rec.headers = validators(rw.Fingerprint()) })
}

// renameRequest returns r renamed for rw: path and query, Accept narrowed
// to what can be rewritten, Accept-Encoding dropped (answers are
// rewritten as plain bytes) and the body renamed. A request that cannot
// be rewritten gets a status error instead.
func (f *Filter) renameRequest(r *http.Request, rw *rewrite.Rewriter) (*http.Request, *apierrors.StatusError) {
	out := r.Clone(r.Context())
	query := r.URL.Query()
	path, q, _ := rw.RequestPath(r.URL.Path, query)
	if path != r.URL.Path {
		out.URL.Path, out.URL.RawPath = path, ""
	}
	if r.URL.RawQuery != "" {
		if enc := q.Encode(); enc != query.Encode() {
			out.URL.RawQuery = enc
		}
	}
	out.RequestURI = out.URL.RequestURI()
	if !apihttp.IsUpgrade(r) {
		accept, ok := rewrite.AcceptJSON(r.Header.Get("Accept"))
		if !ok {
			return nil, newStatusError(http.StatusNotAcceptable, metav1.StatusReasonNotAcceptable,
				fmt.Sprintf("rewrite profile %s answers in JSON or YAML only; the request accepts %q", rw.Name(), r.Header.Get("Accept")))
		}
		out.Header.Set("Accept", accept)
		out.Header.Del("Accept-Encoding")
		untagConditions(out.Header, rw.Fingerprint())
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return out, nil
	}
	est := f.maxBody
	if r.ContentLength > 0 && r.ContentLength < est {
		est = r.ContentLength
	}
	if est*decodeFactor > f.budgetCap {
		return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the agent rewrites bodies of up to %d bytes", f.budgetCap/decodeFactor))
	}
	if !f.budget.TryAcquire(est * decodeFactor) {
		return nil, apierrors.NewTooManyRequests("the node's agent is rewriting too many requests at once; retry", 1)
	}
	defer f.budget.Release(est * decodeFactor)
	body, err := io.ReadAll(io.LimitReader(r.Body, f.maxBody+1))
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if int64(len(body)) > f.maxBody {
		return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d bytes", f.maxBody))
	}
	if isProtobuf(r.Header.Get("Content-Type")) {
		fields, err := protobufFields(body)
		if err != nil {
			return nil, newStatusError(http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType,
				fmt.Sprintf("rewrite profile %s could not read the protobuf request body as a built-in object (%v); send JSON", rw.Name(), err))
		}
		cost := int64(fields) * protobufFieldCost
		if !f.budget.TryAcquire(cost) {
			return nil, apierrors.NewTooManyRequests("the node's agent is rewriting too many requests at once; retry", 1)
		}
		defer f.budget.Release(cost)
		j, err := protobufToJSON(body)
		if err != nil {
			return nil, newStatusError(http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType,
				fmt.Sprintf("rewrite profile %s could not read the protobuf request body as a built-in object (%v); send JSON", rw.Name(), err))
		}
		body = j
		out.Header.Set("Content-Type", "application/json")
	}
	renamed, st := renameBody(rw, out, body)
	if st != nil {
		return nil, st
	}
	out.Body = io.NopCloser(bytes.NewReader(renamed))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(renamed)), nil }
	out.ContentLength = int64(len(renamed))
	out.Header.Del("Content-Length")
	return out, nil
}

// renameBody renames a request body by its Content-Type. A body the
// rewriter cannot parse goes as it came: kube-apiserver refuses it.
func renameBody(rw *rewrite.Rewriter, r *http.Request, body []byte) ([]byte, *apierrors.StatusError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return body, nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		// kube-apiserver reads a body without a Content-Type as JSON.
		ct = "application/json"
	}
	target := patchTarget(r)
	var out []byte
	var err error
	switch rewrite.BodyOf(ct) {
	case rewrite.BodyObject:
		out, err = rw.ObjectJSON(body)
	case rewrite.BodyMergePatch:
		out, err = rw.PatchJSON(body, target)
	case rewrite.BodyJSONPatch:
		out, err = rw.JSONPatchJSON(body, target)
	case rewrite.BodyApplyPatch:
		out, err = rw.ApplyPatchYAML(body, target)
	default:
		return nil, newStatusError(http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType,
			fmt.Sprintf("rewrite profile %s rewrites JSON and YAML request bodies only, not %q", rw.Name(), ct))
	}
	if err != nil {
		return body, nil
	}
	return out, nil
}

// patchTarget is the object r's path names, on the caller's side: what a
// patch that does not say it itself is about.
func patchTarget(r *http.Request) rewrite.Target {
	info, ok := request.RequestInfoFrom(r.Context())
	if !ok || !info.IsResourceRequest {
		return rewrite.Target{}
	}
	return rewrite.Target{Group: info.APIGroup, Kind: kindOf(info.APIGroup, info.Resource), Name: info.Name}
}

// kindOf names the kinds whose names the rewriter reads for their
// content; other resources' patches are rewritten by their metadata and
// whatever kind they name themselves.
func kindOf(group, resource string) string {
	k, ok := builtinKinds[schema.GroupResource{Group: group, Resource: resource}]
	if !ok {
		return ""
	}
	return k
}

var builtinKinds = map[schema.GroupResource]string{
	{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}:                 "CustomResourceDefinition",
	{Group: "rbac.authorization.k8s.io", Resource: "roles"}:                                "Role",
	{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}:                         "ClusterRole",
	{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"}:   "ValidatingWebhookConfiguration",
	{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"}:     "MutatingWebhookConfiguration",
	{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies"}:       "ValidatingAdmissionPolicy",
	{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings"}: "ValidatingAdmissionPolicyBinding",
	{Group: "admissionregistration.k8s.io", Resource: "mutatingadmissionpolicies"}:         "MutatingAdmissionPolicy",
	{Group: "admissionregistration.k8s.io", Resource: "mutatingadmissionpolicybindings"}:   "MutatingAdmissionPolicyBinding",
	{Group: "", Resource: "events"}:                                                        "Event",
	{Group: "events.k8s.io", Resource: "events"}:                                           "Event",
}

// newStatusError is a StatusError with a code and reason of its own.
func newStatusError(code int, reason metav1.StatusReason, message string) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    int32(code),
		Reason:  reason,
		Message: strings.TrimSpace(message),
	}}
}
