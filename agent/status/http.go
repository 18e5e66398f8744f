package status

import (
	"log"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
)

// The serving chain has helpers of its own for the same three jobs; these
// are the listener's, so that it depends on nothing of serving.

// writeStatus answers with err as a metav1.Status, encoded in whatever the
// client negotiated (JSON, YAML or protobuf), as kube-apiserver does.
func writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	responsewriters.ErrorNegotiated(err, scheme.Codecs.WithoutConversion(), schema.GroupVersion{Version: "v1"}, w, r)
}

// statusRecorder remembers the response code, for the refusal counts.
type statusRecorder struct {
	http.ResponseWriter
	// status is the final code; 0 until one is written.
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	// 1xx other than 101 are informational (100 Continue, 103 Early
	// Hints); the final status comes later.
	if s.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// newServerErrorLogAt routes net/http's own messages (TLS handshake errors
// and the like) to klog at verbosity v: a misbehaving client must not
// flood the log.
func newServerErrorLogAt(logger klog.Logger, v int) *log.Logger {
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
