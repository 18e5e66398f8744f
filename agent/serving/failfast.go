package serving

import (
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// degradedRetryAfter is the Retry-After of the fast failures of degraded
// mode, in seconds.
const degradedRetryAfter = 1

// failFastWhenDegraded answers, while active says the agent is in
// degraded mode, the requests next would
// forward, without trying: consistent reads get kube-apiserver's timeout
// status (504, as its request timeout writes it), watches 429 with
// Retry-After (client-go resumes them from their resourceVersion, where
// 503 would make informers relist), everything else 503 with Retry-After.
// Outside degraded mode it is next.
func failFastWhenDegraded(active func() bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !active() {
			next.ServeHTTP(w, r)
			return
		}
		info, _ := request.RequestInfoFrom(r.Context())
		switch {
		case info != nil && info.IsResourceRequest && (info.Verb == "get" || info.Verb == "list") && isConsistentRead(r):
			apihttp.WriteStatus(w, r, apierrors.NewTimeoutError("request did not complete within the allotted timeout", 0))
		case info != nil && info.Verb == "watch":
			apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests("kube-apiserver is unreachable (the node-local API proxy is in degraded mode); retry the watch", degradedRetryAfter))
		default:
			err := apierrors.NewServiceUnavailable("kube-apiserver is unreachable (the node-local API proxy is in degraded mode, serving only cached reads)")
			err.ErrStatus.Details = &metav1.StatusDetails{RetryAfterSeconds: degradedRetryAfter}
			apihttp.WriteStatus(w, r, err)
		}
	})
}

// isConsistentRead reports whether a get or list asks for the most recent
// data: no resourceVersion (and no continue token, which carries one).
func isConsistentRead(r *http.Request) bool {
	q := r.URL.Query()
	return q.Get("resourceVersion") == "" && q.Get("continue") == ""
}
