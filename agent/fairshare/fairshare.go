// Package fairshare shares a bounded resource (connections, requests in
// flight, long-running requests) among sources, the client IPs of a node's
// pods, so that no source, nor a few together, can take what the others
// need.
//
// Every source may always hold a guaranteed share, whatever the others
// hold. Above it a source borrows from a pool shared by all sources, up to a
// bound of its own. So a source that asks for no more than its guaranteed
// share is never refused, and one that asks for more is refused only when
// it holds its own bound or the shared pool is used up. What all sources
// hold together is at most the shared pool plus the guaranteed share of
// every source holding anything: sources are TCP peers, which a pod cannot
// forge, so their number is that of the pods (and node addresses) that
// reach the agent.
package fairshare

import (
	"sync"
	"sync/atomic"
)

// Limits are the bounds of a Pool. A negative bound is no bound.
type Limits struct {
	// Guaranteed is what every source may hold, whatever the others hold.
	Guaranteed int
	// PerSource bounds what one source holds in all, its guaranteed share
	// included; it wins over Guaranteed.
	PerSource int
	// Shared bounds what all sources together hold beyond their
	// guaranteed shares.
	Shared int
}

// Unbounded reports whether l bounds nothing.
func (l Limits) Unbounded() bool { return l.PerSource < 0 && l.Shared < 0 }

// Reason says why a Pool refused a slot.
type Reason string

const (
	// PerSource: the source holds its own bound.
	PerSource Reason = "per-source"
	// Total: the source holds its guaranteed share and the shared pool is
	// used up.
	Total Reason = "total"
)

// Pool hands out slots to sources within Limits. It never waits: a slot is
// taken at once or refused.
type Pool struct {
	limits Limits

	mu sync.Mutex // protects the fields below
	// held is the slots each source holds; a source holding none has no
	// entry.
	held map[string]int
	// borrowed is the slots held beyond the guaranteed shares: the sum
	// over sources of held minus Guaranteed, where positive.
	borrowed int
}

// New returns a Pool with limits l.
func New(l Limits) *Pool {
	return &Pool{limits: l, held: map[string]int{}}
}

// Limits returns the pool's bounds.
func (p *Pool) Limits() Limits { return p.limits }

// Acquire takes a slot for src. It returns the reason if the slot is
// refused; otherwise the caller must Release the slot once it is no longer
// held (later calls do nothing).
func (p *Pool) Acquire(src string) (*Slot, Reason) {
	l := p.limits
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.held[src]
	borrow := n >= l.Guaranteed
	switch {
	case l.PerSource >= 0 && n >= l.PerSource:
		return nil, PerSource
	case borrow && l.Shared >= 0 && p.borrowed >= l.Shared:
		return nil, Total
	}
	p.held[src] = n + 1
	if borrow {
		p.borrowed++
	}
	return &Slot{pool: p, src: src}, ""
}

// Slot is one slot a source holds in a Pool.
type Slot struct {
	pool     *Pool
	src      string
	released atomic.Bool
}

// Release gives the slot back; later calls do nothing.
func (s *Slot) Release() {
	if !s.released.Swap(true) {
		s.pool.release(s.src)
	}
}

// release gives back one of src's slots. A source's slots are alike, so
// the one given back is a borrowed one as long as it holds any.
func (p *Pool) release(src string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.held[src]
	if n > p.limits.Guaranteed {
		p.borrowed--
	}
	if n <= 1 {
		delete(p.held, src)
		return
	}
	p.held[src] = n - 1
}

// Usage is what a Pool's sources hold at one moment.
type Usage struct {
	// Held is the slots held by all sources; Borrowed those of them beyond
	// the guaranteed shares; Sources the sources holding any.
	Held, Borrowed, Sources int
}

// Usage returns what the sources hold now.
func (p *Pool) Usage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := Usage{Borrowed: p.borrowed, Sources: len(p.held)}
	for _, n := range p.held {
		u.Held += n
	}
	return u
}

// Held returns the slots src holds now.
func (p *Pool) Held(src string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[src]
}
