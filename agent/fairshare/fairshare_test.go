package fairshare

import (
	"fmt"
	"sync"
	"testing"
)

// step is one Acquire (or, with release, one release of a slot src took
// earlier) and what it must give.
type step struct {
	src     string
	release bool
	want    Reason
}

func TestPool(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
		steps  []step
	}{{
		// Given a guaranteed share of 2, when one source has used up the
		// shared pool, then another source still gets its two slots, and
		// only its third is refused.
		name:   "guaranteed share survives a used-up pool",
		limits: Limits{Guaranteed: 2, PerSource: 5, Shared: 3},
		steps: []step{
			{"a", false, ""}, {"a", false, ""}, // guaranteed
			{"a", false, ""}, {"a", false, ""}, {"a", false, ""}, // borrowed: pool used up
			{"a", false, PerSource},
			{"b", false, ""}, {"b", false, ""},
			{"b", false, Total},
		},
	}, {
		// Given a per-source bound, then one source cannot use up the
		// shared pool, and another borrows the rest.
		name:   "per-source bound keeps the pool for others",
		limits: Limits{Guaranteed: 1, PerSource: 3, Shared: 4},
		steps: []step{
			{"a", false, ""}, {"a", false, ""}, {"a", false, ""},
			{"a", false, PerSource},
			{"b", false, ""}, {"b", false, ""}, {"b", false, ""},
			{"c", false, ""},
			{"c", false, Total},
		},
	}, {
		// When a source gives a slot back, then what it borrowed returns to
		// the pool first.
		name:   "release returns borrowed slots first",
		limits: Limits{Guaranteed: 1, PerSource: 10, Shared: 1},
		steps: []step{
			{"a", false, ""}, {"a", false, ""},
			{"b", false, ""},
			{"b", false, Total},
			{"a", true, ""},
			{"b", false, ""},
			{"a", false, Total},
		},
	}, {
		// Given no guaranteed share, then the pool is a plain total.
		name:   "no guarantee",
		limits: Limits{Guaranteed: 0, PerSource: -1, Shared: 2},
		steps:  []step{{"a", false, ""}, {"b", false, ""}, {"c", false, Total}},
	}, {
		// Given a per-source bound below the guarantee, then the bound wins.
		name:   "per-source bound below the guarantee",
		limits: Limits{Guaranteed: 5, PerSource: 1, Shared: 0},
		steps:  []step{{"a", false, ""}, {"a", false, PerSource}},
	}, {
		// Given no bounds, then nothing is refused.
		name:   "unbounded",
		limits: Limits{Guaranteed: 0, PerSource: -1, Shared: -1},
		steps:  []step{{"a", false, ""}, {"a", false, ""}, {"a", false, ""}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(tc.limits)
			held := map[string][]func(){}
			for i, s := range tc.steps {
				if s.release {
					rs := held[s.src]
					rs[len(rs)-1]()
					rs[len(rs)-1]() // a second call does nothing
					held[s.src] = rs[:len(rs)-1]
					continue
				}
				slot, refused := p.Acquire(s.src)
				if refused != s.want {
					t.Fatalf("step %d: Acquire(%q) refused %q, want %q (usage %+v)", i, s.src, refused, s.want, p.Usage())
				}
				if refused == "" {
					held[s.src] = append(held[s.src], slot.Release)
				}
			}
			for _, rs := range held {
				for _, r := range rs {
					r()
				}
			}
			if u := p.Usage(); u != (Usage{}) {
				t.Errorf("after every slot was given back: %+v", u)
			}
		})
	}
}

// TestPoolConcurrent: many sources taking and giving back slots at once
// never hold more than the bounds allow, and leave nothing behind.
func TestPoolConcurrent(t *testing.T) {
	l := Limits{Guaranteed: 2, PerSource: 6, Shared: 10}
	p := New(l)
	const sources = 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	var over []string
	for s := range sources {
		src := fmt.Sprintf("10.0.0.%d", s)
		wg.Go(func() {
			for range 200 {
				slot, refused := p.Acquire(src)
				if refused != "" {
					continue
				}
				u := p.Usage()
				if n := p.Held(src); n > l.PerSource || u.Borrowed > l.Shared {
					mu.Lock()
					over = append(over, fmt.Sprintf("%s holds %d, %d borrowed", src, n, u.Borrowed))
					mu.Unlock()
				}
				slot.Release()
			}
		})
	}
	wg.Wait()
	if len(over) > 0 {
		t.Errorf("bounds exceeded: %v", over)
	}
	if u := p.Usage(); u != (Usage{}) {
		t.Errorf("after every slot was given back: %+v", u)
	}
}
