// Package apihttp holds what every part of the agent that sees a request
// needs to know of it, decided as kube-apiserver decides it (its
// RequestInfo, whether it is long-running, a watch, or an upgrade), and
// how the agent's HTTP servers answer an error (a metav1.Status, as
// kube-apiserver writes it) and log net/http's own messages. It keeps no
// state and makes no decision of its own.
package apihttp

import (
	"bufio"
	"log"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/filters"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
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

// WriteStatus answers with err as a metav1.Status, encoded in whatever the
// client negotiated (JSON, YAML or protobuf), as kube-apiserver does.
func WriteStatus(w http.ResponseWriter, r *http.Request, err error) {
	responsewriters.ErrorNegotiated(err, scheme.Codecs.WithoutConversion(), schema.GroupVersion{Version: "v1"}, w, r)
}

// ServerErrorLog routes net/http's own messages (TLS handshake errors and
// the like) to klog at V(2): a misbehaving client must not flood the log.
func ServerErrorLog(logger klog.Logger) *log.Logger {
	return ServerErrorLogAt(logger, 2)
}

// ServerErrorLogAt is ServerErrorLog at verbosity v.
func ServerErrorLogAt(logger klog.Logger, v int) *log.Logger {
	return log.New(logWriter{logger: logger, v: v}, "", 0)
}

type logWriter struct {
	logger klog.Logger
	v      int
}

func (w logWriter) Write(p []byte) (int, error) {
	w.logger.V(w.v).Info("HTTP server", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}

// StatusRecorder remembers the response code (Code). It passes Flush and Hijack
// through, which watches and upgrades need.
type StatusRecorder struct {
	http.ResponseWriter
	status atomic.Int32
}

func (s *StatusRecorder) WriteHeader(code int) {
	// 1xx other than 101 are informational (100 Continue, 103 Early
	// Hints); the final status comes later.
	if code >= 200 || code == http.StatusSwitchingProtocols {
		s.status.CompareAndSwap(0, int32(code))
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *StatusRecorder) Write(b []byte) (int, error) {
	s.status.CompareAndSwap(0, http.StatusOK)
	return s.ResponseWriter.Write(b)
}

func (s *StatusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack is how httputil.ReverseProxy completes an upgrade: it writes the
// 101 straight onto the connection, so record it here.
func (s *StatusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.status.CompareAndSwap(0, http.StatusSwitchingProtocols)
	}
	return conn, rw, err
}

func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Code is the response's status code; 0 before one was written.
func (s *StatusRecorder) Code() int { return int(s.status.Load()) }
