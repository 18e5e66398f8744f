package access

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// blockingAuthorizer counts its calls and answers only when released.
type blockingAuthorizer struct {
	calls   atomic.Int32
	release chan struct{}
}

func (b *blockingAuthorizer) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	b.calls.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
		return authorizer.DecisionNoOpinion, "", ctx.Err()
	}
	if a.GetUser().GetName() == "alice" {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "not alice", nil
}

func attrsFor(name string) authorizer.Attributes {
	return authorizer.AttributesRecord{User: &user.DefaultInfo{Name: name, Groups: []string{"system:authenticated"}},
		Verb: "list", Namespace: "ns1", Resource: "pods", APIVersion: "v1", ResourceRequest: true}
}

// TestDedupeSharesConcurrentReviews: concurrent identical authorizations
// make one review, and its answer reaches every caller, even when the
// caller whose call is shared goes away; different reviews are not shared.
func TestDedupeSharesConcurrentReviews(t *testing.T) {
	b := &blockingAuthorizer{release: make(chan struct{})}
	d := &dedupe{Authorizer: b}

	firstCtx, cancelFirst := context.WithCancel(context.Background())
	type answer struct {
		decision authorizer.Decision
		err      error
	}
	answers := make(chan answer, 30)
	var wg sync.WaitGroup
	wg.Go(func() {
		dec, _, err := d.Authorize(firstCtx, attrsFor("alice"))
		answers <- answer{dec, err}
	})
	waitFor(t, func() bool { return b.calls.Load() == 1 })
	for range 20 {
		wg.Go(func() {
			dec, _, err := d.Authorize(context.Background(), attrsFor("alice"))
			answers <- answer{dec, err}
		})
	}
	bob := make(chan authorizer.Decision, 1)
	wg.Go(func() {
		dec, _, _ := d.Authorize(context.Background(), attrsFor("bob"))
		bob <- dec
	})
	waitFor(t, func() bool { return b.calls.Load() == 2 })
	time.Sleep(50 * time.Millisecond) // let the other alice callers join
	cancelFirst()
	close(b.release)
	wg.Wait()
	close(answers)

	if got := b.calls.Load(); got != 2 {
		t.Errorf("%d reviews, want 2 (one for alice's 21 callers, one for bob)", got)
	}
	n := 0
	for a := range answers {
		n++
		if a.err != nil || a.decision != authorizer.DecisionAllow {
			t.Errorf("alice caller got %v, %v; want allowed", a.decision, a.err)
		}
	}
	if n != 21 {
		t.Errorf("%d alice answers, want 21", n)
	}
	if got := <-bob; got != authorizer.DecisionDeny {
		t.Errorf("bob got %v, want his own decision (deny)", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDecisionKey: reviews that differ in anything a SubjectAccessReview
// carries have different keys.
func TestDecisionKey(t *testing.T) {
	base := attrsFor("alice").(authorizer.AttributesRecord)
	key := func(a authorizer.AttributesRecord) string {
		k, err := decisionKey(a)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	variants := map[string]func(*authorizer.AttributesRecord){
		"user": func(a *authorizer.AttributesRecord) { a.User = &user.DefaultInfo{Name: "bob"} },
		"uid":  func(a *authorizer.AttributesRecord) { a.User = &user.DefaultInfo{Name: "alice", UID: "x"} },
		"groups": func(a *authorizer.AttributesRecord) {
			a.User = &user.DefaultInfo{Name: "alice", Groups: []string{"admins"}}
		},
		"extra": func(a *authorizer.AttributesRecord) {
			a.User = &user.DefaultInfo{Name: "alice", Extra: map[string][]string{"k": {"v"}}}
		},
		"verb":        func(a *authorizer.AttributesRecord) { a.Verb = "get" },
		"namespace":   func(a *authorizer.AttributesRecord) { a.Namespace = "ns2" },
		"name":        func(a *authorizer.AttributesRecord) { a.Name = "p1" },
		"subresource": func(a *authorizer.AttributesRecord) { a.Subresource = "status" },
		"group":       func(a *authorizer.AttributesRecord) { a.APIGroup = "apps" },
		"label selector": func(a *authorizer.AttributesRecord) {
			r, _ := labels.NewRequirement("app", selection.Equals, []string{"web"})
			a.LabelSelectorRequirements = labels.Requirements{*r}
		},
		"field selector": func(a *authorizer.AttributesRecord) {
			a.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "n1"}}
		},
	}
	seen := map[string]string{key(base): "base"}
	for name, edit := range variants {
		a := base
		edit(&a)
		k := key(a)
		if other, dup := seen[k]; dup {
			t.Errorf("%s shares a key with %s", name, other)
		}
		seen[k] = name
	}
}

// reviewingAuthorizer answers as kube-apiserver would, allowing only
// alice, and records a review in the caller's outcome, as the review
// clients' transport does, unless cached is set (an answer from the
// authorizer's own cache).
type reviewingAuthorizer struct {
	calls  atomic.Int32
	cached atomic.Bool
	fail   atomic.Bool
}

func (r *reviewingAuthorizer) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	r.calls.Add(1)
	if out, _ := ctx.Value(outcomeKey{}).(*reviewOutcome); out != nil && !r.cached.Load() {
		out.calls.Add(1)
		out.answered.Store(!r.fail.Load())
	}
	if r.fail.Load() {
		return authorizer.DecisionNoOpinion, "", context.DeadlineExceeded
	}
	if a.GetUser().GetName() == "alice" {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "not alice", nil
}

// TestDedupeKeepsReviewedDecisions: a decision that a review made is
// reused, for its caller's key only, until its TTL from the start of the
// review has passed; answers the authorizer took from its own cache and
// failed reviews are not kept.
func TestDedupeKeepsReviewedDecisions(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &reviewingAuthorizer{}
	d := &dedupe{Authorizer: r, allowTTL: 10 * time.Second, denyTTL: 5 * time.Second, now: func() time.Time { return now }}
	authorize := func(name string) authorizer.Decision {
		t.Helper()
		ctx, _ := withOutcome(context.Background())
		dec, _, _ := d.Authorize(ctx, attrsFor(name))
		return dec
	}

	// Given alice allowed and bob denied by a review each,
	if authorize("alice") != authorizer.DecisionAllow || authorize("bob") != authorizer.DecisionNoOpinion || r.calls.Load() != 2 {
		t.Fatalf("first decisions: %d reviews, want 2", r.calls.Load())
	}
	// then both are reused within their TTLs, each for its own user,
	now = now.Add(4 * time.Second)
	if authorize("alice") != authorizer.DecisionAllow || authorize("bob") != authorizer.DecisionNoOpinion || r.calls.Load() != 2 {
		t.Errorf("within the TTLs: %d reviews, want the 2 decisions reused", r.calls.Load())
	}
	// the denial is reviewed again once the deny TTL has passed,
	now = now.Add(time.Second) // 5s after the reviews
	if authorize("bob") != authorizer.DecisionNoOpinion || r.calls.Load() != 3 {
		t.Errorf("at the deny TTL: %d reviews, want 3", r.calls.Load())
	}
	now = now.Add(4 * time.Second) // 9s
	if authorize("alice") != authorizer.DecisionAllow || r.calls.Load() != 3 {
		t.Errorf("within the allow TTL: %d reviews, want 3", r.calls.Load())
	}
	// and the allow once its TTL has passed.
	now = now.Add(time.Second) // 10s
	if authorize("alice") != authorizer.DecisionAllow || r.calls.Load() != 4 {
		t.Errorf("at the allow TTL: %d reviews, want 4", r.calls.Load())
	}

	// An answer from the authorizer's own cache is not kept: its age is
	// unknown.
	r.cached.Store(true)
	if authorize("carol"); authorize("carol") != authorizer.DecisionNoOpinion || r.calls.Load() != 6 {
		t.Errorf("answers from the authorizer's cache: %d calls, want 6 (none kept)", r.calls.Load())
	}
	// Nor is a failed review.
	r.cached.Store(false)
	r.fail.Store(true)
	if authorize("dave"); authorize("dave") != authorizer.DecisionNoOpinion || r.calls.Load() != 8 {
		t.Errorf("failed reviews: %d calls, want 8 (none kept)", r.calls.Load())
	}
}

// TestKeptDecisionsBounded: callers choose the keys, so the kept decisions
// stay bounded.
func TestKeptDecisionsBounded(t *testing.T) {
	d := &dedupe{allowTTL: 10 * time.Second, denyTTL: 10 * time.Second}
	for i := range 3 * maxKeptDecisions {
		d.keep(fmt.Sprint(i), decisionResult{decision: authorizer.DecisionAllow}, time.Now())
	}
	if n := len(d.kept); n > maxKeptDecisions {
		t.Errorf("%d kept decisions, want at most %d", n, maxKeptDecisions)
	}
	if _, ok := d.lookup(fmt.Sprint(3*maxKeptDecisions - 1)); !ok {
		t.Errorf("the latest decision is not kept")
	}
	// A key longer than the bound is not kept at all.
	long := strings.Repeat("x", maxKeptKey+1)
	d.keep(long, decisionResult{decision: authorizer.DecisionAllow}, time.Now())
	if _, ok := d.lookup(long); ok {
		t.Errorf("a %d-byte key was kept", len(long))
	}
	// An expired decision is dropped when looked up.
	d.keep("old", decisionResult{decision: authorizer.DecisionAllow}, time.Now().Add(-time.Minute))
	if _, ok := d.lookup("old"); ok {
		t.Errorf("an expired decision was answered")
	}
	if _, ok := d.kept["old"]; ok {
		t.Errorf("an expired decision was looked up and kept")
	}

	// Large keys are bounded in bytes, well before their number.
	d = &dedupe{allowTTL: 10 * time.Second, denyTTL: 10 * time.Second}
	for i := range 2000 {
		d.keep(fmt.Sprintf("%d-%s", i, strings.Repeat("x", maxKeptKey-10)), decisionResult{decision: authorizer.DecisionAllow}, time.Now())
		total := 0
		for k := range d.kept {
			total += len(k)
		}
		if total != d.keptBytes || total > maxKeptBytes {
			t.Fatalf("after %d keys: %d bytes kept (counted %d), want at most %d", i+1, total, d.keptBytes, maxKeptBytes)
		}
	}
}

// TestDecisionKeyBoundaries: values that run together when concatenated
// still give different keys.
func TestDecisionKeyBoundaries(t *testing.T) {
	with := func(edit func(*authorizer.AttributesRecord)) string {
		a := attrsFor("alice").(authorizer.AttributesRecord)
		edit(&a)
		k, err := decisionKey(a)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	pairs := map[string][2]func(*authorizer.AttributesRecord){
		"groups split differently": {
			func(a *authorizer.AttributesRecord) {
				a.User = &user.DefaultInfo{Name: "alice", Groups: []string{"a", "b"}}
			},
			func(a *authorizer.AttributesRecord) {
				a.User = &user.DefaultInfo{Name: "alice", Groups: []string{"ab"}}
			},
		},
		"extra key and value": {
			func(a *authorizer.AttributesRecord) {
				a.User = &user.DefaultInfo{Name: "alice", Extra: map[string][]string{"k": {"v"}}}
			},
			func(a *authorizer.AttributesRecord) {
				a.User = &user.DefaultInfo{Name: "alice", Extra: map[string][]string{"kv": nil}}
			},
		},
		"namespace and name": {
			func(a *authorizer.AttributesRecord) { a.Namespace, a.Name = "ab", "" },
			func(a *authorizer.AttributesRecord) { a.Namespace, a.Name = "a", "b" },
		},
		"user name and uid": {
			func(a *authorizer.AttributesRecord) { a.User = &user.DefaultInfo{Name: "alice1", UID: "2"} },
			func(a *authorizer.AttributesRecord) { a.User = &user.DefaultInfo{Name: "alice", UID: "12"} },
		},
		"no user and an empty user": {
			func(a *authorizer.AttributesRecord) { a.User = nil },
			func(a *authorizer.AttributesRecord) { a.User = &user.DefaultInfo{} },
		},
		// The review sends requirements even alongside a parse error.
		"field requirements with a parse error": {
			func(a *authorizer.AttributesRecord) {
				a.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "node-a"}}
				a.FieldSelectorParsingErr = errors.New("bad")
			},
			func(a *authorizer.AttributesRecord) {
				a.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "node-b"}}
				a.FieldSelectorParsingErr = errors.New("bad")
			},
		},
		"label requirements with a parse error": {
			func(a *authorizer.AttributesRecord) {
				r, _ := labels.NewRequirement("app", selection.In, []string{"a", "b"})
				a.LabelSelectorRequirements, a.LabelSelectorParsingErr = labels.Requirements{*r}, errors.New("bad")
			},
			func(a *authorizer.AttributesRecord) {
				r, _ := labels.NewRequirement("app", selection.In, []string{"a"})
				a.LabelSelectorRequirements, a.LabelSelectorParsingErr = labels.Requirements{*r}, errors.New("bad")
			},
		},
		"requirements with and without a parse error": {
			func(a *authorizer.AttributesRecord) {
				a.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "node-a"}}
			},
			func(a *authorizer.AttributesRecord) {
				a.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "node-a"}}
				a.FieldSelectorParsingErr = errors.New("bad")
			},
		},
	}
	for name, p := range pairs {
		if with(p[0]) == with(p[1]) {
			t.Errorf("%s: same key", name)
		}
	}
	// The same review gives the same key, whatever the order of extra.
	extra := func(a *authorizer.AttributesRecord) {
		a.User = &user.DefaultInfo{Name: "alice", Extra: map[string][]string{"a": {"1"}, "b": {"2"}, "c": {"3"}}}
	}
	if with(extra) != with(extra) {
		t.Errorf("the same review has two keys")
	}
}

// TestDedupeJoinersSpendNoShare: callers that join a review in flight
// spend none of their source's share of the gate; only the review sent
// does. Given a source allowed one review, 30 identical concurrent
// authorizations all get the decision.
func TestDedupeJoinersSpendNoShare(t *testing.T) {
	b := &blockingAuthorizer{release: make(chan struct{})}
	g := newGate(GateOptions{QPS: 100, Burst: 100, SourceQPS: 0.001, SourceBurst: 1}, NewMetrics())
	d := &dedupe{Authorizer: b, gate: g}
	ctx := withSource(context.Background(), "10.0.0.1:1234")
	errs := make(chan error, 30)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _, err := d.Authorize(ctx, attrsFor("alice"))
		errs <- err
	})
	waitFor(t, func() bool { return b.calls.Load() == 1 })
	for range 29 {
		wg.Go(func() {
			_, _, err := d.Authorize(ctx, attrsFor("alice"))
			errs <- err
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(b.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a caller got %v", err)
		}
	}
	if got := b.calls.Load(); got != 1 {
		t.Errorf("%d reviews, want 1", got)
	}
	// A new review of another question is over the source's share.
	if _, _, err := d.Authorize(ctx, attrsFor("bob")); !errors.Is(err, errThrottled) {
		t.Errorf("a second review: %v, want throttled", err)
	}
}

func (b *blockingAuthorizer) ConditionsAwareAuthorize(ctx context.Context, a authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(b.Authorize(ctx, a))
}

func (b *blockingAuthorizer) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

func (r *reviewingAuthorizer) ConditionsAwareAuthorize(ctx context.Context, a authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(r.Authorize(ctx, a))
}

func (r *reviewingAuthorizer) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}
