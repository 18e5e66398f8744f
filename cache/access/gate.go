package access

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// errThrottled is the error of a review the gate did not let through.
var errThrottled = errors.New("review throttled: the caller's share of access reviews is used up")

// GateOptions bound the reviews a reviewer sends to kube-apiserver. Zero
// values mean the defaults.
type GateOptions struct {
	// QPS and Burst bound the node's reviews for callers kube-apiserver
	// has already authenticated: SubjectAccessReviews, and TokenReviews of
	// tokens it authenticated before (renewals of the token cache).
	QPS   float64
	Burst int
	// UnverifiedQPS and UnverifiedBurst bound the node's TokenReviews of
	// tokens never seen authenticated: bogus tokens spend this budget,
	// never the one above.
	UnverifiedQPS   float64
	UnverifiedBurst int
	// SourceQPS and SourceBurst bound the reviews made for one source: the
	// caller's IP address, that is one pod (host-network pods share the
	// node's address).
	SourceQPS   float64
	SourceBurst int
	// ReservedQPS and ReservedBurst are each source's own share, spent
	// before the node's buckets and beyond their reach: whatever other
	// sources do, a source gets this many reviews.
	ReservedQPS   float64
	ReservedBurst int
}

// Defaults of GateOptions. A pod's steady work is a handful of decisions
// reused for 10s each; the burst covers an informer start-up or a kubectl
// session. Past its share a caller is forwarded, which is what it would
// cost kube-apiserver without the agent. The most a node sends is
// QPS + UnverifiedQPS + ReservedQPS for each source with reviews due: 230
// reviews a second for a node of 110 pods all at their bound.
const (
	DefaultReviewQPS             = 100
	DefaultReviewBurst           = 200
	DefaultUnverifiedReviewQPS   = 20
	DefaultUnverifiedReviewBurst = 40
	DefaultSourceReviewQPS       = 5
	DefaultSourceReviewBurst     = 30
	DefaultReservedReviewQPS     = 1
	DefaultReservedReviewBurst   = 10
)

func (o *GateOptions) complete() {
	for _, b := range []struct {
		qps    *float64
		burst  *int
		dq, db int
	}{
		{&o.QPS, &o.Burst, DefaultReviewQPS, DefaultReviewBurst},
		{&o.UnverifiedQPS, &o.UnverifiedBurst, DefaultUnverifiedReviewQPS, DefaultUnverifiedReviewBurst},
		{&o.SourceQPS, &o.SourceBurst, DefaultSourceReviewQPS, DefaultSourceReviewBurst},
		{&o.ReservedQPS, &o.ReservedBurst, DefaultReservedReviewQPS, DefaultReservedReviewBurst},
	} {
		if *b.qps <= 0 {
			*b.qps = float64(b.dq)
		}
		if *b.burst <= 0 {
			*b.burst = b.db
		}
	}
}

// gate decides, without ever waiting, whether a review may be sent. Each
// source has a bucket that bounds all its reviews, and a smaller reserved
// one spent first; past its reserve a review also needs a token of the
// node's bucket for its kind: verified callers (access reviews, tokens
// authenticated before) and unverified tokens have one each. A caller
// whose review is not let through is forwarded to kube-apiserver, which
// decides there. So pods sending distinct bogus tokens spend their own
// shares and the unverified bucket, and never a legitimate caller's
// reviews; and however many sources drain the verified bucket, each
// source keeps its reserve.
type gate struct {
	// Fixed at construction.
	opts                 GateOptions
	verified, unverified *rate.Limiter
	metrics              *Metrics
	now                  func() time.Time

	mu      sync.Mutex // protects the field below
	sources map[string]*sourceBucket
}

type sourceBucket struct {
	limiter, reserved *rate.Limiter
	seen              time.Time
}

// maxSources bounds the sources tracked; idle ones are dropped first.
const maxSources = 4096

// sourceIdle is how long an unused source keeps its bucket. A bucket that
// has been idle this long is full again anyway (burst / qps < idle).
const sourceIdle = time.Minute

func newGate(opts GateOptions, m *Metrics) *gate {
	opts.complete()
	return &gate{opts: opts,
		verified:   rate.NewLimiter(rate.Limit(opts.QPS), opts.Burst),
		unverified: rate.NewLimiter(rate.Limit(opts.UnverifiedQPS), opts.UnverifiedBurst),
		metrics:    m, now: time.Now, sources: map[string]*sourceBucket{}}
}

// allow reports whether a review of kind may be sent for the source in
// ctx, and takes the tokens it needs if so. verified tells whether
// kube-apiserver has authenticated the caller's token before.
func (g *gate) allow(ctx context.Context, kind string, verified bool) bool {
	src := sourceFrom(ctx)
	now := g.now()
	g.mu.Lock()
	b := g.sources[src]
	if b == nil {
		if len(g.sources) >= maxSources {
			g.evictLocked(now)
		}
		b = &sourceBucket{limiter: rate.NewLimiter(rate.Limit(g.opts.SourceQPS), g.opts.SourceBurst),
			reserved: rate.NewLimiter(rate.Limit(g.opts.ReservedQPS), g.opts.ReservedBurst)}
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
	if b.reserved.AllowN(now, 1) {
		g.mu.Unlock()
		return true
	}
	g.mu.Unlock()
	node, limit := g.verified, "global"
	if !verified {
		node, limit = g.unverified, "unverified"
	}
	if !node.AllowN(now, 1) {
		// Give the source its token back: the node's budget, not its
		// own, ran out.
		g.mu.Lock()
		r.CancelAt(now)
		g.mu.Unlock()
		g.metrics.throttled(kind, limit)
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

// knownTokens remembers which tokens kube-apiserver has authenticated, by
// an HMAC of each (never the token): their renewals are reviewed from the
// verified budget. Bounded; when full, the longest unseen go first.
type knownTokens struct {
	key []byte

	mu sync.Mutex // protects the field below
	m  map[string]time.Time
}

// maxKnownTokens bounds the remembered tokens: a few per pod of a node,
// with room for rotations. 32 bytes and a time each.
const maxKnownTokens = 8192

func newKnownTokens() *knownTokens {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return &knownTokens{key: key, m: map[string]time.Time{}}
}

func (k *knownTokens) hash(token string) string {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(token))
	return string(m.Sum(nil))
}

func (k *knownTokens) has(token string) bool {
	h := k.hash(token)
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.m[h]
	return ok
}

// add remembers token as authenticated at now; forget drops it.
func (k *knownTokens) add(token string, now time.Time) {
	h := k.hash(token)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.m[h]; !ok && len(k.m) >= maxKnownTokens {
		// Drop the older half: rare (8,192 distinct valid tokens on one
		// node), and what is dropped only costs its next review the
		// unverified budget.
		times := make([]time.Time, 0, len(k.m))
		for _, t := range k.m {
			times = append(times, t)
		}
		slices.SortFunc(times, time.Time.Compare)
		cut := times[len(times)/2]
		for kk, t := range k.m {
			if t.Before(cut) {
				delete(k.m, kk)
			}
		}
		if len(k.m) >= maxKnownTokens {
			clear(k.m)
		}
	}
	k.m[h] = now
}

func (k *knownTokens) forget(token string) {
	h := k.hash(token)
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, h)
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
