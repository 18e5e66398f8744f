package access

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"time"
	"unique"

	"k8s.io/apiserver/pkg/authentication/user"
)

// Degraded mode (every kube-apiserver unreachable, through the agent and
// through kube-proxy alike) answers cached reads only to callers for whom
// kube-apiserver itself recently allowed the same request. recall keeps
// what that needs: for each token, when kube-apiserver last authenticated
// it and its user; for each token and request attributes, when
// kube-apiserver last allowed them. It invents nothing:
//
//   - Only allow decisions are kept. A denial or a rejected token that
//     kube-apiserver answers later removes what was kept, so the newest
//     answer always wins.
//   - A decision is kept with the time of the oldest answer it rests on
//     (the TokenReview or the SubjectAccessReview, whichever is older).
//     An answer served from a cache of unknown age counts as made as long
//     ago as that cache may keep it (its TTL plus the review timeout).
//     So a decision is used at most ttl after kube-apiserver last made
//     it: a RoleBinding removed at time R is honoured until R + ttl at
//     the latest.
//   - Only JSON Web Tokens are kept (ServiceAccount tokens, OIDC ID
//     tokens): their expiry is in the token, and a token past it is never
//     accepted. Opaque tokens (static token files, bootstrap tokens) may
//     expire in ways the agent cannot see, so they get no decision.
//
// Tokens are kept under an HMAC with a key of this process, never in the
// clear. recall is safe for concurrent use.
type recall struct {
	// ttl is how long a decision may be used after kube-apiserver made
	// it; zero keeps nothing.
	ttl time.Duration
	now func() time.Time
	key []byte // the HMAC key

	mu     sync.Mutex // protects the fields below
	tokens map[string]*recalledToken
	// decisions counts the kept allow decisions of every token;
	// bySource holds them by the source (client IP) whose request they
	// were made for.
	decisions int
	bySource  map[unique.Handle[string]]map[decisionRef]struct{}
}

// recalledToken is what kube-apiserver last said of one token.
type recalledToken struct {
	// authenticated is when a TokenReview last authenticated it (zero:
	// not seen by a review of this process); user is who it is.
	authenticated time.Time
	user          user.Info
	// expires is the token's own expiry (zero: it has none).
	expires time.Time
	// allowed holds when each request's attributes (by a hash of their
	// key) were last allowed.
	allowed map[attrsHash]recalledAllow
}

// attrsHash is a SHA-256 of a request's attributes key: 32 bytes kept per
// decision, whatever the size of the selectors.
type attrsHash [sha256.Size]byte

type recalledAllow struct {
	at     time.Time
	reason unique.Handle[string] // the same few reasons, kept once
	src    unique.Handle[string]
}

// decisionRef names one kept decision: its token's key and attributes.
type decisionRef struct {
	token string
	attrs attrsHash
}

// maxRecalledDecisions bounds the kept allow decisions, and the kept
// tokens; maxRecalledPerSource bounds those one source's requests made.
// Callers choose the attributes (within MaxReviewBytes each) and can hold
// many tokens of one user (T tokens and A selectors make T x A decisions
// for T + A reviews), so a source at its bound gives up its own oldest
// decision, and when all are full the source holding the most gives up
// its oldest: no source can evict the decisions of a source holding fewer.
// About 400 bytes each: under 7 MiB at the bound.
const (
	maxRecalledDecisions = 16384
	maxRecalledPerSource = 2048
)

func newRecall(ttl time.Duration, now func() time.Time) *recall {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if now == nil {
		now = time.Now
	}
	return &recall{ttl: ttl, now: now, key: key, tokens: map[string]*recalledToken{},
		bySource: map[unique.Handle[string]]map[decisionRef]struct{}{}}
}

// tokenKey is the key of token: an HMAC, so that no token is held.
func (rc *recall) tokenKey(token string) string {
	m := hmac.New(sha256.New, rc.key)
	m.Write([]byte(token))
	return string(m.Sum(nil))
}

// authenticated records that a TokenReview made at at authenticated
// token as u.
func (rc *recall) authenticated(token string, u user.Info, at time.Time) {
	if rc == nil || rc.ttl <= 0 {
		return
	}
	expires, ok := jwtExpiry(token)
	if !ok {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t := rc.tokenLocked(rc.tokenKey(token))
	if at.After(t.authenticated) {
		t.authenticated = at
		if u != nil {
			t.user = u
		}
	}
	t.expires = expires
}

// identity returns who token was when a TokenReview authenticated it
// within the TTL, if its own expiry has not passed: degraded mode's
// answer to "who is this caller", for the rewriting's selection.
func (rc *recall) identity(token string) (user.Info, bool) {
	if rc == nil || rc.ttl <= 0 {
		return nil, false
	}
	now := rc.now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t := rc.tokens[rc.tokenKey(token)]
	switch {
	case t == nil || t.user == nil || t.authenticated.IsZero():
		return nil, false
	case !t.expires.IsZero() && !now.Before(t.expires):
		return nil, false
	case now.Sub(t.authenticated) > rc.ttl:
		return nil, false
	}
	return t.user, true
}

// tokenLocked returns what is kept for the token of key k, made (pruning
// first if full) when there is nothing yet. rc.mu is held.
func (rc *recall) tokenLocked(k string) *recalledToken {
	t := rc.tokens[k]
	if t == nil {
		if len(rc.tokens) >= maxRecalledDecisions {
			rc.pruneTokensLocked()
		}
		t = &recalledToken{allowed: map[attrsHash]recalledAllow{}}
		rc.tokens[k] = t
	}
	return t
}

// rejected forgets everything kept for token: kube-apiserver no longer
// authenticates it.
func (rc *recall) rejected(token string) {
	if rc == nil || rc.ttl <= 0 {
		return
	}
	k := rc.tokenKey(token)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if t := rc.tokens[k]; t != nil {
		for h := range t.allowed {
			rc.dropLocked(k, t, h)
		}
		delete(rc.tokens, k)
	}
}

// allowed records that kube-apiserver allowed attrs (a key of the request
// attributes without the user) for token's user u, by a review made at
// sarAt for a request of src. The decision is kept with the older of
// sarAt and the token's last authentication, tokenFloor when that is
// unknown (tokenFloor then stands in for it: the oldest answer the token
// cache may still serve).
func (rc *recall) allowed(token, attrs, src string, u user.Info, sarAt, tokenFloor time.Time, reason string) {
	if rc == nil || rc.ttl <= 0 {
		return
	}
	expires, ok := jwtExpiry(token)
	if !ok {
		return
	}
	h := attrsHash(sha256.Sum256([]byte(attrs)))
	source := unique.Make(src)
	k := rc.tokenKey(token)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t := rc.tokenLocked(k)
	t.user, t.expires = u, expires
	at := sarAt
	authAt := t.authenticated
	if authAt.IsZero() {
		// Authenticated by a review this process did not see the start
		// of: as old as the token cache may keep an answer.
		authAt = tokenFloor
	}
	if authAt.Before(at) {
		at = authAt
	}
	prev, ok := t.allowed[h]
	if ok {
		// Each answer gives a lower bound of when kube-apiserver last
		// made the decision; the newest bound stands. The decision now
		// belongs to the source that asked last.
		if prev.at.After(at) {
			at = prev.at
		}
		rc.dropLocked(k, t, h)
	}
	rc.makeRoomLocked(source)
	t.allowed[h] = recalledAllow{at: at, reason: unique.Make(reason), src: source}
	refs := rc.bySource[source]
	if refs == nil {
		refs = map[decisionRef]struct{}{}
		rc.bySource[source] = refs
	}
	refs[decisionRef{token: k, attrs: h}] = struct{}{}
	rc.decisions++
}

// makeRoomLocked frees a place for a new decision of src: its own oldest
// when src is at its bound; when every place is taken, the stale ones,
// then the oldest of the source holding the most. rc.mu is held.
func (rc *recall) makeRoomLocked(src unique.Handle[string]) {
	if len(rc.bySource[src]) >= maxRecalledPerSource {
		rc.dropOldestLocked(src)
	}
	if rc.decisions < maxRecalledDecisions {
		return
	}
	rc.pruneStaleLocked()
	if rc.decisions < maxRecalledDecisions {
		return
	}
	var largest unique.Handle[string]
	n := -1
	for s, refs := range rc.bySource {
		if len(refs) > n {
			largest, n = s, len(refs)
		}
	}
	rc.dropOldestLocked(largest)
}

// dropOldestLocked drops the oldest decision of src. rc.mu is held.
func (rc *recall) dropOldestLocked(src unique.Handle[string]) {
	var oldest decisionRef
	var oldestAt time.Time
	found := false
	for ref := range rc.bySource[src] {
		a := rc.tokens[ref.token].allowed[ref.attrs]
		if !found || a.at.Before(oldestAt) {
			oldest, oldestAt, found = ref, a.at, true
		}
	}
	if found {
		rc.dropLocked(oldest.token, rc.tokens[oldest.token], oldest.attrs)
	}
}

// dropLocked forgets token k's decision h. rc.mu is held.
func (rc *recall) dropLocked(k string, t *recalledToken, h attrsHash) {
	a, ok := t.allowed[h]
	if !ok {
		return
	}
	delete(t.allowed, h)
	rc.decisions--
	if refs := rc.bySource[a.src]; refs != nil {
		delete(refs, decisionRef{token: k, attrs: h})
		if len(refs) == 0 {
			delete(rc.bySource, a.src)
		}
	}
}

// denied forgets token's allow decision for attrs: kube-apiserver's newest
// answer is no.
func (rc *recall) denied(token, attrs string) {
	if rc == nil || rc.ttl <= 0 {
		return
	}
	k := rc.tokenKey(token)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if t := rc.tokens[k]; t != nil {
		rc.dropLocked(k, t, sha256.Sum256([]byte(attrs)))
	}
}

// Outcomes of a degraded lookup, as metric labels.
const (
	recallAllowed      = "allowed"
	recallNoDecision   = "no-decision"
	recallStale        = "stale"
	recallTokenExpired = "token-expired"
)

// lookup returns the user and kube-apiserver's reason for an allow
// decision on token and attrs made within the TTL, and why there is none
// otherwise (one of the recall* outcomes).
func (rc *recall) lookup(token, attrs string) (user.Info, string, time.Time, string) {
	if rc == nil || rc.ttl <= 0 {
		return nil, "", time.Time{}, recallNoDecision
	}
	now := rc.now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	t := rc.tokens[rc.tokenKey(token)]
	if t == nil {
		return nil, "", time.Time{}, recallNoDecision
	}
	if !t.expires.IsZero() && !now.Before(t.expires) {
		return nil, "", time.Time{}, recallTokenExpired
	}
	a, ok := t.allowed[sha256.Sum256([]byte(attrs))]
	switch {
	case !ok:
		return nil, "", time.Time{}, recallNoDecision
	case now.Sub(a.at) > rc.ttl:
		return nil, "", time.Time{}, recallStale
	}
	return t.user, a.reason.Value(), a.at, recallAllowed
}

// pruneStaleLocked drops the decisions older than the TTL. rc.mu must be
// held.
func (rc *recall) pruneStaleLocked() {
	now := rc.now()
	for k, t := range rc.tokens {
		for h, a := range t.allowed {
			if now.Sub(a.at) > rc.ttl {
				rc.dropLocked(k, t, h)
			}
		}
	}
}

// pruneTokensLocked makes room for a token: it drops stale decisions and
// the tokens left without any whose authentication is older than the
// TTL, then, if that is not enough, every token without a decision (only
// its authentication time goes, and a decision made later counts the
// token as old as the token cache allows). rc.mu must be held.
func (rc *recall) pruneTokensLocked() {
	rc.pruneStaleLocked()
	now := rc.now()
	for k, t := range rc.tokens {
		if len(t.allowed) == 0 && now.Sub(t.authenticated) > rc.ttl {
			delete(rc.tokens, k)
		}
	}
	if len(rc.tokens) < maxRecalledDecisions {
		return
	}
	for k, t := range rc.tokens {
		if len(t.allowed) == 0 {
			delete(rc.tokens, k)
		}
	}
}

// jwtExpiry reads the expiry ("exp", seconds since the epoch) of a JSON
// Web Token without checking its signature, and reports whether token is
// a JWT at all. A JWT without exp has no expiry (legacy ServiceAccount
// token Secrets); the zero time says so. Only tokens kube-apiserver has
// authenticated byte for byte are looked at, so the claim is genuine.
func jwtExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, false
	}
	if claims.Exp == nil {
		return time.Time{}, true
	}
	f, err := claims.Exp.Float64()
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}
