package access

import (
	"context"
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
