package access

import (
	"context"
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// The webhook authenticator and authorizer send their reviews through the
// clients' RESTClient, so what the reviewer needs to see of each call (was
// one made, did kube-apiserver answer) is observed in the transport, tied to
// the lookup by a value in the request's context.

// outcomeKey carries a *reviewOutcome from a lookup down to the review
// calls it makes, if any.
type outcomeKey struct{}

// reviewOutcome is what the transport saw during one lookup.
type reviewOutcome struct {
	// calls counts reviews sent to kube-apiserver (retries included).
	calls atomic.Int32
	// answered: kube-apiserver answered the last review with a success
	// code, so its status (authenticated or not, allowed or not) is an
	// answer rather than a failure.
	answered atomic.Bool
}

func withOutcome(ctx context.Context) (context.Context, *reviewOutcome) {
	out := &reviewOutcome{}
	return context.WithValue(ctx, outcomeKey{}, out), out
}

// observed wraps the review clients' transport to record each call in the
// lookup's outcome.
func observed(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return observingTransport{rt} })
	return cfg
}

type observingTransport struct {
	next http.RoundTripper
}

func (t observingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	out, _ := req.Context().Value(outcomeKey{}).(*reviewOutcome)
	if out == nil {
		return t.next.RoundTrip(req)
	}
	out.calls.Add(1)
	resp, err := t.next.RoundTrip(req)
	out.answered.Store(err == nil && resp.StatusCode >= 200 && resp.StatusCode < 300)
	return resp, err
}

func (t observingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// quiet returns ctx with a logger that drops everything. client-go logs
// request and response bodies at high verbosity through the context's
// logger, and a TokenReview carries the caller's token both ways.
func quiet(ctx context.Context) context.Context {
	return klog.NewContext(ctx, klog.Background().WithSink(nil)) // a nil sink discards
}
