// Package webhookproxy is the webhook path of API rewriting: an HTTP
// handler that stands between kube-apiserver and an operator's admission
// and conversion webhook server. kube-apiserver sends the reviews of the
// renamed resources (group renamed.example.io, kind RenamedWidget); the
// webhook server knows only the original names (example.com, Widget). The
// handler restores the names of each AdmissionReview and ConversionReview
// it receives, forwards the review to the webhook server, and renames its
// answer back: objects, the base64 JSON patch, warnings and status.
//
// The rewriting is agent/rewrite's, with one profile. Every review is
// rewritten: the caller is kube-apiserver, not one of the profile's
// ServiceAccounts, so the profile's selector plays no part here.
//
// The handler forwards reviews only: any other method, media type or
// body is refused before the webhook server sees it. It copies no
// header of the caller's to the webhook server, nor of the webhook
// server's to the caller.
package webhookproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

const (
	// DefaultMaxBodyBytes bounds a review and the webhook server's answer
	// when Options leaves it unset: 8 MiB. kube-apiserver refuses request
	// bodies over 3 MiB (its --max-request-bytes default), but an update's
	// AdmissionReview carries two objects (object and oldObject), each of
	// them up to that size, re-encoded as JSON; 8 MiB holds both with 2 MiB
	// for the review around them. A ConversionReview of a list holds every
	// item to convert and may need more: raise the limit for such
	// resources.
	DefaultMaxBodyBytes int64 = 8 << 20
	// DefaultTimeout bounds each call to the webhook server when Options
	// leaves it unset: 30 seconds, the longest timeoutSeconds a webhook
	// configuration may give kube-apiserver. A shorter timeoutSeconds ends
	// the call earlier: kube-apiserver then closes the request, whose
	// context the call to the webhook server is bound to.
	DefaultTimeout = 30 * time.Second

	// maxErrorBodyBytes bounds the body of a webhook server's failure
	// that is passed on: kube-apiserver only puts it in an error message.
	maxErrorBodyBytes = 64 << 10
	// userAgent is the User-Agent of the calls to the webhook server.
	userAgent = "kube-apicache-webhook-proxy"
)

// Options configure a Proxy.
type Options struct {
	// Rewriter is the profile whose names are swapped: required.
	Rewriter *rewrite.Rewriter
	// Backend is the webhook server: scheme (http or https), host and
	// port, and optionally a path prefix that each request's path is
	// appended to. Required; it carries no user, query or fragment.
	Backend *url.URL
	// Transport carries the calls to the webhook server (its TLS
	// configuration is the caller's). Nil: a clone of
	// http.DefaultTransport that ignores the proxy environment variables,
	// as the webhook server is local or in the cluster.
	Transport http.RoundTripper
	// MaxBodyBytes bounds a review (larger ones are refused with 413) and
	// the webhook server's answer (larger ones give 502). Zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Timeout bounds each call to the webhook server (504 past it). Zero
	// means DefaultTimeout.
	Timeout time.Duration
	// Registry is where the proxy's metrics are registered; nil: none.
	Registry prometheus.Registerer
}

// Proxy is the webhook proxy's handler. It holds no state that changes
// but its metrics: one Proxy serves any number of requests at once.
type Proxy struct {
	rewriter *rewrite.Rewriter
	backend  *url.URL
	client   *http.Client
	maxBody  int64
	timeout  time.Duration
	metrics  *metrics // nil: no metrics
}

var _ http.Handler = (*Proxy)(nil)

// New checks o and builds the proxy. It registers the proxy's metrics in
// o.Registry, if any.
func New(o Options) (*Proxy, error) {
	if o.Rewriter == nil {
		return nil, errors.New("webhook proxy: no rewriter")
	}
	if o.Backend == nil {
		return nil, errors.New("webhook proxy: no backend URL")
	}
	if err := checkBackend(o.Backend); err != nil {
		return nil, fmt.Errorf("webhook proxy: backend %q: %w", o.Backend.Redacted(), err)
	}
	if o.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("webhook proxy: negative body limit %d", o.MaxBodyBytes)
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("webhook proxy: negative timeout %s", o.Timeout)
	}
	p := &Proxy{
		rewriter: o.Rewriter,
		backend:  o.Backend,
		maxBody:  o.MaxBodyBytes,
		timeout:  o.Timeout,
	}
	if p.maxBody == 0 {
		p.maxBody = DefaultMaxBodyBytes
	}
	if p.timeout == 0 {
		p.timeout = DefaultTimeout
	}
	transport := o.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		transport = t
	}
	p.client = &http.Client{
		Transport: transport,
		// A redirect is the webhook server's answer, passed on as a
		// failure like any other status but 200: the proxy forwards to
		// Backend and nowhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if o.Registry != nil {
		m, err := newMetrics(o.Registry)
		if err != nil {
			return nil, fmt.Errorf("webhook proxy: registering metrics: %w", err)
		}
		p.metrics = m
	}
	return p, nil
}

// ParseBackend parses and checks the webhook server's URL, as Options'
// Backend must be.
func ParseBackend(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if err := checkBackend(u); err != nil {
		return nil, err
	}
	return u, nil
}

// checkBackend checks the webhook server's URL.
func checkBackend(u *url.URL) error {
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return errors.New("the scheme must be https or http")
	case u.Host == "":
		return errors.New("no host")
	case u.User != nil:
		return errors.New("credentials in the URL are not supported")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return errors.New("no query or fragment allowed (each request's own query is forwarded)")
	}
	return nil
}

// The kind label of the metrics, and the kinds of review proxied.
const (
	kindAdmission  = "AdmissionReview"
	kindConversion = "ConversionReview"
	kindOther      = "other"
)

// reviewKind returns the kind of review obj is (kindAdmission or
// kindConversion), or kindOther.
func reviewKind(obj map[string]any) string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	switch {
	case kind == kindAdmission && (apiVersion == "admission.k8s.io/v1" || apiVersion == "admission.k8s.io/v1beta1"):
		return kindAdmission
	case kind == kindConversion && (apiVersion == "apiextensions.k8s.io/v1" || apiVersion == "apiextensions.k8s.io/v1beta1"):
		return kindConversion
	}
	return kindOther
}

// ServeHTTP proxies one review.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	kind, code := p.serve(w, r)
	p.metrics.observe(kind, code, time.Since(start))
}

// codeCallerGone is the code counted, never sent, for a request whose
// caller went away before the webhook server answered: nginx's 499
// (client closed request).
const codeCallerGone = 499

// serve proxies one review and returns its kind and the status code
// answered.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) (string, int) {
	logger := klog.FromContext(r.Context())
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return kindOther, fail(w, http.StatusMethodNotAllowed, "method %s is not allowed: only POST of an AdmissionReview or ConversionReview is", r.Method)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return kindOther, fail(w, http.StatusUnsupportedMediaType, "Content-Type %q is not supported: a review is application/json", clip(r.Header.Get("Content-Type")))
	}
	if r.ContentLength > p.maxBody {
		return kindOther, fail(w, http.StatusRequestEntityTooLarge, "the review is larger than %d bytes", p.maxBody)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return kindOther, fail(w, http.StatusRequestEntityTooLarge, "the review is larger than %d bytes", p.maxBody)
		}
		return kindOther, fail(w, http.StatusBadRequest, "reading the review: %v", err)
	}
	v, err := rewrite.Decode(data)
	if err != nil {
		return kindOther, fail(w, http.StatusBadRequest, "the body is not JSON: %v", err)
	}
	review, ok := v.(map[string]any)
	if !ok {
		return kindOther, fail(w, http.StatusBadRequest, "the body is not a JSON object: an AdmissionReview or ConversionReview is")
	}
	kind := reviewKind(review)
	if kind == kindOther {
		apiVersion, _ := review["apiVersion"].(string)
		k, _ := review["kind"].(string)
		return kindOther, fail(w, http.StatusBadRequest, "apiVersion %q kind %q is not a review: only AdmissionReview (admission.k8s.io/v1, v1beta1) and ConversionReview (apiextensions.k8s.io/v1, v1beta1) are proxied", clip(apiVersion), clip(k))
	}
	if _, ok := review["request"].(map[string]any); !ok {
		return kind, fail(w, http.StatusBadRequest, "the %s has no request", kind)
	}

	// Renamed to original: what the webhook server knows.
	p.rewriter.Object(review)
	target := patchTarget(review)
	out, err := rewrite.Encode(review)
	if err != nil {
		return kind, fail(w, http.StatusInternalServerError, "encoding the review: %v", err)
	}

	ctx, cancel := context.WithTimeout(r.Context(), p.timeout)
	defer cancel()
	breq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.backendURL(r.URL).String(), bytes.NewReader(out))
	if err != nil {
		return kind, fail(w, http.StatusInternalServerError, "building the webhook request: %v", err)
	}
	// A header set of the proxy's own: nothing of the caller's is copied,
	// so neither hop-by-hop headers nor an Authorization header
	// kube-apiserver may send (a webhook kubeconfig's credentials are for
	// this hop, the proxy, and the proxy checks none) reach the webhook
	// server; nor does its answer's, but its Content-Type, reach
	// kube-apiserver.
	breq.Header = http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/json"},
		"User-Agent":   {userAgent},
	}
	resp, err := p.client.Do(breq)
	if err != nil {
		return kind, p.backendFailure(ctx, w, r, err, "calling the webhook server")
	}
	defer func() { _ = resp.Body.Close() }()

	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || err != nil || mt != "application/json" {
		// Not a review: kube-apiserver takes it for the webhook's
		// failure, and says so with the status and the body.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
		logger.V(2).Info("Webhook server answered with a failure; passed on", "path", r.URL.Path, "kind", kind, "status", resp.StatusCode, "contentType", resp.Header.Get("Content-Type"), "body", clip(string(body)))
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return kind, resp.StatusCode
	}
	data, err = io.ReadAll(io.LimitReader(resp.Body, p.maxBody+1))
	if err != nil {
		return kind, p.backendFailure(ctx, w, r, err, "reading the webhook server's answer")
	}
	if int64(len(data)) > p.maxBody {
		logger.Error(nil, "Webhook server's answer is too large", "path", r.URL.Path, "kind", kind, "limit", p.maxBody)
		return kind, fail(w, http.StatusBadGateway, "the webhook server's answer is larger than %d bytes", p.maxBody)
	}
	answer, err := rewrite.Decode(data)
	m, ok := answer.(map[string]any)
	if err != nil || !ok {
		logger.Error(err, "Webhook server answered 200 with a body that is not a JSON object", "path", r.URL.Path, "kind", kind)
		return kind, fail(w, http.StatusBadGateway, "the webhook server answered 200 with a body that is not a JSON object")
	}

	// Original to renamed: what kube-apiserver knows.
	p.renameAnswer(m, target)
	out, err = rewrite.Encode(m)
	if err != nil {
		return kind, fail(w, http.StatusInternalServerError, "encoding the answer: %v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	return kind, http.StatusOK
}

// patchTarget returns what the rewriter needs of an AdmissionReview's
// request, as the webhook server sees it, to rewrite its answer's JSON
// patch as a patch of the request's kind: the request's kind and name.
// It returns nil for other reviews.
func patchTarget(review map[string]any) map[string]any {
	if reviewKind(review) != kindAdmission {
		return nil
	}
	req, _ := review["request"].(map[string]any)
	target := map[string]any{}
	if k, ok := req["kind"].(map[string]any); ok {
		// A copy: the review itself is encoded and sent.
		gvk := map[string]any{}
		for _, f := range []string{"group", "version", "kind"} {
			if s, ok := k[f].(string); ok {
				gvk[f] = s
			}
		}
		target["kind"] = gvk
	}
	if n, ok := req["name"].(string); ok {
		target["name"] = n
	}
	return target
}

// renameAnswer renames the webhook server's answer in place. A webhook
// server answers an AdmissionReview with its response alone, and the
// rewriter reads the patched kind from the review's request: the
// request's kind and name are lent to the answer for the rewrite, and
// taken out again, so that each patch value is rewritten as the value at
// its path in an object of that kind, not only at the places every
// object has.
func (p *Proxy) renameAnswer(answer, target map[string]any) {
	_, hasRequest := answer["request"]
	if target == nil || hasRequest || reviewKind(answer) != kindAdmission {
		p.rewriter.Object(answer)
		return
	}
	answer["request"] = target
	p.rewriter.Object(answer)
	delete(answer, "request")
}

// backendURL is the webhook server's URL for a request to u: Backend's
// scheme and host, Backend's path prefix followed by u's path, and u's
// query.
func (p *Proxy) backendURL(u *url.URL) *url.URL {
	out := *p.backend
	out.Path = strings.TrimSuffix(p.backend.Path, "/") + u.Path
	out.RawPath = ""
	if p.backend.RawPath != "" || u.RawPath != "" {
		out.RawPath = strings.TrimSuffix(p.backend.EscapedPath(), "/") + u.EscapedPath()
	}
	out.RawQuery = u.RawQuery
	return &out
}

// backendFailure answers a call to the webhook server that brought no
// answer: 504 past the timeout, 502 otherwise. A caller that went away
// gets nothing it would read, and is counted apart.
func (p *Proxy) backendFailure(ctx context.Context, w http.ResponseWriter, r *http.Request, err error, what string) int {
	logger := klog.FromContext(r.Context())
	switch {
	case r.Context().Err() != nil:
		logger.V(2).Info("Caller went away before the webhook server answered", "path", r.URL.Path, "err", err)
		return codeCallerGone
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		logger.Error(err, "Webhook server did not answer in time", "path", r.URL.Path, "timeout", p.timeout)
		return fail(w, http.StatusGatewayTimeout, "the webhook server did not answer within %s", p.timeout)
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			logger.Error(err, "Webhook server timed out", "path", r.URL.Path)
			return fail(w, http.StatusGatewayTimeout, "%s: %v", what, err)
		}
		logger.Error(err, "Webhook server is unreachable", "path", r.URL.Path)
		return fail(w, http.StatusBadGateway, "%s: %v", what, err)
	}
}

// fail answers code with a one-line plain-text message, and returns code.
func fail(w http.ResponseWriter, code int, format string, args ...any) int {
	msg := strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " ")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
	return code
}

// clip shortens what a caller sent to a length fit for a message or a
// log line.
func clip(s string) string {
	const limit = 200
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "... (" + strconv.Itoa(len(s)-limit) + " more bytes)"
}
