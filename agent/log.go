package agent

import (
	"log"
	"strings"

	"k8s.io/klog/v2"
)

// newServerErrorLog routes net/http's own messages (TLS handshake errors and
// the like) to klog at V(2): a misbehaving client must not flood the log.
func newServerErrorLog(logger klog.Logger) *log.Logger {
	return newServerErrorLogAt(logger, 2)
}

// newServerErrorLogAt is newServerErrorLog at verbosity v.
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
