package cache

import (
	"fmt"
	"testing"
	"time"
)

// TestProbeBudget: each source pays from a share of its own and from the
// node's budget; a refusal charges nothing; both refill with time.
func TestProbeBudget(t *testing.T) {
	now := time.Now()
	b := newProbeBudget(ProbeBudget{ObjectsPerSecond: 100, Burst: 1000, ObjectsPerSecondPerSource: 10, BurstPerSource: 500})
	steps := []struct {
		// doc says what the step shows.
		doc   string
		after time.Duration
		src   string
		cost  int
		want  string
	}{
		{doc: "a source's burst", src: "a", cost: 300},
		{doc: "is its own", src: "a", cost: 300, want: probeBudgetSource},
		{doc: "a refused probe charged nothing", src: "a", cost: 200},
		{doc: "another source has a share of its own", src: "b", cost: 500},
		{doc: "the node's budget is shared", src: "c", cost: 500, want: probeBudgetNode},
		{doc: "and c's whole share was given back", after: 5 * time.Second, src: "c", cost: 500},
		{doc: "a probe larger than a burst is never paid for", after: time.Hour, src: "d", cost: 501, want: probeBudgetSource},
		{doc: "shares refill at their rate", src: "a", cost: 500},
		{after: 10 * time.Second, src: "a", cost: 100},
		{src: "a", cost: 1, want: probeBudgetSource},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		if got := b.take(now, s.src, s.cost); got != s.want {
			t.Errorf("step %d (%s): %s pays %d: refused by %q, want %q", i, s.doc, s.src, s.cost, got, s.want)
		}
	}
}

// TestProbeBudgetUnbounded: a negative rate removes that bound.
func TestProbeBudgetUnbounded(t *testing.T) {
	now := time.Now()
	node := newProbeBudget(ProbeBudget{ObjectsPerSecond: -1, ObjectsPerSecondPerSource: 1, BurstPerSource: 100})
	source := newProbeBudget(ProbeBudget{ObjectsPerSecond: 1, Burst: 100, ObjectsPerSecondPerSource: -1})
	for i := range 10 {
		src := fmt.Sprint(i)
		if got := node.take(now, src, 100); got != "" {
			t.Errorf("no node bound, source %s: refused by %q", src, got)
		}
		if got := source.take(now, "a", 1); got != "" {
			t.Errorf("no source bound, probe %d: refused by %q", i, got)
		}
	}
	if got := source.take(now, "a", 91); got != probeBudgetNode {
		t.Errorf("past the node's burst: refused by %q, want %q", got, probeBudgetNode)
	}
}

// TestProbeBudgetSources: the sources kept are bounded; a source forgotten
// while its bucket was spent starts full, which the node's budget bounds.
func TestProbeBudgetSources(t *testing.T) {
	now := time.Now()
	b := newProbeBudget(ProbeBudget{ObjectsPerSecond: -1, ObjectsPerSecondPerSource: 1, BurstPerSource: 100})
	for i := range maxProbeSources {
		b.take(now, fmt.Sprint(i), 100)
	}
	now = now.Add(time.Second)
	if got := b.take(now, "0", 100); got != probeBudgetSource {
		t.Fatalf("a spent source: refused by %q, want %q", got, probeBudgetSource)
	}
	// Full, and no bucket full again: one of those seen longest ago goes.
	if got := b.take(now, "new", 100); got != "" {
		t.Errorf("a new source: refused by %q", got)
	}
	if n := len(b.sources); n != maxProbeSources {
		t.Errorf("%d sources kept, want %d", n, maxProbeSources)
	}
	if _, ok := b.sources["0"]; !ok {
		t.Errorf("the source seen last but one was dropped")
	}
	// Past the refill time every bucket is full again: all are dropped.
	now = now.Add(101 * time.Second)
	b.take(now, "later", 100)
	if n := len(b.sources); n != 1 {
		t.Errorf("%d sources kept after all refilled, want 1", n)
	}
}
