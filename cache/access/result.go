// Package access decides who may read from the node-local cache: the same
// authentication and authorization decision kube-apiserver would make for
// the request, obtained with TokenReview and SubjectAccessReview and cached
// briefly.
package access

import (
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
}

// Reviewer reviews requests that the cache could answer.
type Reviewer interface {
	// Review authenticates r's bearer token and authorizes info (verb,
	// resource, subresource, namespace, name, and the request's label and
	// field selectors) for the authenticated user. It never logs the
	// token.
	Review(r *http.Request, info *request.RequestInfo) Result
}
