// Package apihttp holds what every part of the agent that sees a request
// needs to know of it, decided as kube-apiserver decides it: its
// RequestInfo, whether it is long-running, a watch, or an upgrade. It
// keeps no state and makes no decision of its own.
package apihttp

import (
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/filters"
)

// RequestInfoFactory parses requests the way kube-apiserver does.
var RequestInfoFactory = &request.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

// WithRequestInfo parses each request once, as kube-apiserver's
// WithRequestInfo filter does, and puts the result in its context.
func WithRequestInfo(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, err := RequestInfoFactory.NewRequestInfo(r); err == nil {
			r = r.WithContext(request.WithRequestInfo(r.Context(), info))
		}
		h.ServeHTTP(w, r)
	})
}

// LongRunning is kube-apiserver's own test of which requests are
// long-running: they are exempt from the in-flight limits, since a watch or
// an exec session may stay open for hours.
var LongRunning = filters.BasicLongRunningRequestCheck(
	sets.NewString("watch", "proxy"),
	sets.NewString("attach", "exec", "proxy", "log", "portforward"),
)

// IsWatch reports whether r is a watch (RequestInfo verb "watch").
func IsWatch(r *http.Request) bool {
	if r == nil {
		return false
	}
	info, ok := request.RequestInfoFrom(r.Context())
	return ok && info.Verb == "watch"
}

// IsLongRunning reports whether r is long-running by kube-apiserver's rule
// (watch, proxy, exec, attach, port-forward, logs).
func IsLongRunning(r *http.Request) bool {
	info, ok := request.RequestInfoFrom(r.Context())
	return ok && LongRunning(r, info)
}

// IsUpgrade reports whether r asks for a protocol upgrade.
func IsUpgrade(r *http.Request) bool {
	if r == nil || r.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}
