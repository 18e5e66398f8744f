package access

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// errThrottled is the error of a review the gate did not let through.
var errThrottled = errors.New("review throttled: the caller's share of access reviews is used up")

// GateOptions bound the reviews a reviewer sends to kube-apiserver. Zero
// values mean the defaults.
type GateOptions struct {
	// QPS and Burst bound all reviews (TokenReviews and
	// SubjectAccessReviews together) the node's agent sends.
	QPS   float64
	Burst int
	// SourceQPS and SourceBurst bound the reviews made for one source: the
	// caller's IP address, that is one pod (host-network pods share the
	// node's address).
	SourceQPS   float64
	SourceBurst int
}

// Defaults of GateOptions. A pod's steady work is a handful of decisions
// reused for 10s each; the burst covers an informer start-up or a kubectl
// session. Past its share a caller is forwarded, which is what it would
// cost kube-apiserver without the agent.
const (
	DefaultReviewQPS         = 100
	DefaultReviewBurst       = 200
	DefaultSourceReviewQPS   = 5
	DefaultSourceReviewBurst = 30
)

func (o *GateOptions) complete() {
	if o.QPS <= 0 {
		o.QPS = DefaultReviewQPS
	}
	if o.Burst <= 0 {
		o.Burst = DefaultReviewBurst
	}
	if o.SourceQPS <= 0 {
		o.SourceQPS = DefaultSourceReviewQPS
	}
	if o.SourceBurst <= 0 {
		o.SourceBurst = DefaultSourceReviewBurst
	}
}

// gate decides, without ever waiting, whether a review may be sent: each
// source has a token bucket of its own and all share one more. A caller
// whose review is not let through is forwarded to kube-apiserver, which
// decides there; so one pod sending distinct bogus tokens or selectors
// spends its own share and cannot slow the reviews of the others or switch
// the cache off for them.
type gate struct {
	// Fixed at construction.
	opts    GateOptions
	global  *rate.Limiter
	metrics *Metrics
	now     func() time.Time

	mu      sync.Mutex // protects the field below
	sources map[string]*sourceBucket
}

type sourceBucket struct {
	limiter *rate.Limiter
	seen    time.Time
}

// maxSources bounds the sources tracked; idle ones are dropped first.
const maxSources = 4096

// sourceIdle is how long an unused source keeps its bucket. A bucket that
// has been idle this long is full again anyway (burst / qps < idle).
const sourceIdle = time.Minute

func newGate(opts GateOptions, m *Metrics) *gate {
	opts.complete()
	return &gate{opts: opts, global: rate.NewLimiter(rate.Limit(opts.QPS), opts.Burst), metrics: m,
		now: time.Now, sources: map[string]*sourceBucket{}}
}

// allow reports whether a review of kind may be sent for the source in
// ctx, and takes a token from both buckets if so.
func (g *gate) allow(ctx context.Context, kind string) bool {
	src := sourceFrom(ctx)
	now := g.now()
	g.mu.Lock()
	b := g.sources[src]
	if b == nil {
		if len(g.sources) >= maxSources {
			g.evictLocked(now)
		}
		b = &sourceBucket{limiter: rate.NewLimiter(rate.Limit(g.opts.SourceQPS), g.opts.SourceBurst)}
		g.sources[src] = b
	}
	b.seen = now
	r := b.limiter.ReserveN(now, 1)
	if !r.OK() || r.DelayFrom(now) > 0 {
		r.CancelAt(now)
		g.mu.Unlock()
		g.metrics.throttled(kind, "source")
		return false
	}
	g.mu.Unlock()
	if !g.global.AllowN(now, 1) {
		// Give the source its token back: the node's budget, not its
		// own, ran out.
		g.mu.Lock()
		r.CancelAt(now)
		g.mu.Unlock()
		g.metrics.throttled(kind, "global")
		return false
	}
	return true
}

// evictLocked drops idle sources, and all of them if none is idle (a new
// bucket is full, so that only forgets what was spent).
func (g *gate) evictLocked(now time.Time) {
	for k, b := range g.sources {
		if now.Sub(b.seen) > sourceIdle {
			delete(g.sources, k)
		}
	}
	if len(g.sources) >= maxSources {
		clear(g.sources)
	}
}

type sourceKey struct{}

// withSource returns ctx carrying the source of the request being
// reviewed: the IP of remoteAddr (host:port), or remoteAddr itself if it
// has no port.
func withSource(ctx context.Context, remoteAddr string) context.Context {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	return context.WithValue(ctx, sourceKey{}, host)
}

func sourceFrom(ctx context.Context) string {
	s, _ := ctx.Value(sourceKey{}).(string)
	return s
}
