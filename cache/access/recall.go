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
	// decisions counts the kept allow decisions of every token.
	decisions int
}

// recalledToken is what kube-apiserver last said of one token.
type recalledToken struct {
	// authenticated is when a TokenReview last authenticated it (zero:
	// not seen by a review of this process); user is who it is.
	authenticated time.Time
	user          user.Info
	// expires is the token's own expiry (zero: it has none).
	expires time.Time
	// allowed holds when each request's attributes were last allowed.
	allowed map[string]recalledAllow
}

type recalledAllow struct {
	at     time.Time
	reason string
}

// maxRecalledDecisions bounds the kept allow decisions, and the kept
// tokens; callers choose the attributes (within MaxReviewBytes each), so
// past the bound the stale ones go, and all of them if that is not
// enough.
const maxRecalledDecisions = 16384

func newRecall(ttl time.Duration, now func() time.Time) *recall {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if now == nil {
		now = time.Now
	}
	return &recall{ttl: ttl, now: now, key: key, tokens: map[string]*recalledToken{}}
}

// tokenKey is the key of token: an HMAC, so that no token is held.
func (rc *recall) tokenKey(token string) string {
	m := hmac.New(sha256.New, rc.key)
	m.Write([]byte(token))
	return string(m.Sum(nil))
}

// authenticated records that a TokenReview made at at authenticated token.
func (rc *recall) authenticated(token string, at time.Time) {
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
	}
	t.expires = expires
}

// tokenLocked returns what is kept for the token of key k, made (pruning
// first if full) when there is nothing yet. rc.mu is held.
func (rc *recall) tokenLocked(k string) *recalledToken {
	t := rc.tokens[k]
	if t == nil {
		if len(rc.tokens) >= maxRecalledDecisions {
			rc.pruneLocked()
		}
		t = &recalledToken{allowed: map[string]recalledAllow{}}
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
		rc.decisions -= len(t.allowed)
		delete(rc.tokens, k)
	}
}

// allowed records that kube-apiserver allowed attrs (a key of the request
// attributes without the user) for token's user u, by a review made at
// sarAt. The decision is kept with the older of sarAt and the token's
// last authentication, tokenFloor when that is unknown (tokenFloor then stands in for it: the oldest answer the token
// cache may still serve).
func (rc *recall) allowed(token, attrs string, u user.Info, sarAt, tokenFloor time.Time, reason string) {
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
	if _, ok := t.allowed[attrs]; !ok {
		if rc.decisions >= maxRecalledDecisions {
			rc.pruneLocked()
		}
		rc.decisions++
	}
	// Each answer gives a lower bound of when kube-apiserver last made
	// the decision; the newest bound stands.
	if prev, ok := t.allowed[attrs]; ok && prev.at.After(at) {
		at = prev.at
	}
	t.allowed[attrs] = recalledAllow{at: at, reason: reason}
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
		if _, ok := t.allowed[attrs]; ok {
			delete(t.allowed, attrs)
			rc.decisions--
		}
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
	a, ok := t.allowed[attrs]
	switch {
	case !ok:
		return nil, "", time.Time{}, recallNoDecision
	case now.Sub(a.at) > rc.ttl:
		return nil, "", time.Time{}, recallStale
	}
	return t.user, a.reason, a.at, recallAllowed
}

// pruneLocked drops decisions older than the TTL, and everything if that
// frees nothing. rc.mu must be held.
func (rc *recall) pruneLocked() {
	now := rc.now()
	for k, t := range rc.tokens {
		for attrs, a := range t.allowed {
			if now.Sub(a.at) > rc.ttl {
				delete(t.allowed, attrs)
				rc.decisions--
			}
		}
		if len(t.allowed) == 0 && now.Sub(t.authenticated) > rc.ttl {
			delete(rc.tokens, k)
		}
	}
	if rc.decisions >= maxRecalledDecisions || len(rc.tokens) >= maxRecalledDecisions {
		clear(rc.tokens)
		rc.decisions = 0
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
