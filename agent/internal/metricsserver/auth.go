package metricsserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// The metrics listener authenticates callers with TokenReview and authorizes
// them with SubjectAccessReview, as kube-scheduler and kube-controller-manager
// do on their secure ports, and reuses the answers for a while. The cache
// lifetimes are sized for the fleet: 5,000 nodes scraped every 30 s by one
// Prometheus identity would cost kube-apiserver 167 TokenReviews and 167
// SubjectAccessReviews a second if nothing were reused. Reused for 2 minutes
// (tokens) and 5 minutes (allowed decisions), that becomes about 42
// TokenReviews and 17 SubjectAccessReviews a second across the fleet (twice
// that for a pair of Prometheus replicas), and one TokenReview every 2
// minutes plus one SubjectAccessReview every 5 per agent. A revoked scraper
// keeps reading metrics for at most that long, which metrics afford. Denied
// decisions are reused for 30 s only, so that a new RoleBinding takes effect
// soon. The kubelet's probes of the health paths cost nothing: they are
// anonymous, and anonymous callers are decided locally.
const (
	metricsTokenCacheTTL = 2 * time.Minute
	metricsAllowCacheTTL = 5 * time.Minute
	metricsDenyCacheTTL  = 30 * time.Second
	// metricsReviewTimeout bounds one review call.
	metricsReviewTimeout = 5 * time.Second
)

// A caller can make the agent send a TokenReview with every new token it
// makes up (tokens kube-apiserver rejects with an error are not cached), and
// with hostNetwork the metrics port is reachable from pods. So the reviews of
// tokens whose answer is not cached come from a token bucket: at most
// metricsReviewBurst at once and metricsReviewQPS a second per agent. Beyond
// it the request gets 429 and no review is sent; a token whose answer is
// cached (a scraper's) still passes. Every identity a review admits can in
// turn cost at most one SubjectAccessReview per served path and cache
// lifetime: only GET of a fixed set of paths reaches authorization, and
// anonymous callers never cause one.
//
// The bucket is small because it is per agent and a tenant can aim at every
// node at once: 0.2 reviews a second is 1,000 a second across 5,000 nodes
// at worst. A scraper does not depend on it: a token kube-apiserver
// authenticated skips the bucket for metricsTrustedTokenTTL (its review is
// still redone whenever the authenticator's cache has dropped it, under
// the client's own limit below), so a flood of made-up tokens cannot
// black out a scraper whose cached answer has just expired.
const (
	metricsReviewQPS   = 0.2
	metricsReviewBurst = 5
	// metricsTrustedTokenTTL is how long an authenticated token skips the
	// bucket after its last successful review.
	metricsTrustedTokenTTL = time.Hour
	// The backstop under everything: this listener's reviews, of any kind,
	// never exceed this rate.
	metricsReviewClientQPS   = 5
	metricsReviewClientBurst = 20
)

// metricsReviewBackoff makes one attempt per review: a failed review fails
// one scrape, which the next one retries, and every attempt is a review the
// token bucket must account for.
var metricsReviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Steps: 1}

// pprofProfiles are the profiles served below /debug/pprof/ with
// --profiling: the index and net/http/pprof's handlers, and the runtime's
// named profiles.
var pprofProfiles = map[string]bool{
	"": true, "cmdline": true, "profile": true, "symbol": true, "trace": true,
	"allocs": true, "block": true, "goroutine": true, "heap": true, "mutex": true, "threadcreate": true,
}

// metricsAuthMetrics count what the metrics listener refused and the
// reviews it sent.
type metricsAuthMetrics struct {
	refused *prometheus.CounterVec
	reviews *prometheus.CounterVec
}

func newMetricsAuthMetrics(reg prometheus.Registerer) *metricsAuthMetrics {
	m := &metricsAuthMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_metrics_refused_requests_total",
			Help: "Requests the metrics listener refused, by reason (unauthenticated, forbidden, throttled: too many new tokens to review, not-found, method-not-allowed).",
		}, []string{"reason"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_metrics_reviews_total",
			Help: "TokenReviews and SubjectAccessReviews the metrics listener sent to kube-apiserver, by kind.",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.refused, m.reviews)
	return m
}

// metricsAuth holds the metrics listener's authenticator and authorizer.
type metricsAuth struct {
	authn   authenticator.Request
	authz   authorizer.Authorizer
	metrics *metricsAuthMetrics
	// openPaths answer anyone, with no review.
	openPaths []string
	// securePaths are served beside /metrics to callers RBAC allows.
	securePaths []string
	// tokenHeader, if set, is a header that may carry the bearer token
	// (Config.TokenHeader).
	tokenHeader string
}

// newMetricsAuth builds the delegated authenticator and authorizer of the
// metrics listener. cfg is the component's own client configuration;
// openPaths answer anyone, anonymous callers included; reviews and
// refusals are counted in m.
func newMetricsAuth(cfg *rest.Config, openPaths []string, m *metricsAuthMetrics) (*metricsAuth, error) {
	return newMetricsAuthWith(cfg, openPaths, m, rate.NewLimiter(metricsReviewQPS, metricsReviewBurst))
}

// newMetricsAuthWith is newMetricsAuth with the token bucket given.
func newMetricsAuthWith(cfg *rest.Config, openPaths []string, m *metricsAuthMetrics, limiter *rate.Limiter) (*metricsAuth, error) {
	seen := &cachedTokens{ttl: metricsTokenCacheTTL - cachedTokensMargin, now: time.Now, entries: map[[sha256.Size]byte]time.Time{}}
	trusted := &cachedTokens{ttl: metricsTrustedTokenTTL, now: time.Now, entries: map[[sha256.Size]byte]time.Time{}}
	cfg = rest.CopyConfig(cfg)
	// A backstop under the token bucket: the reviews of this listener never
	// exceed this rate, whatever gets past the bucket.
	cfg.QPS, cfg.Burst = metricsReviewClientQPS, metricsReviewClientBurst
	// JSON, which reviewTransport reads.
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &reviewTransport{rt: rt, tokenReviews: m.reviews.WithLabelValues("tokenreview"), sars: m.reviews.WithLabelValues("subjectaccessreview"), cached: seen, trusted: trusted}
	})
	authnClient, err := authenticationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the metrics TokenReview client: %w", err)
	}
	authzClient, err := authorizationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the metrics SubjectAccessReview client: %w", err)
	}
	backoff := metricsReviewBackoff
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		// Anonymous callers become system:anonymous; authorization lets
		// them reach the health paths only.
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: true},
		TokenAccessReviewClient:  authnClient,
		TokenAccessReviewTimeout: metricsReviewTimeout,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 metricsTokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	delegated, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authzClient,
		AllowCacheTTL:             metricsAllowCacheTTL,
		DenyCacheTTL:              metricsDenyCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	health, err := path.NewAuthorizer(openPaths)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	authz, err := union.New(
		union.NamedAuthorizer{AuthorizerName: "health-paths", Authorizer: health},
		union.NamedAuthorizer{AuthorizerName: "deny-anonymous", Authorizer: denyAnonymous(openPaths)},
		union.NamedAuthorizer{AuthorizerName: "delegated", Authorizer: delegated},
	)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return &metricsAuth{
		authn:     &reviewGate{delegate: authn, limiter: limiter, cached: seen, trusted: trusted},
		authz:     authz,
		metrics:   m,
		openPaths: slices.Clone(openPaths),
	}, nil
}

// denyAnonymous refuses anonymous callers everything the open paths'
// authorizer did not allow, without asking kube-apiserver: metrics and
// profiles are never meant for anonymous readers, and deciding here keeps
// anonymous traffic from costing reviews.
func denyAnonymous(openPaths []string) authorizer.AuthorizerFunc {
	reason := "anonymous requests may read only " + strings.Join(openPaths, ", ")
	return func(_ context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
		if u := attrs.GetUser(); u == nil || u.GetName() == user.Anonymous {
			return authorizer.DecisionDeny, reason, nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	}
}

// errReviewThrottled is the message of the 429 a request gets when its
// token would need a review and the token bucket is empty.
var errReviewThrottled = errors.New("too many new tokens to review, retry later")

// reviewGate admits a request that carries a bearer token to the delegated
// authenticator only if the token's answer is cached or the token bucket
// has a review to spare; otherwise it marks the request throttled (see
// throttleMark) and reports it unauthenticated, without an error, so that
// nothing is logged per refused request.
type reviewGate struct {
	delegate authenticator.Request
	limiter  *rate.Limiter
	// cached are the tokens whose answer the authenticator holds; trusted
	// those kube-apiserver authenticated lately.
	cached, trusted *cachedTokens
}

func (g *reviewGate) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	if token, ok := bearerToken(r.Header); ok && !g.cached.has(token) && !g.trusted.has(token) && !g.limiter.Allow() {
		if mark, ok := r.Context().Value(throttleMarkKey{}).(*throttleMark); ok {
			mark.throttled = true
		}
		return nil, false, nil
	}
	return g.delegate.AuthenticateRequest(r)
}

// bearerToken returns the token the delegated bearer-token authenticator
// would review: the second space-separated field of the first Authorization
// header, after the case-insensitive word "bearer".
func bearerToken(h http.Header) (string, bool) {
	auth := strings.TrimSpace(h.Get("Authorization"))
	parts := strings.SplitN(auth, " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// throttleMark travels in a request's context from the metrics chain to
// the review gate, which sets it when it refuses the request a review.
type throttleMark struct{ throttled bool }

type throttleMarkKey struct{}

func withThrottleMark(ctx context.Context) (context.Context, *throttleMark) {
	m := &throttleMark{}
	return context.WithValue(ctx, throttleMarkKey{}, m), m
}

// cachedTokensMargin keeps a token's entry in cachedTokens shorter-lived
// than its answer in the authenticator's cache, so that a token found here
// is answered from that cache, not by a review.
const cachedTokensMargin = 5 * time.Second

// maxCachedTokens bounds cachedTokens. Entries come only from reviews, which
// the token bucket bounds to well under this within one lifetime.
const maxCachedTokens = 4096

// cachedTokens remembers, by SHA-256 (never the token itself), the tokens
// whose review answer the delegated authenticator caches: those
// kube-apiserver authenticated, or rejected without an error. A rejection
// with an error (what a made-up token gets) is not cached there, so not here
// either: every such request must pass the token bucket.
type cachedTokens struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex // protects the field below
	entries map[[sha256.Size]byte]time.Time
}

func (c *cachedTokens) has(token string) bool {
	key := sha256.Sum256([]byte(token))
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.entries[key]
	return ok && c.now().Before(exp)
}

func (c *cachedTokens) add(token string) {
	key := sha256.Sum256([]byte(token))
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxCachedTokens {
		for k, exp := range c.entries {
			if !now.Before(exp) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= maxCachedTokens {
			// Full of live entries: the token is simply reviewed through
			// the bucket again next time.
			return
		}
	}
	c.entries[key] = now.Add(c.ttl)
}

// reviewTransport counts the reviews the metrics listener sends and
// records the tokens whose answers the delegated authenticator caches. It
// sees the reviews as HTTP: k8s.io/apiserver's webhooks call the typed
// clients' REST clients directly.
type reviewTransport struct {
	rt                 http.RoundTripper
	tokenReviews, sars prometheus.Counter
	cached, trusted    *cachedTokens
}

func (t *reviewTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(req.URL.Path, "/subjectaccessreviews"):
		t.sars.Inc()
		return t.rt.RoundTrip(req)
	case !strings.HasSuffix(req.URL.Path, "/tokenreviews"):
		return t.rt.RoundTrip(req)
	}
	t.tokenReviews.Inc()
	if req.Body == nil || req.Body == http.NoBody {
		return t.rt.RoundTrip(req)
	}
	reqBody, err := io.ReadAll(io.LimitReader(req.Body, maxReviewBody))
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(reqBody))
	out.ContentLength = int64(len(reqBody))
	resp, err := t.rt.RoundTrip(out)
	if err != nil || resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return resp, err
	}
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxReviewBody))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if err != nil {
		return resp, nil
	}
	var sent, got authenticationv1.TokenReview
	if json.Unmarshal(reqBody, &sent) == nil && json.Unmarshal(respBody, &got) == nil &&
		sent.Spec.Token != "" && (got.Status.Authenticated || got.Status.Error == "") {
		t.cached.add(sent.Spec.Token)
		if got.Status.Authenticated {
			t.trusted.add(sent.Spec.Token)
		}
	}
	return resp, nil
}

// maxReviewBody bounds what reviewTransport reads of a review; a
// TokenReview carries a token and the user's groups and extras.
const maxReviewBody = 1 << 20
