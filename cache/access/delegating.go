package access

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// Reasons a request is forwarded instead of answered from the cache.
const (
	ReasonImpersonation = "impersonation"
	ReasonNoToken       = "no-token"
	ReasonTokenRejected = "token-rejected"
	ReasonReviewError   = "review-error"
)

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
}

var _ Reviewer = (*Delegating)(nil)

// New returns a reviewer whose reviews are made with cfg, the agent's own
// client configuration.
func New(cfg *rest.Config, opts Options) (*Delegating, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	cfg = observed(cfg)
	authn, err := authenticationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the TokenReview client: %w", err)
	}
	authz, err := authorizationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the SubjectAccessReview client: %w", err)
	}
	m := NewMetrics()
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
		authn:   cache.New(tokenReviewer{webhook, m}, false, opts.TokenTTL, opts.TokenTTL),
		authz:   &dedupe{Authorizer: withTimeout{authorizer, opts.Timeout}, allowTTL: opts.AllowTTL, denyTTL: opts.DenyTTL},
		metrics: m,
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
	token, ok := bearerToken(r.Header)
	if !ok {
		return Result{Verdict: Forward, Reason: ReasonNoToken}
	}
	ctx := r.Context()

	d.metrics.lookup(reviewToken)
	resp, ok, err := d.authn.AuthenticateToken(ctx, token)
	switch {
	case err != nil:
		klog.FromContext(ctx).V(4).Info("Token review failed; forwarding", "err", err)
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	case !ok:
		return Result{Verdict: Forward, Reason: ReasonTokenRejected}
	}

	ctx = request.WithRequestInfo(request.WithUser(ctx, resp.User), info)
	attrs, err := filters.GetAuthorizerAttributes(ctx)
	if err != nil {
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	}
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
		return Result{Verdict: Allowed}
	case err != nil:
		// As kube-apiserver, which answers 500 when no authorizer allowed
		// and one failed; forwarding lets it decide.
		klog.FromContext(ctx).V(4).Info("Access review failed; forwarding", "err", err)
		return Result{Verdict: Forward, Reason: ReasonReviewError}
	default:
		return Result{Verdict: Denied, Err: responsewriters.ForbiddenStatusError(attrs, reason)}
	}
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

// bearerToken reads the token the way kube-apiserver's bearer token
// authenticator does: the first Authorization header, "Bearer <token>",
// scheme case-insensitive.
func bearerToken(h http.Header) (string, bool) {
	auth := strings.TrimSpace(h.Get("Authorization"))
	parts := strings.SplitN(auth, " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// tokenReviewer runs on token cache misses. It keeps the review's bodies
// out of the logs, counts the review, and turns "kube-apiserver answered:
// not authenticated" into a plain rejection (no error), so the token cache
// keeps it for the failure TTL and Review can tell it apart from a review
// call that failed (an error, never cached).
type tokenReviewer struct {
	webhook authenticator.Token
	metrics *Metrics
}

func (a tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	ctx, out := withOutcome(quiet(ctx))
	resp, ok, err := a.webhook.AuthenticateToken(ctx, token)
	switch {
	case ok:
		a.metrics.reviewed(reviewToken, "authenticated")
	case out.answered.Load():
		a.metrics.reviewed(reviewToken, "rejected")
		return nil, false, nil
	default:
		a.metrics.reviewed(reviewToken, "error")
	}
	return resp, ok, err
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
