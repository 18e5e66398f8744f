package serving

import (
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// throttledLogInterval is how often a throttledLog writes at most.
const throttledLogInterval = time.Minute

// throttledLog logs an event a client can repeat at will (a refused
// request, a closed connection) at most once per throttledLogInterval: the
// first at once, then one line a minute with how many happened since the
// previous line, and the key-value pairs of the latest. A client hammering
// a bound tells the operator who it is without flooding the log.
type throttledLog struct {
	msg, handler string
	now          func() time.Time

	mu sync.Mutex // protects the fields below
	// next is when the next line may be written; seen is the events since
	// the last one.
	next time.Time
	seen int
}

// newThrottledLog returns a throttledLog writing msg, with handler (if not
// empty) as a key-value pair.
func newThrottledLog(msg, handler string) *throttledLog {
	return &throttledLog{msg: msg, handler: handler, now: time.Now}
}

// log records one event and writes a line if one is due.
func (l *throttledLog) log(logger klog.Logger, keysAndValues ...any) {
	now := l.now()
	l.mu.Lock()
	l.seen++
	if now.Before(l.next) {
		l.mu.Unlock()
		return
	}
	n := l.seen
	l.seen, l.next = 0, now.Add(throttledLogInterval)
	l.mu.Unlock()
	kv := make([]any, 0, len(keysAndValues)+4)
	if l.handler != "" {
		kv = append(kv, "handler", l.handler)
	}
	kv = append(kv, "count", n, "interval", throttledLogInterval)
	logger.Info(l.msg, append(kv, keysAndValues...)...)
}
