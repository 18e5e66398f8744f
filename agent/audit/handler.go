package audit

import (
	"net/http"

	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/cache/access"
)

// The annotations kube-apiserver's authorization filter adds to an event.
const (
	decisionAnnotationKey = "authorization.k8s.io/decision"
	reasonAnnotationKey   = "authorization.k8s.io/reason"
	decisionAllow         = "allow"
	decisionForbid        = "forbid"
)

// Wrap returns h recording each request it serves as one audit event per
// stage the policy keeps: the caller (the user the access review
// authenticated), verb, objectRef, requestURI, sourceIPs, userAgent, the
// response's code (and, for an error, its Status), and the
// authorization.k8s.io/decision and authorization.k8s.io/reason
// annotations of the review. The response carries the event's Audit-Id,
// the client's own Audit-ID header if it sent one. When auditing is off,
// Wrap returns h itself.
//
// Every request h serves must carry its RequestInfo (request.WithRequestInfo)
// and its review (access.WithResult) in the context, as cache.Handler
// passes them; the received timestamp is taken from
// request.WithReceivedTimestamp if set earlier (WithReceivedTimestamp).
//
// A watch whose request has no Audit-ID header gets the event's in its
// request headers, so that a part of the stream h obtains from
// kube-apiserver with that request (a watch-list's continuation) is
// recorded there under the same ID.
func (a *Auditor) Wrap(h http.Handler) http.Handler {
	if !a.Enabled() {
		return h
	}
	h = annotate(h)
	h = filters.WithAudit(h, a.backend, a.policy, a.longRunning)
	h = withReviewedUser(h)
	return filters.WithAuditInit(h)
}

// WithReceivedTimestamp returns h recording in the request's context when
// the agent received it, the requestReceivedTimestamp of its audit event;
// without it, the event says when Wrap's handler started instead (after
// the access review). When auditing is off it returns h itself.
func (a *Auditor) WithReceivedTimestamp(h http.Handler) http.Handler {
	if !a.Enabled() {
		return h
	}
	return filters.WithRequestReceivedTimestamp(h)
}

// withReviewedUser puts the user the access review authenticated in the
// context, where the audit filter (as kube-apiserver's, after its
// authentication filter) looks for the caller.
func withReviewedUser(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if res, ok := access.ResultFrom(r.Context()); ok && res.User != nil {
			r = r.WithContext(request.WithUser(r.Context(), res.User))
		}
		h.ServeHTTP(w, r)
	})
}

// annotate adds the review's decision and reason to the event, as
// kube-apiserver's authorization filter does, and hands a watch's Audit-ID
// on to its request headers (see Wrap). It runs inside the audit filter,
// so the annotations are in every event of the request but
// RequestReceived, as in kube-apiserver.
func annotate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if res, ok := access.ResultFrom(ctx); ok {
			switch res.Verdict {
			case access.Allowed:
				audit.AddAuditAnnotations(ctx, decisionAnnotationKey, decisionAllow, reasonAnnotationKey, res.AuthorizationReason)
			case access.Denied:
				audit.AddAuditAnnotations(ctx, decisionAnnotationKey, decisionForbid, reasonAnnotationKey, res.AuthorizationReason)
			}
		}
		if info, ok := request.RequestInfoFrom(ctx); ok && info.Verb == "watch" && r.Header.Get(auditinternal.HeaderAuditID) == "" {
			if id, _ := audit.AuditIDFrom(ctx); id != "" {
				r = r.Clone(ctx)
				r.Header.Set(auditinternal.HeaderAuditID, string(id))
			}
		}
		h.ServeHTTP(w, r)
	})
}
