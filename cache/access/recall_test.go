package access

import (
	"encoding/base64"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
)

// fakeJWT returns a token shaped like a JWT whose payload carries exp (no
// exp claim when exp is zero). Its signature is not checked here; the fake
// apiserver authenticates it by its bytes.
func fakeJWT(sub string, exp time.Time) string {
	payload := fmt.Sprintf(`{"sub":%q}`, sub)
	if !exp.IsZero() {
		payload = fmt.Sprintf(`{"sub":%q,"exp":%d}`, sub, exp.Unix())
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + ".c2ln"
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// degradedSetup is a reviewer with a fake clock and a degraded switch.
type degradedSetup struct {
	f        *fakeAPIServer
	d        *Delegating
	clock    *fakeClock
	degraded atomic.Bool
}

func newDegradedSetup(t *testing.T, ttl time.Duration) *degradedSetup {
	t.Helper()
	s := &degradedSetup{f: newFakeAPIServer(t), clock: &fakeClock{t: time.Now()}}
	s.d = newReviewer(t, s.f, Options{DegradedTTL: ttl, Degraded: s.degraded.Load, Now: s.clock.Now})
	return s
}

func (s *degradedSetup) review(t *testing.T, path, token string) Result {
	t.Helper()
	r, info := newRequest(t, path, bearer(token))
	return s.d.Review(r, info)
}

// TestDegradedReviews: in degraded mode, a read is allowed only with a
// recent allow decision kube-apiserver made for the same token and the
// same request attributes; nothing else is ever allowed, and nothing is
// denied.
func TestDegradedReviews(t *testing.T) {
	const ttl = 5 * time.Minute
	const pods = "/api/v1/namespaces/ns1/pods"
	for _, tc := range []struct {
		name string
		// given runs with kube-apiserver up, then degraded mode starts
		// after wait; want is the verdict and reason of reading path
		// with token.
		given      func(t *testing.T, s *degradedSetup, token string)
		wait       time.Duration
		path       string
		token      func(s *degradedSetup) string
		wantAllow  bool
		wantReason string
	}{{
		// A caller allowed the same list a minute ago is answered.
		name:      "recent allow",
		given:     func(t *testing.T, s *degradedSetup, token string) { s.review(t, pods, token) },
		wait:      time.Minute,
		path:      pods,
		wantAllow: true,
	}, {
		// An allow older than the TTL is not used.
		name:       "stale allow",
		given:      func(t *testing.T, s *degradedSetup, token string) { s.review(t, pods, token) },
		wait:       ttl + time.Second,
		path:       pods,
		wantReason: ReasonDegraded + recallStale,
	}, {
		// An allow for other attributes (another namespace, a selector)
		// is not used: no decision is stretched to a request it was not
		// made for.
		name:       "other attributes",
		given:      func(t *testing.T, s *degradedSetup, token string) { s.review(t, pods, token) },
		path:       pods + "?labelSelector=app%3Dweb",
		wantReason: ReasonDegraded + recallNoDecision,
	}, {
		// A token never reviewed gets nothing.
		name:       "new token",
		given:      func(t *testing.T, s *degradedSetup, token string) {},
		path:       pods,
		wantReason: ReasonDegraded + recallNoDecision,
	}, {
		// A denial kube-apiserver made after the allow wins: the allow
		// is forgotten.
		name: "denied after allow",
		given: func(t *testing.T, s *degradedSetup, token string) {
			s.review(t, pods, token)
			s.f.setPolicy(nil)
			s.clock.Step(MaxTTL + time.Second)
		},
		path:       pods,
		wantReason: ReasonDegraded + recallNoDecision,
	}, {
		// A token whose own expiry passed is never accepted, however
		// recent its allow.
		name:  "expired token",
		given: func(t *testing.T, s *degradedSetup, token string) { s.review(t, pods, token) },
		wait:  2 * time.Minute,
		token: func(s *degradedSetup) string {
			return fakeJWT("alice", s.clock.Now().Add(time.Minute))
		},
		path:       pods,
		wantReason: ReasonDegraded + recallTokenExpired,
	}, {
		// An opaque token's expiry cannot be seen: it gets no decision.
		name:       "opaque token",
		given:      func(t *testing.T, s *degradedSetup, token string) { s.review(t, pods, token) },
		token:      func(*degradedSetup) string { return "opaque-token" },
		path:       pods,
		wantReason: ReasonDegraded + recallNoDecision,
	}, {
		// A token kube-apiserver rejected after the allow is forgotten.
		name: "token rejected after allow",
		given: func(t *testing.T, s *degradedSetup, token string) {
			s.review(t, pods, token)
			s.f.mu.Lock()
			delete(s.f.tokens, token)
			s.f.mu.Unlock()
			s.d.recall.rejected(token) // as the token review would, once its cache expired
		},
		path:       pods,
		wantReason: ReasonDegraded + recallNoDecision,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newDegradedSetup(t, ttl)
			token := fakeJWT("alice", s.clock.Now().Add(time.Hour))
			if tc.token != nil {
				token = tc.token(s)
			}
			s.f.tokens[token] = alice
			s.f.policy = func(spec authorizationv1.SubjectAccessReviewSpec) (bool, string) {
				return spec.User == "alice" && spec.ResourceAttributes != nil && spec.ResourceAttributes.LabelSelector == nil, "RBAC: allowed by RoleBinding"
			}
			if tc.name == "denied after allow" {
				// The denial must reach kube-apiserver, past the
				// reviewer's own short-lived caches.
				s.d = newReviewer(t, s.f, Options{DegradedTTL: ttl, Degraded: s.degraded.Load, Now: s.clock.Now, AllowTTL: time.Millisecond, TokenTTL: time.Millisecond})
			}
			tc.given(t, s, token)
			if tc.name == "denied after allow" {
				time.Sleep(5 * time.Millisecond) // the caches run on real time
				if got := s.review(t, pods, token); got.Verdict != Denied {
					t.Fatalf("live review after revocation: %v %q, want Denied", got.Verdict, got.Reason)
				}
			}
			s.clock.Step(tc.wait)
			s.degraded.Store(true)
			before, _ := s.f.counts()
			got := s.review(t, tc.path, token)
			if after, _ := s.f.counts(); after != before {
				t.Errorf("degraded mode sent %d token reviews", after-before)
			}
			if allowed := got.Verdict == Allowed; allowed != tc.wantAllow || got.Reason != tc.wantReason {
				t.Fatalf("got %v %q, want allowed=%t %q", got.Verdict, got.Reason, tc.wantAllow, tc.wantReason)
			}
			if got.Verdict == Denied {
				t.Fatalf("degraded mode denied: a denial is kube-apiserver's to make")
			}
			if tc.wantAllow && (got.User == nil || got.User.GetName() != "alice") {
				t.Errorf("allowed as %v, want alice", got.User)
			}
		})
	}
}

// TestDegradedRevocationBound: a decision is used at most the TTL after
// kube-apiserver made it, however often the caller read meanwhile from
// the reviewer's short-lived caches (an allow answered from a cache
// counts as made as long ago as the cache may keep it, so it never makes
// the decision younger).
func TestDegradedRevocationBound(t *testing.T) {
	const ttl = time.Minute
	s := newDegradedSetup(t, ttl)
	token := fakeJWT("alice", time.Time{})
	s.f.tokens[token] = alice
	s.f.policy = allowUser("alice")
	const path = "/api/v1/namespaces/ns1/services"
	// Given one review sent at T0 and reads answered from the caches
	// afterwards,
	s.review(t, path, token)
	for range 3 {
		s.clock.Step(time.Second)
		if got := s.review(t, path, token); got.Verdict != Allowed {
			t.Fatalf("live read: %v %q", got.Verdict, got.Reason)
		}
	}
	if _, access := s.f.counts(); access != 1 {
		t.Fatalf("%d access reviews, want 1 (the rest from the caches)", access)
	}
	s.degraded.Store(true)
	// when degraded mode starts, the decision holds until T0+TTL (the
	// answers from the caches, which may be older, do not make it
	// younger), never later.
	s.clock.Step(ttl - 3*time.Second)
	if got := s.review(t, path, token); got.Verdict != Allowed {
		t.Fatalf("at T0+TTL: %v %q", got.Verdict, got.Reason)
	}
	s.clock.Step(time.Millisecond)
	if got := s.review(t, path, token); got.Verdict == Allowed {
		t.Fatalf("used past T0+TTL")
	}
	// A JWT without exp (a legacy ServiceAccount token) has no expiry to
	// pass; the decision's age alone bounds it.
	if got := s.review(t, path, token); got.Reason != ReasonDegraded+recallStale {
		t.Errorf("reason %q, want %q", got.Reason, ReasonDegraded+recallStale)
	}
}

// TestDegradedOff: with a zero TTL nothing is kept, and degraded mode
// answers nothing.
func TestDegradedOff(t *testing.T) {
	s := newDegradedSetup(t, 0)
	token := fakeJWT("alice", time.Time{})
	s.f.tokens[token] = alice
	s.f.policy = allowUser("alice")
	s.review(t, "/api/v1/pods", token)
	s.degraded.Store(true)
	if got := s.review(t, "/api/v1/pods", token); got.Verdict == Allowed {
		t.Fatalf("allowed with degraded mode off")
	}
	if n := len(s.d.recall.tokens); n != 0 {
		t.Errorf("%d tokens kept with a zero TTL", n)
	}
}

func TestJWTExpiry(t *testing.T) {
	exp := time.Unix(1900000000, 0)
	for _, tc := range []struct {
		token   string
		want    time.Time
		wantJWT bool
	}{
		{fakeJWT("a", exp), exp, true},
		{fakeJWT("a", time.Time{}), time.Time{}, true},
		{"opaque", time.Time{}, false},
		{"a.b.c", time.Time{}, false},
		{"abcdef.0123456789abcdef", time.Time{}, false}, // bootstrap token
	} {
		got, ok := jwtExpiry(tc.token)
		if ok != tc.wantJWT || !got.Equal(tc.want) {
			t.Errorf("jwtExpiry(%q) = %v, %t; want %v, %t", tc.token, got, ok, tc.want, tc.wantJWT)
		}
	}
}

// TestUnreachableNeedsAFailedReview: while the agent only suspects that
// kube-apiserver is gone (no endpoint healthy, degraded mode not entered),
// reviews are still sent, and kube-apiserver's answer stands: a revoked
// caller is refused however recent its allow. Only a review that fails
// without an answer is answered from the recalled decision.
func TestUnreachableNeedsAFailedReview(t *testing.T) {
	const pods = "/api/v1/namespaces/ns1/pods"
	s := &degradedSetup{f: newFakeAPIServer(t), clock: &fakeClock{t: time.Now()}}
	var unreachable atomic.Bool
	s.d = newReviewer(t, s.f, Options{DegradedTTL: 5 * time.Minute, Degraded: s.degraded.Load,
		Unreachable: unreachable.Load, Now: s.clock.Now, AllowTTL: time.Millisecond, DenyTTL: time.Millisecond, TokenTTL: time.Millisecond})
	token := fakeJWT("alice", s.clock.Now().Add(time.Hour))
	s.f.tokens[token] = alice
	s.f.setPolicy(allowUser("alice"))
	if res := s.review(t, pods, token); res.Verdict != Allowed {
		t.Fatalf("first review: %+v, want allowed", res)
	}
	// Revoked, then the endpoints look unhealthy: kube-apiserver still
	// answers the review, and its denial stands.
	s.f.setPolicy(nil)
	unreachable.Store(true)
	time.Sleep(5 * time.Millisecond) // past the decision caches' TTL
	_, before := s.f.counts()
	if res := s.review(t, pods, token); res.Verdict != Denied {
		t.Errorf("revoked caller while endpoints look unhealthy: %v (%s), want denied by kube-apiserver", res.Verdict, res.Reason)
	}
	if _, after := s.f.counts(); after != before+1 {
		t.Errorf("%d access reviews sent, want 1", after-before)
	}
	// Allowed again; then the review itself fails: the recalled allow answers.
	s.f.setPolicy(allowUser("alice"))
	time.Sleep(5 * time.Millisecond)
	if res := s.review(t, pods, token); res.Verdict != Allowed {
		t.Fatalf("review: %+v, want allowed", res)
	}
	s.f.mu.Lock()
	s.f.failAccess = true
	s.f.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	res := s.review(t, pods, token)
	if res.Verdict != Allowed || !strings.HasPrefix(res.AuthorizationReason, "degraded mode:") {
		t.Errorf("failed review while unreachable: %v (%s, %q), want allowed from the recalled decision", res.Verdict, res.Reason, res.AuthorizationReason)
	}
	unreachable.Store(false)
	time.Sleep(5 * time.Millisecond)
	if res := s.review(t, pods, token); res.Verdict != Forward || res.Reason != ReasonReviewError {
		t.Errorf("failed review with healthy endpoints: %v (%s), want forwarded", res.Verdict, res.Reason)
	}
}

// TestRecallEvictsPerSource: a tenant on ten pods fills the recalled
// decisions with many tokens and selectors (T tokens x A selectors are T x
// A decisions). Each of its sources gives up its own oldest decisions,
// and when everything is full the largest source gives up its oldest: a
// victim's decision stays. The heap the full table takes is measured.
func TestRecallEvictsPerSource(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	rc := newRecall(5*time.Minute, clock.Now)
	exp := clock.Now().Add(time.Hour)
	victim := fakeJWT("victim", exp)
	const victimAttrs = "list pods in ns1"
	rc.allowed(victim, victimAttrs, "10.0.0.7", nil, clock.Now(), clock.Now(), "RBAC: allowed")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Attributes keys as large as a review may carry (MaxReviewBytes).
	selector := strings.Repeat("x", MaxReviewBytes-64)
	const sources, tokens, selectors = 10, 20, 100
	for s := range sources {
		for tok := range tokens {
			token := fakeJWT(fmt.Sprintf("tenant-%d-%d", s, tok), exp)
			for a := range selectors {
				clock.Step(time.Millisecond)
				rc.allowed(token, fmt.Sprintf("%d %s", a, selector), fmt.Sprintf("10.0.1.%d", s), nil,
					clock.Now(), clock.Now(), `RBAC: allowed by RoleBinding "edit/tenant" of ClusterRole "edit" to ServiceAccount "default/tenant"`)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	rc.mu.Lock()
	kept, perSource := rc.decisions, 0
	for _, refs := range rc.bySource {
		perSource = max(perSource, len(refs))
	}
	rc.mu.Unlock()
	heap := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
	t.Logf("%d decisions offered from %d sources: %d kept, at most %d per source, heap +%.1f MiB",
		sources*tokens*selectors, sources, kept, perSource, heap)
	if _, _, _, outcome := rc.lookup(victim, victimAttrs); outcome != recallAllowed {
		t.Errorf("victim's decision: %s, want it kept", outcome)
	}
	if kept > maxRecalledDecisions || perSource > maxRecalledPerSource {
		t.Errorf("%d decisions kept (%d for one source), want at most %d (%d)", kept, perSource, maxRecalledDecisions, maxRecalledPerSource)
	}
	if heap > 8 {
		t.Errorf("the full table takes %.1f MiB of heap, want at most 8", heap)
	}
	// The newest decisions of each source are the ones kept.
	last := fakeJWT(fmt.Sprintf("tenant-%d-%d", sources-1, tokens-1), exp)
	if _, _, _, outcome := rc.lookup(last, fmt.Sprintf("%d %s", selectors-1, selector)); outcome != recallAllowed {
		t.Errorf("a source's newest decision: %s, want kept", outcome)
	}
}

// TestDegradedAuthenticate: in degraded mode, Authenticate answers who a
// review found the token to be within the TTL, without asking
// kube-apiserver, and nobody for a token never reviewed, one reviewed
// too long ago, or one past its expiry.
func TestDegradedAuthenticate(t *testing.T) {
	const ttl = 5 * time.Minute
	s := newDegradedSetup(t, ttl)
	token := fakeJWT("alice", s.clock.Now().Add(10*time.Minute))
	s.f.tokens[token] = alice
	authenticate := func(tok string) (string, error) {
		r, _ := newRequest(t, "/apis/example.com/v1/widgets", bearer(tok))
		u, err := s.d.Authenticate(r)
		if u == nil {
			return "", err
		}
		return u.GetName(), err
	}
	if name, err := authenticate(token); err != nil || name != "alice" {
		t.Fatalf("live: %q %v", name, err)
	}
	s.degraded.Store(true)
	before, _ := s.f.counts()
	s.clock.Step(time.Minute)
	if name, err := authenticate(token); err != nil || name != "alice" {
		t.Errorf("degraded, reviewed a minute ago: %q %v", name, err)
	}
	if name, err := authenticate(fakeJWT("bob", s.clock.Now().Add(time.Hour))); err == nil || name != "" {
		t.Errorf("degraded, never reviewed: %q %v; want an error", name, err)
	}
	s.clock.Step(ttl)
	if name, err := authenticate(token); err == nil || name != "" {
		t.Errorf("degraded, reviewed past the TTL: %q %v; want an error", name, err)
	}
	if after, _ := s.f.counts(); after != before {
		t.Errorf("degraded mode sent %d token reviews", after-before)
	}
}
