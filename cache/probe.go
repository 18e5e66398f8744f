package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// A consistent read (resourceVersion unset) must see every write that
// finished before it began, wherever it was made. kube-apiserver proves
// that for its watch cache with an etcd progress request; a client of
// kube-apiserver cannot make one, and the cache's own watch carries the
// upstream's current resourceVersion only in its events and in the
// bookmarks kube-apiserver sends about once a minute. A Store whose scope
// is quiet (this node's pods between changes) is therefore almost always
// behind the cluster-wide resourceVersion even when its content is current,
// and waiting for it to catch up would mean waiting up to a minute.
//
// So the probe asks for the scope's current state in its cheapest form: a
// consistent list of the informer's scope as PartialObjectMetadata
// (protobuf), which kube-apiserver answers from its watch cache after its
// own progress check. The Store may answer when it has reached the list's
// resourceVersion, or when it holds exactly the listed objects at the
// listed resourceVersions: then its content is the upstream's state at the
// list's resourceVersion, whatever events are still on their way.
//
// Probes are coalesced per informer: at most one is in flight, and every
// read that arrives meanwhile waits for the next one, which starts when the
// one in flight ends (that one may have been answered before the read's
// write finished). A tenant can therefore make the agent send at most one
// probe per resource at a time, never more probes than reads, and only
// after its read was allowed. The read that makes a new round pays for
// it from its source's share and the node's budget, or is forwarded
// (probebudget.go); the reads that join a round already due pay nothing.

// probeTimeout bounds one probe request. Readers wait at most WaitTimeout
// for a probe's result; a probe they gave up on still ends on its own.
const probeTimeout = 10 * time.Second

// probeResult is one probe's answer: the upstream's state of the scope at
// rv, as key → resourceVersion.
type probeResult struct {
	rv       uint64
	versions map[string]uint64
	err      error
}

// errProbeBudget is await's error for a read whose new probe the budget
// refused.
var errProbeBudget = errors.New("consistent-read probe over budget")

// probeRound is one probe and the reads waiting for it.
type probeRound struct {
	done chan struct{}
	probeResult
}

// prober coalesces the consistent-read probes of one informer.
type prober struct {
	// list makes one probe request.
	list func(context.Context) probeResult
	// observe records a finished probe (metrics); may be nil.
	observe func(time.Duration, probeResult)

	mu       sync.Mutex
	inflight bool
	// next is the round reads that arrive now wait for; it starts when
	// the round in flight ends.
	next *probeRound
}

// await returns the result of a probe that started after the call, waiting
// for it until ctx ends. A read that makes a new round (none is due to
// start) first calls admit, with p.mu held, which charges the round to a
// budget; if it returns false, await returns errProbeBudget at once. A
// nil admit admits every round.
func (p *prober) await(ctx context.Context, admit func() bool) (probeResult, error) {
	p.mu.Lock()
	r := p.next
	if r == nil {
		if admit != nil && !admit() {
			p.mu.Unlock()
			return probeResult{}, errProbeBudget
		}
		r = &probeRound{done: make(chan struct{})}
		p.next = r
	}
	if !p.inflight {
		p.startLocked()
	}
	p.mu.Unlock()
	select {
	case <-r.done:
		return r.probeResult, r.err
	case <-ctx.Done():
		return probeResult{}, ctx.Err()
	}
}

// startLocked starts the waiting round; p.mu is held.
func (p *prober) startLocked() {
	r := p.next
	p.next = nil
	p.inflight = true
	go func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		r.probeResult = p.list(ctx)
		cancel()
		if p.observe != nil {
			p.observe(time.Since(start), r.probeResult)
		}
		close(r.done)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.inflight = false
		if p.next != nil {
			p.startLocked()
		}
	}()
}

// metadataProbe returns the probe request of an informer: a consistent
// list of its scope as PartialObjectMetadata. The client has no rate
// limiter of its own: probes are bounded by being one at a time per
// resource and by the probe budget, which forwards reads rather than
// making them wait (probebudget.go).
func (r *informer) metadataProbe(cfg *rest.Config) (func(context.Context) probeResult, error) {
	c := rest.CopyConfig(cfg)
	c.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	mc, err := metadata.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	ri := mc.Resource(r.gvr)
	scope := r.scope.String()
	return func(ctx context.Context) probeResult {
		list, err := ri.List(ctx, metav1.ListOptions{FieldSelector: scope})
		if err != nil {
			return probeResult{err: err}
		}
		rv, err := store.ParseResourceVersion(list.ResourceVersion)
		if err != nil {
			return probeResult{err: fmt.Errorf("probe of %s: %w", r.label, err)}
		}
		versions := make(map[string]uint64, len(list.Items))
		for i := range list.Items {
			m := &list.Items[i]
			v, err := store.ParseResourceVersion(m.ResourceVersion)
			if err != nil {
				return probeResult{err: fmt.Errorf("probe of %s: %s: %w", r.label, m.Name, err)}
			}
			versions[store.Key(m.Namespace, m.Name)] = v
		}
		return probeResult{rv: rv, versions: versions}
	}, nil
}

// awaitCurrent waits, at most until ctx ends, until the Store holds at
// least the state of res: its RV has reached res.rv or its content is the
// probed state. It reports whether it does.
func awaitCurrent(ctx context.Context, s *store.Store, res probeResult) bool {
	for {
		changed, closed := s.Changed()
		if s.Matches(res.rv, res.versions) {
			return true
		}
		if closed {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}
