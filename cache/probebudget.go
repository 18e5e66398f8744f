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
// best estimate before the answer) beyond those the read that starts it
// returns (probeCost), and at least probeMinCost: what the agent lists
// for the read beyond what kube-apiserver would have sent the caller. Each source
// has a token bucket of objects, and the node one more that all sources
// share: a read that would start a probe takes its cost from both, and a
// read that finds either short is forwarded at once. Its caller then pays
// for the read in its own flow, which is what the read costs without the
// agent, and the agent's flow carries no more than the node's budget
// whatever its callers do. A read that joins a probe already due to start
// costs nothing more upstream and is never refused (probe.go), and
// nothing ever waits for tokens: a read held back would hold its source's
// slot and its caller's time for a probe that a forward does without.
//
// Why not a cheaper probe for a read of one object: a limit=1 list
// gives kube-apiserver's current resourceVersion, which a quiet scope
// reaches only with its next bookmark (probe.go); a metadata-only get of
// the object is as consistent and costs one object, but it is one
// request under the agent's identity per read, not coalesced across
// objects, and costs kube-apiserver what the forwarded read would (one
// etcd read each). A forward is that probe's price, charged to the right
// flow.

// probeMinCost is the least a probe is charged, in objects: a request
// costs kube-apiserver at least one seat of its priority and fairness,
// and its list estimate counts a seat per 100 objects. So the node's
// budget bounds its probes to ObjectsPerSecond/100 a second, however
// small their scopes.
const probeMinCost = 100

// maxProbeSources bounds the sources whose buckets are kept.
const maxProbeSources = 4096

// probeBudget decides, without waiting, whether a probe may be sent for a
// source; see above. It is mechanism only: what a probe costs and what a
// refusal means are its caller's.
type probeBudget struct {
	// Fixed at construction; node is nil when the node has no bound.
	opts ProbeBudget
	node *rate.Limiter

	mu      sync.Mutex // protects the field below
	sources map[string]*probeSource
}

type probeSource struct {
	limiter *rate.Limiter
	seen    time.Time
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
	return b
}

// take charges a probe of cost objects, at now, to src's share and to the
// node's budget. It returns "" if both paid, else the budget that could
// not (probeBudgetSource or probeBudgetNode), having charged nothing.
func (b *probeBudget) take(now time.Time, src string, cost int) string {
	var reserved *rate.Reservation
	if b.opts.ObjectsPerSecondPerSource > 0 {
		b.mu.Lock()
		s := b.sourceLocked(now, src)
		r := s.limiter.ReserveN(now, cost)
		if !r.OK() || r.DelayFrom(now) > 0 {
			r.CancelAt(now)
			b.mu.Unlock()
			return probeBudgetSource
		}
		reserved = r
		b.mu.Unlock()
	}
	if b.node != nil && !b.node.AllowN(now, cost) {
		if reserved != nil {
			// The node's budget ran out, not the source's: give the
			// source its tokens back.
			b.mu.Lock()
			reserved.CancelAt(now)
			b.mu.Unlock()
		}
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
		s = &probeSource{limiter: rate.NewLimiter(rate.Limit(b.opts.ObjectsPerSecondPerSource), b.opts.BurstPerSource)}
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
	refill := time.Duration(float64(b.opts.BurstPerSource) / b.opts.ObjectsPerSecondPerSource * float64(time.Second))
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
