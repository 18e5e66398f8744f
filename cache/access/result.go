// Package access decides who may read from the node-local cache: the same
// authentication and authorization decision kube-apiserver would make for
// the request, obtained with TokenReview and SubjectAccessReview and cached
// briefly.
package access

import (
	"context"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// Verdict is what the cache may do with a request.
type Verdict int

const (
	// Forward: the cache must not answer; the request goes upstream
	// unchanged and kube-apiserver decides (no token, a token the reviews
	// reject, impersonation, a review that failed).
	Forward Verdict = iota
	// Allowed: the caller may have the answer from the cache.
	Allowed
	// Denied: kube-apiserver would refuse the request; Err is the 403
	// Status it would send.
	Denied
)

// Result is the outcome of reviewing one request.
type Result struct {
	Verdict Verdict
	// Reason says why a request is forwarded, as a short metric label
	// (for example "no-token", "impersonation", "token-rejected",
	// "review-error").
	Reason string
	// Err is set for Denied.
	Err *apierrors.StatusError
	// User is the authenticated caller, for Allowed and Denied.
	User user.Info
	// AuthorizationReason is the authorizer's reason for its decision,
	// for Allowed and Denied (kube-apiserver's authorization.k8s.io/reason
	// audit annotation).
	AuthorizationReason string
}

type resultKey struct{}

// WithResult returns ctx carrying the review result of the request it
// belongs to, for the handlers that answer it (audit).
func WithResult(ctx context.Context, res Result) context.Context {
	return context.WithValue(ctx, resultKey{}, res)
}

// ResultFrom returns the review result WithResult stored in ctx.
func ResultFrom(ctx context.Context) (Result, bool) {
	res, ok := ctx.Value(resultKey{}).(Result)
	return res, ok
}

// Reviewer reviews requests that the cache could answer.
type Reviewer interface {
	// Review authenticates r's bearer token and authorizes info (verb,
	// resource, subresource, namespace, name, and the request's label and
	// field selectors) for the authenticated user. It never logs the
	// token.
	Review(r *http.Request, info *request.RequestInfo) Result
}
