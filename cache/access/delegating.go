package access

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
)

// Reasons a request is forwarded instead of answered from the cache.
const (
	ReasonImpersonation = "impersonation"
	ReasonNoToken       = "no-token"
	ReasonTokenRejected = "token-rejected"
	ReasonReviewError   = "review-error"
	// ReasonThrottled: the caller's share of reviews (or the node's) is
	// used up for now; kube-apiserver decides instead.
	ReasonThrottled = "review-throttled"
	// ReasonTooLarge: the review would carry more than MaxReviewBytes of
	// caller-chosen attributes.
	ReasonTooLarge = "review-too-large"
)

// MaxReviewBytes bounds the attributes a caller chooses for a review that
// the cache may answer: namespace, name and the label and field
// selectors. Every decision is kept under its attributes (here and by
// k8s.io/apiserver's webhook authorizer, which keeps 8,192 of them
// whatever their size), so this bounds the memory a caller can make the
// agent hold through its decisions. Larger requests are forwarded.
const MaxReviewBytes = 1 << 10

// MaxTTL is the longest any decision may be reused: kube-apiserver's own
// delegated authentication and authorization defaults.
const MaxTTL = 10 * time.Second

// Options tune a Delegating reviewer. The zero value is the default.
type Options struct {
	// TokenTTL is how long a TokenReview answer (authenticated or
	// rejected) is reused for the same token. Default and maximum MaxTTL.
	TokenTTL time.Duration
	// AllowTTL and DenyTTL are how long a SubjectAccessReview answer is
	// reused for the same user and request attributes. Default and maximum
	// MaxTTL.
	AllowTTL time.Duration
	DenyTTL  time.Duration
	// Timeout bounds one review call to kube-apiserver. Default 5s.
	Timeout time.Duration
	// Gate bounds the reviews sent, per source and in total.
	Gate GateOptions
	// DegradedTTL is how long an allow decision kube-apiserver made may
	// stand in for it while Degraded reports true (recall.go); zero keeps
	// no decision and answers nothing in degraded mode.
	DegradedTTL time.Duration
	// Degraded, if set, reports whether the agent is in degraded mode:
	// every kube-apiserver is out of reach. Reviews are then not sent; a
	// recent allow decision for the same token and request answers.
	Degraded func() bool
	// Unreachable, if set, reports whether no kube-apiserver endpoint is
	// healthy while the agent decides whether to enter degraded mode. A
	// review sent then that fails without an answer is answered as in
	// degraded mode: the failed review itself is the evidence, so no
	// caller can bring recalled decisions into play by a flag alone.
	Unreachable func() bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (o *Options) complete() error {
	for _, d := range []*time.Duration{&o.TokenTTL, &o.AllowTTL, &o.DenyTTL} {
		switch {
		case *d == 0:
			*d = MaxTTL
		case *d < 0 || *d > MaxTTL:
			return fmt.Errorf("decision TTL %v must be positive and at most %v", *d, MaxTTL)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Timeout < 0 {
		return fmt.Errorf("review timeout %v must be positive", o.Timeout)
	}
	if o.DegradedTTL < 0 {
		return fmt.Errorf("degraded decision TTL %v must not be negative", o.DegradedTTL)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// reviewBackoff retries a failed review call once, briefly: a caller whose
// review cannot be made is forwarded, and kube-apiserver decides instead.
var reviewBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 2}

// Delegating asks kube-apiserver who the caller is (TokenReview) and whether
// it may make the request (SubjectAccessReview), through k8s.io/apiserver's
// webhook token authenticator and delegating authorizer, and reuses their
// answers for a short while:
//   - tokens are cached under an HMAC of the token (never the token itself),
//     authenticated and rejected alike;
//   - access decisions are cached under the whole review spec (user, UID,
//     groups, extra, verb, resource, subresource, namespace, name, API group
//     and version, label and field selectors), allowed and denied alike;
//     so no caller can be given a decision made for another.
//
// It calls the authenticator directly, not through the generic
// authentication filter, which would remove the Authorization header the
// forwarder still needs.
type Delegating struct {
	authn   authenticator.Token
	authz   authorizer.Authorizer
	metrics *Metrics
	// sources tells the token reviewer whose request a token came with.
	sources *tokenSources
	// recall keeps recent allow decisions for degraded mode; degraded
	// reports whether it is on (nil: never).
	recall                *recall
	degraded, unreachable func() bool
	// tokenTTL, allowTTL and timeout bound the age of an answer served
	// from a decision cache.
	tokenTTL, allowTTL, timeout time.Duration
	now                         func() time.Time
}

var _ Reviewer = (*Delegating)(nil)

// New returns a reviewer whose reviews are made with cfg, the agent's own
// client configuration.
func New(cfg *rest.Config, opts Options) (*Delegating, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	cfg = observed(cfg)
	// The gate bounds reviews without waiting; a client-side rate limiter
	// would make every caller queue behind the busiest one.
	cfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	authn, err := authenticationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the TokenReview client: %w", err)
	}
	authz, err := authorizationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the SubjectAccessReview client: %w", err)
	}
	m := NewMetrics()
	g := newGate(opts.Gate, m)
	srcs := &tokenSources{m: map[string]*tokenSource{}}
	webhook, err := webhooktoken.NewFromInterface(authn,
		nil, // no audiences: kube-apiserver checks its own, as for the request itself
		reviewBackoff, opts.Timeout,
		webhooktoken.AuthenticatorMetrics{
			RecordRequestTotal:   func(context.Context, string) {},
			RecordRequestLatency: func(context.Context, string, float64) {},
		})
	if err != nil {
		return nil, fmt.Errorf("creating the token authenticator: %w", err)
	}
	rc := newRecall(opts.DegradedTTL, opts.Now)
	backoff := reviewBackoff
	authorizer, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authz,
		AllowCacheTTL:             opts.AllowTTL,
		DenyCacheTTL:              opts.DenyTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("creating the authorizer: %w", err)
	}
	return &Delegating{
		authn:       cache.New(tokenReviewer{webhook: webhook, metrics: m, gate: g, sources: srcs, recall: rc, known: newKnownTokens(), now: opts.Now}, false, opts.TokenTTL, opts.TokenTTL),
		sources:     srcs,
		authz:       &dedupe{Authorizer: withTimeout{authorizer, opts.Timeout}, allowTTL: opts.AllowTTL, denyTTL: opts.DenyTTL, gate: g},
		metrics:     m,
		recall:      rc,
		degraded:    opts.Degraded,
		unreachable: opts.Unreachable,
		tokenTTL:    opts.TokenTTL,
		allowTTL:    opts.AllowTTL,
		timeout:     opts.Timeout,
		now:         opts.Now,
	}, nil
}

// Metrics returns the reviewer's metrics, to register where they are served.
func (d *Delegating) Metrics() *Metrics { return d.metrics }

// Review implements Reviewer.
func (d *Delegating) Review(r *http.Request, info *request.RequestInfo) Result {
	res := d.review(r, info)
	d.metrics.observe(res)
	return res
}

func (d *Delegating) review(r *http.Request, info *request.RequestInfo) Result {
	if info == nil {
		// Nothing to authorize: kube-apiserver must decide.
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	}
	if impersonates(r.Header) {
		return Result{Verdict: Forward, Reason: ReasonImpersonation}
	}
	token, ok := BearerToken(r.Header)
	if !ok {
		return Result{Verdict: Forward, Reason: ReasonNoToken}
	}
	if reviewSize(r, info) > MaxReviewBytes {
		return Result{Verdict: Forward, Reason: ReasonTooLarge}
	}
	ctx := withSource(r.Context(), r.RemoteAddr)
	if d.degraded != nil && d.degraded() {
		return d.reviewDegraded(ctx, info, token)
	}

	start := d.now()
	d.metrics.lookup(reviewToken)
	leave := d.sources.enter(token, sourceFrom(ctx))
	resp, ok, err := d.authn.AuthenticateToken(ctx, token)
	leave()
	switch {
	case errors.Is(err, errThrottled):
		return Result{Verdict: Forward, Reason: ReasonThrottled}
	case err != nil:
		if d.unreachable != nil && d.unreachable() {
			return d.reviewDegraded(ctx, info, token)
		}
		klog.FromContext(ctx).V(4).Info("Token review failed; forwarding", "err", err)
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	case !ok:
		d.recall.rejected(token)
		return Result{Verdict: Forward, Reason: ReasonTokenRejected}
	}

	anonymous, err := attributesKey(request.WithRequestInfo(ctx, info))
	if err != nil {
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	}
	ctx = request.WithRequestInfo(request.WithUser(ctx, resp.User), info)
	attrs, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	}
	sarStart := d.now()
	d.metrics.lookup(reviewAccess)
	ctx, out := withOutcome(ctx)
	decision, reason, err := d.authz.Authorize(ctx, attrs)
	if out.calls.Load() > 0 {
		switch {
		case decision == authorizer.DecisionAllow:
			d.metrics.reviewed(reviewAccess, "allowed")
		case err != nil:
			d.metrics.reviewed(reviewAccess, "error")
		default:
			d.metrics.reviewed(reviewAccess, "denied")
		}
	}
	switch {
	case decision == authorizer.DecisionAllow:
		// The decision is as old as the review that made it; one served
		// from a decision cache may be as old as that cache keeps it.
		sarAt := d.now().Add(-d.allowTTL - d.timeout)
		if out.calls.Load() > 0 && out.answered.Load() {
			sarAt = sarStart
		}
		d.recall.allowed(token, anonymous, sourceFrom(ctx), resp.User, sarAt, start.Add(-d.tokenTTL-d.timeout), reason)
		return Result{Verdict: Allowed, User: resp.User, AuthorizationReason: reason}
	case errors.Is(err, errThrottled):
		return Result{Verdict: Forward, Reason: ReasonThrottled}
	case err != nil:
		if d.unreachable != nil && d.unreachable() {
			return d.recalled(token, anonymous)
		}
		// As kube-apiserver, which answers 500 when no authorizer allowed
		// and one failed; forwarding lets it decide.
		klog.FromContext(ctx).V(4).Info("Access review failed; forwarding", "err", err)
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	default:
		d.recall.denied(token, anonymous)
		return Result{Verdict: Denied, Err: responsewriters.ForbiddenStatusError(attrs, reason), User: resp.User, AuthorizationReason: reason}
	}
}

// ReasonDegraded prefixes the reasons of requests degraded mode has no
// decision for: "degraded-no-decision", "degraded-stale",
// "degraded-token-expired".
const ReasonDegraded = "degraded-"

// reviewDegraded answers a review in degraded mode, without asking
// kube-apiserver: Allowed when it allowed the same token the same request
// within the degraded TTL and the token has not expired; otherwise
// Forward (the request then fails as kube-apiserver's absence makes it
// fail). It never denies: a denial is kube-apiserver's to make.
func (d *Delegating) reviewDegraded(ctx context.Context, info *request.RequestInfo, token string) Result {
	key, err := attributesKey(request.WithRequestInfo(ctx, info))
	if err != nil {
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	}
	return d.recalled(token, key)
}

// recalled answers from the allow decision kept for token and the
// attributes key (which names no user), as reviewDegraded does.
func (d *Delegating) recalled(token, key string) Result {
	u, reason, at, outcome := d.recall.lookup(token, key)
	d.metrics.degraded(outcome)
	if outcome != recallAllowed {
		return Result{Verdict: Forward, Reason: ReasonDegraded + outcome}
	}
	why := "degraded mode: allowed by kube-apiserver at " + at.UTC().Format(time.RFC3339)
	if reason != "" {
		why += ": " + reason
	}
	return Result{Verdict: Allowed, User: u, AuthorizationReason: why}
}

// attributesKey identifies the authorization attributes of ctx's request
// (which carries its RequestInfo and no user): with the token, what
// decides a SubjectAccessReview.
func attributesKey(ctx context.Context) (string, error) {
	attrs, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return "", err
	}
	return decisionKey(attrs)
}

// reviewSize is the size of the review attributes r's caller chose:
// namespace, name (which a list takes from a metadata.name field
// selector), and the raw label and field selectors (the parsed
// requirements the review also carries are no larger).
func reviewSize(r *http.Request, info *request.RequestInfo) int {
	q := r.URL.Query()
	n := len(info.Namespace) + len(info.Name)
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		for _, v := range q[k] {
			n += len(v)
		}
	}
	return n
}

// impersonates reports whether h asks to act as another user. Those
// requests go upstream, which authorizes the impersonation itself.
func impersonates(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") {
			return true
		}
	}
	return false
}

// BearerToken reads the token the way kube-apiserver's bearer token
// authenticator does: the first Authorization header, "Bearer <token>",
// scheme case-insensitive. It does not allocate: the rewriting reads it
// for every request once profiles exist.
func BearerToken(h http.Header) (string, bool) {
	auth := strings.TrimSpace(h.Get("Authorization"))
	scheme, rest, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token, _, _ := strings.Cut(rest, " ")
	if token == "" {
		return "", false
	}
	return token, true
}

// tokenReviewer runs on token cache misses. It keeps the review's bodies
// out of the logs, counts the review, and turns "kube-apiserver answered:
// not authenticated" into a plain rejection (no error), so the token cache
// keeps it for the failure TTL and Review can tell it apart from a review
// call that failed (an error, never cached).
type tokenReviewer struct {
	webhook authenticator.Token
	metrics *Metrics
	gate    *gate
	sources *tokenSources
	recall  *recall
	// known holds the tokens kube-apiserver authenticated before.
	known *knownTokens
	now   func() time.Time
}

func (a tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	// The token cache calls this with a context of its own, shared by
	// every caller of the same token; the source comes from the callers.
	if !a.gate.allow(context.WithValue(ctx, sourceKey{}, a.sources.source(token)), reviewToken, a.known.has(token)) {
		// An error, so the token cache keeps nothing.
		return nil, false, errThrottled
	}
	ctx, out := withOutcome(quiet(ctx))
	start := a.now()
	resp, ok, err := a.webhook.AuthenticateToken(ctx, token)
	switch {
	case ok:
		a.metrics.reviewed(reviewToken, "authenticated")
		a.recall.authenticated(token, resp.User, start)
		a.known.add(token, start)
	case out.answered.Load():
		a.metrics.reviewed(reviewToken, "rejected")
		a.recall.rejected(token)
		a.known.forget(token)
		return nil, false, nil
	default:
		a.metrics.reviewed(reviewToken, "error")
	}
	return resp, ok, err
}

// tokenSources maps the tokens being authenticated to the source of a
// request that carries them, while they are.
type tokenSources struct {
	mu sync.Mutex // protects the field below
	m  map[string]*tokenSource
}

type tokenSource struct {
	src   string
	users int
}

// enter records that a request from src is authenticating token, until
// the returned func is called.
func (t *tokenSources) enter(token, src string) func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[token]
	if e == nil {
		e = &tokenSource{}
		t.m[token] = e
	}
	e.src = src
	e.users++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if e.users--; e.users == 0 {
			delete(t.m, token)
		}
	}
}

// source returns the source of a request authenticating token.
func (t *tokenSources) source(token string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[token]; e != nil {
		return e.src
	}
	return ""
}

// withTimeout bounds each authorization, which the webhook authorizer does
// not do itself.
type withTimeout struct {
	authorizer.Authorizer
	timeout time.Duration
}

func (a withTimeout) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return a.Authorizer.Authorize(ctx, attrs)
}

// ConditionsAwareAuthorize goes through Authorize, so that the bound holds
// for every caller; the agent's reviews are SubjectAccessReviews, which
// carry no conditions.
func (a withTimeout) ConditionsAwareAuthorize(ctx context.Context, attrs authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, attrs))
}

// ErrThrottled is what Authenticate returns when the caller's share of
// token reviews is used up.
var ErrThrottled = errThrottled

// Authenticate tells who r's bearer token belongs to, with the same
// cached and gated TokenReviews as Review, and no access review. It
// returns nil and no error when r carries no bearer token or
// kube-apiserver does not authenticate the token: kube-apiserver then
// answers the request itself. ErrThrottled and review errors say that the
// caller could not be told now. Impersonation headers are not looked at:
// the user is the token's owner, whoever it asks to act as. In degraded
// mode the answer is who a review found the token to be within the
// degraded TTL, as for the cache's recalled decisions.
func (d *Delegating) Authenticate(r *http.Request) (user.Info, error) {
	token, ok := BearerToken(r.Header)
	if !ok {
		return nil, nil
	}
	if d.degraded != nil && d.degraded() {
		// kube-apiserver is unreachable: who the token was when it last
		// answered, within the degraded TTL, or nobody.
		if u, ok := d.recall.identity(token); ok {
			return u, nil
		}
		return nil, errUnknownInDegradedMode
	}
	ctx := withSource(r.Context(), r.RemoteAddr)
	d.metrics.lookup(reviewToken)
	leave := d.sources.enter(token, sourceFrom(ctx))
	resp, ok, err := d.authn.AuthenticateToken(ctx, token)
	leave()
	switch {
	case err != nil:
		if d.unreachable != nil && d.unreachable() {
			if u, ok := d.recall.identity(token); ok {
				return u, nil
			}
		}
		return nil, err
	case !ok:
		return nil, nil
	}
	return resp.User, nil
}

var errUnknownInDegradedMode = errors.New("kube-apiserver is unreachable and this token was not reviewed recently")
