package access

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// dedupe makes one review for concurrent identical authorizations. When a
// cached decision expires under load, every request in flight for it would
// otherwise miss the cache at once and send its own SubjectAccessReview.
//
// The shared call runs with the first caller's values but without its
// cancellation, so one caller going away does not fail the others; the
// authorizer below bounds its time.
//
// It also keeps each decision that a review sent to kube-apiserver made, for
// allowTTL or denyTTL from the moment the review started: no longer than the
// authorizer below caches the same answer, so the answer is the one it
// would give, without its per-call work (it keys its cache by the review
// serialized to JSON). Decisions the authorizer answered from its own cache
// are not kept, since their age is unknown.
type dedupe struct {
	authorizer.Authorizer
	group singleflight.Group
	// allowTTL and denyTTL are how long decisions are kept; zero keeps
	// none.
	allowTTL, denyTTL time.Duration
	// now is the clock; nil means time.Now.
	now func() time.Time
	// gate, if not nil, decides whether a review may be sent.
	gate *gate

	mu   sync.Mutex // protects the fields below
	kept map[string]keptDecision
	// inFlight counts the reviews being sent, by key: a caller that joins
	// one sends nothing and spends none of its share of the gate.
	inFlight map[string]int
	// keptBytes is the size of kept's keys.
	keptBytes int
}

type decisionResult struct {
	decision authorizer.Decision
	reason   string
}

type keptDecision struct {
	decisionResult
	expires time.Time
}

// maxKeptDecisions bounds the kept decisions; callers choose the keys
// (user, selectors), so past the bound the expired ones are dropped, and
// all of them if that is not enough.
const maxKeptDecisions = 4096

// maxKeptKey bounds the size of a kept decision's key (callers choose
// selectors as long as their request headers allow); longer ones are
// reviewed each time, as the authorizer does not cache them either.
const maxKeptKey = 16 << 10

// maxKeptBytes bounds the kept decisions' keys in total, as
// maxKeptDecisions bounds their number.
const maxKeptBytes = 4 << 20

// ConditionsAwareAuthorize goes through Authorize, so that its kept
// decisions and its gate hold for every caller (the embedded authorizer's
// would skip both).
func (d *dedupe) ConditionsAwareAuthorize(ctx context.Context, attrs authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(d.Authorize(ctx, attrs))
}

func (d *dedupe) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	key, err := decisionKey(attrs)
	if err != nil {
		return d.Authorizer.Authorize(ctx, attrs)
	}
	if res, ok := d.lookup(key); ok {
		return res.decision, res.reason, nil
	}
	// Only a review that is sent spends the caller's share: an informer
	// start-up storm asks the same question many times at once.
	gated := false
	if d.gate != nil && !d.joining(key) {
		if !d.gate.allow(ctx, reviewAccess, true) {
			return authorizer.DecisionNoOpinion, "", errThrottled
		}
		gated = true
	}
	v, err, _ := d.group.Do(key, func() (any, error) {
		if d.gate != nil && !gated && !d.gate.allow(ctx, reviewAccess, true) {
			// The review it meant to join had ended: this caller sends
			// one after all.
			return decisionResult{decision: authorizer.DecisionNoOpinion}, errThrottled
		}
		d.mu.Lock()
		if d.inFlight == nil {
			d.inFlight = map[string]int{}
		}
		d.inFlight[key]++
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			if d.inFlight[key]--; d.inFlight[key] <= 0 {
				delete(d.inFlight, key)
			}
			d.mu.Unlock()
		}()
		start := d.clock()
		out, _ := ctx.Value(outcomeKey{}).(*reviewOutcome)
		var before int32
		if out != nil {
			before = out.calls.Load()
		}
		decision, reason, err := d.Authorizer.Authorize(context.WithoutCancel(ctx), attrs)
		res := decisionResult{decision, reason}
		if err == nil && out != nil && out.calls.Load() > before && out.answered.Load() {
			d.keep(key, res, start)
		}
		return res, err
	})
	res := v.(decisionResult)
	return res.decision, res.reason, err
}

// joining reports whether a review of key is being sent now.
func (d *dedupe) joining(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inFlight[key] > 0
}

func (d *dedupe) clock() time.Time {
	if d.now != nil {
		return d.now()
	}
	return time.Now()
}

func (d *dedupe) lookup(key string) (decisionResult, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.kept[key]
	if !ok {
		return decisionResult{}, false
	}
	if !d.clock().Before(k.expires) {
		delete(d.kept, key)
		d.keptBytes -= len(key)
		return decisionResult{}, false
	}
	return k.decisionResult, true
}

// keep keeps res, reviewed from start on.
func (d *dedupe) keep(key string, res decisionResult, start time.Time) {
	ttl := d.denyTTL
	if res.decision == authorizer.DecisionAllow {
		ttl = d.allowTTL
	}
	if ttl <= 0 || len(key) > maxKeptKey {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kept == nil {
		d.kept = map[string]keptDecision{}
	}
	if len(d.kept) >= maxKeptDecisions || d.keptBytes+len(key) > maxKeptBytes {
		now := d.clock()
		for k, v := range d.kept {
			if !now.Before(v.expires) {
				delete(d.kept, k)
				d.keptBytes -= len(k)
			}
		}
		if len(d.kept) >= maxKeptDecisions || d.keptBytes+len(key) > maxKeptBytes {
			clear(d.kept)
			d.keptBytes = 0
		}
	}
	if _, ok := d.kept[key]; !ok {
		d.keptBytes += len(key)
	}
	d.kept[key] = keptDecision{res, start.Add(ttl)}
}

// decisionKey identifies an authorization by everything a
// SubjectAccessReview carries, so that two callers share a call only when
// their reviews would be identical. Every value is written with its
// length, so that no two different reviews have the same key.
func decisionKey(a authorizer.Attributes) (string, error) {
	var b strings.Builder
	b.Grow(256)
	str := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	strs := func(l []string) {
		b.WriteString(strconv.Itoa(len(l)))
		b.WriteByte('[')
		for _, s := range l {
			str(s)
		}
	}
	for _, s := range []string{a.GetVerb(), a.GetNamespace(), a.GetResource(), a.GetSubresource(),
		a.GetName(), a.GetAPIGroup(), a.GetAPIVersion(), a.GetPath()} {
		str(s)
	}
	if a.IsResourceRequest() {
		b.WriteByte('R')
	} else {
		b.WriteByte('N')
	}
	if u := a.GetUser(); u != nil {
		b.WriteByte('U')
		str(u.GetName())
		str(u.GetUID())
		strs(u.GetGroups())
		extra := u.GetExtra()
		keys := slices.Sorted(maps.Keys(extra))
		b.WriteString(strconv.Itoa(len(keys)))
		b.WriteByte('{')
		for _, k := range keys {
			str(k)
			strs(extra[k])
		}
	} else {
		b.WriteByte('-')
	}
	// The review carries the requirements even when parsing them failed,
	// so both go into the key.
	labelReqs, labelErr := a.GetLabelSelector()
	b.WriteString(strconv.Itoa(len(labelReqs)))
	b.WriteByte('L')
	for _, r := range labelReqs {
		str(r.Key())
		str(string(r.Operator()))
		strs(r.ValuesUnsorted())
	}
	if labelErr != nil {
		b.WriteByte('!')
	}
	fieldReqs, fieldErr := a.GetFieldSelector()
	b.WriteString(strconv.Itoa(len(fieldReqs)))
	b.WriteByte('F')
	for _, r := range fieldReqs {
		str(r.Field)
		str(string(r.Operator))
		str(r.Value)
	}
	if fieldErr != nil {
		b.WriteByte('!')
	}
	return b.String(), nil
}
