package cache

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Consistent-read probes (probe.go) run as the agent, and every agent of
// the fleet shares that identity: kube-apiserver's priority and fairness
// puts all their requests in one flow. Coalescing alone does not bound
// them: a caller that reads one Service in a loop, each read after the
// last one's probe, makes the agent list every Service once per read, a
// list of up to ProbeMaxObjects objects for a read that would cost
// kube-apiserver one. So a read pays for the probe it starts before it
// is sent.
//
// A probe costs the objects of the scope it lists (the Store's count, the
// best estimate before the answer) beyond what the read that starts it
// would cost kube-apiserver forwarded: the objects it returns, and never
// less than probeMinCost, which one request costs whatever its size
// (probeCost). A probe of a small scope, or for a read of the whole
// scope, thus costs nothing beyond its read; a get of one object among
// thousands pays for the thousands. Each source has a token bucket of
// objects, and the node one more that all sources share: a read that
// would start a probe takes its cost from both, and a read that finds
// either short is forwarded at once. Every round also takes one token
// from a bucket of rounds of its source's and the node's, however cheap:
// they bound the share of the agents' flow that one pod, or one node,
// can take with probes that cost no more than the reads they answer. The
// caller of a read forwarded for either then pays for it in its own
// flow, which is what the read costs without the agent, and the agent's
// flow carries no more than the node's budget whatever its callers do. A
// read that joins a probe already due to start costs nothing more
// upstream and is never refused (probe.go), and nothing ever waits for
// tokens: a read held back would hold its source's slot and its caller's
// time for a probe that a forward does without.
//
// probeMinCost is what one request costs kube-apiserver at least, in
// objects: a seat of its priority and fairness, whose list estimate counts
// a seat per 100 objects. A probe listing no more costs what a forwarded
// read would.
const probeMinCost = 100

// maxProbeSources bounds the sources whose buckets are kept.
const maxProbeSources = 4096

// probeBudget decides, without waiting, whether a probe may be sent for a
// source; see above. It is mechanism only: what a probe costs and what a
// refusal means are its caller's.
type probeBudget struct {
	// Fixed at construction; node is nil when the node has no bound.
	opts             ProbeBudget
	node, nodeRounds *rate.Limiter

	mu      sync.Mutex // protects the field below
	sources map[string]*probeSource
}

type probeSource struct {
	// limiter counts objects, rounds probes; either is nil without a
	// bound.
	limiter, rounds *rate.Limiter
	seen            time.Time
}

// Budgets that refused a probe, as metric labels.
const (
	probeBudgetSource = "source"
	probeBudgetNode   = "node"
)

func newProbeBudget(opts ProbeBudget) *probeBudget {
	opts.complete()
	b := &probeBudget{opts: opts, sources: map[string]*probeSource{}}
	if opts.ObjectsPerSecond > 0 {
		b.node = rate.NewLimiter(rate.Limit(opts.ObjectsPerSecond), opts.Burst)
	}
	if opts.RoundsPerSecond > 0 {
		b.nodeRounds = rate.NewLimiter(rate.Limit(opts.RoundsPerSecond), roundsBurst(opts.RoundsPerSecond))
	}
	return b
}

// take charges a probe of cost objects (zero: a probe that costs no more
// than its read would), at now, to src's share and to the node's budget:
// one round, and the objects. It returns "" if both paid, else the budget
// that could not (probeBudgetSource or probeBudgetNode), having charged
// nothing.
func (b *probeBudget) take(now time.Time, src string, cost int) string {
	var taken []*rate.Reservation
	refund := func() {
		for _, r := range taken {
			r.CancelAt(now)
		}
	}
	reserve := func(l *rate.Limiter, n int) bool {
		if l == nil || n == 0 {
			return true
		}
		r := l.ReserveN(now, n)
		if !r.OK() || r.DelayFrom(now) > 0 {
			r.CancelAt(now)
			return false
		}
		taken = append(taken, r)
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.opts.ObjectsPerSecondPerSource > 0 || b.opts.RoundsPerSecondPerSource > 0 {
		s := b.sourceLocked(now, src)
		if !reserve(s.rounds, 1) || !reserve(s.limiter, cost) {
			refund()
			return probeBudgetSource
		}
	}
	if !reserve(b.nodeRounds, 1) || !reserve(b.node, cost) {
		// The node's budget ran out, not the source's: give the source
		// its tokens back.
		refund()
		return probeBudgetNode
	}
	return ""
}

// sourceLocked returns src's bucket, making a full one if src has none;
// b.mu is held.
func (b *probeBudget) sourceLocked(now time.Time, src string) *probeSource {
	s := b.sources[src]
	if s == nil {
		if len(b.sources) >= maxProbeSources {
			b.evictLocked(now)
		}
		s = &probeSource{}
		if b.opts.ObjectsPerSecondPerSource > 0 {
			s.limiter = rate.NewLimiter(rate.Limit(b.opts.ObjectsPerSecondPerSource), b.opts.BurstPerSource)
		}
		if b.opts.RoundsPerSecondPerSource > 0 {
			s.rounds = rate.NewLimiter(rate.Limit(b.opts.RoundsPerSecondPerSource), roundsBurst(b.opts.RoundsPerSecondPerSource))
		}
		b.sources[src] = s
	}
	s.seen = now
	return s
}

// evictLocked drops the sources whose buckets are full again, which
// forgets nothing, and if none is, the one seen longest ago. Forgetting a
// spent bucket gives that source a full one: the node's budget still
// bounds them all.
func (b *probeBudget) evictLocked(now time.Time) {
	refill := 2 * time.Second // a rounds bucket's
	if b.opts.ObjectsPerSecondPerSource > 0 {
		refill = max(refill, time.Duration(float64(b.opts.BurstPerSource)/b.opts.ObjectsPerSecondPerSource*float64(time.Second)))
	}
	var oldest string
	for k, s := range b.sources {
		if now.Sub(s.seen) > refill {
			delete(b.sources, k)
			continue
		}
		if oldest == "" || s.seen.Before(b.sources[oldest].seen) {
			oldest = k
		}
	}
	if len(b.sources) >= maxProbeSources {
		delete(b.sources, oldest)
	}
}

// roundsBurst is the burst of a rate of probe rounds: two seconds' worth.
func roundsBurst(perSecond float64) int {
	return max(1, int(2*perSecond))
}
