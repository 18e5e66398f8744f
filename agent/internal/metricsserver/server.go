package metricsserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/internal/keypair"
)

// Config is what a metrics listener is built from.
type Config struct {
	// Name goes into a self-signed certificate: the node's name for the
	// agent, the pod's for the approver.
	Name string
	// TLSCertFile and TLSKeyFile are the serving certificate, reloaded as
	// they change; empty means a self-signed certificate made at start.
	TLSCertFile, TLSKeyFile string
	// OpenPaths are served to anyone, anonymous callers included, with no
	// review: the health paths the kubelet probes without credentials.
	// Every other path the handler serves needs a token RBAC allows to
	// get it.
	OpenPaths []string
	// SecurePaths are served, beside /metrics, to callers RBAC allows to
	// get them (a SubjectAccessReview of the non-resource URL).
	SecurePaths []string
	// Profiling serves /debug/pprof/ to callers allowed to read it.
	Profiling bool
	// TokenHeader, if set, names a request header that carries a bearer
	// token when the Authorization header cannot: kube-apiserver's pods
	// proxy removes the Authorization header once it has authenticated
	// its own caller, and passes other headers on. A token found there is
	// reviewed exactly as one sent in Authorization, which wins when both
	// are present; the header never reaches the handler.
	TokenHeader string
	// RESTConfig is the configuration of the component's own client,
	// which sends the TokenReviews and SubjectAccessReviews.
	RESTConfig *rest.Config
}

// Server is a metrics listener's HTTPS server and what it needs at run
// time.
type Server struct {
	cfg     Config
	handler http.Handler
	// files is the certificate from TLSCertFile and TLSKeyFile, reloaded
	// as they change; nil means a self-signed certificate made at start.
	files *dynamiccertificates.DynamicCertKeyPairContent
}

// New builds the listener's handler chain in front of paths, which serves
// /metrics, the OpenPaths, the SecurePaths and, with Profiling, /debug/pprof/, and checks no
// credentials itself. It loads the certificate files, if any, and
// registers the listener's own metrics in reg.
func New(cfg Config, paths http.Handler, reg prometheus.Registerer) (*Server, error) {
	auth, err := newMetricsAuth(cfg.RESTConfig, cfg.OpenPaths, newMetricsAuthMetrics(reg))
	if err != nil {
		return nil, err
	}
	auth.securePaths, auth.tokenHeader = slices.Clone(cfg.SecurePaths), cfg.TokenHeader
	s := &Server{cfg: cfg, handler: auth.secure(paths, cfg.Profiling)}
	if cfg.TLSCertFile != "" {
		if s.files, err = dynamiccertificates.NewDynamicServingContentFromFiles("metrics-serving-cert", cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			return nil, fmt.Errorf("loading the metrics serving certificate: %w", err)
		}
	}
	return s, nil
}

// Handler is the listener's handler chain, for tests that send it
// requests without TLS.
func (s *Server) Handler() http.Handler { return s.handler }

// secure wraps h, the metrics listener's paths, in the filters every request
// passes, outermost first:
//
//  1. refusals are counted by reason;
//  2. only GET of a served path goes on (405 or 404 otherwise), so that no
//     caller can make up paths or verbs for reviews to decide;
//  3. the open paths are served at once, to anyone, with no review;
//  4. request info, authentication (401, or 429 when a new token finds the
//     token bucket empty) and authorization (403), as kube-apiserver's own
//     filters do them.
func (auth *metricsAuth) secure(h http.Handler, profiling bool) http.Handler {
	open := h
	codecs := scheme.Codecs.WithoutConversion()
	unauthorized := filters.Unauthorized(codecs)
	failed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mark, ok := r.Context().Value(throttleMarkKey{}).(*throttleMark); ok && mark.throttled {
			apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests(errReviewThrottled.Error(), 1))
			return
		}
		unauthorized.ServeHTTP(w, r)
	})
	h = filters.WithAuthorization(h, auth.authz, codecs)
	h = filters.WithAuthentication(h, auth.authn, failed, nil, nil)
	h = filters.WithRequestInfo(h, &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")})
	authed := h
	gated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case !auth.served(r.URL.Path, profiling):
			apihttp.WriteStatus(w, r, metricsStatus(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("%q is not served here", r.URL.Path)))
			return
		case r.Method != http.MethodGet:
			w.Header().Set("Allow", http.MethodGet)
			apihttp.WriteStatus(w, r, metricsStatus(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, fmt.Sprintf("method %q is not allowed; only GET is", r.Method)))
			return
		case slices.Contains(auth.openPaths, r.URL.Path):
			// Open to anyone: served before authentication, so that a
			// token sent with a probe costs no review.
			open.ServeHTTP(w, r)
			return
		}
		// The bearer token is the one credential this listener reviews:
		// a token offered as a WebSocket subprotocol would bypass the
		// review gate.
		r.Header.Del("Sec-WebSocket-Protocol")
		if auth.tokenHeader != "" {
			moveToken(r.Header, auth.tokenHeader)
		}
		ctx, _ := withThrottleMark(r.Context())
		authed.ServeHTTP(w, r.WithContext(ctx))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &apihttp.StatusRecorder{ResponseWriter: w}
		gated.ServeHTTP(rec, r)
		if reason, ok := refusalReasons[rec.Code()]; ok {
			auth.metrics.refused.WithLabelValues(reason).Inc()
		}
	})
}

// moveToken takes the token in header name, if any, out of h and into
// its Authorization header, unless that already holds one.
func moveToken(h http.Header, name string) {
	token := strings.TrimSpace(h.Get(name))
	h.Del(name)
	if token != "" && h.Get("Authorization") == "" {
		h.Set("Authorization", "Bearer "+token)
	}
}

// metricsStatus is a failure Status of the metrics listener's own.
func metricsStatus(code int32, reason metav1.StatusReason, msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg,
	}}
}

// refusalReasons are the reason labels of the refused-requests counter.
var refusalReasons = map[int]string{
	http.StatusUnauthorized:     "unauthenticated",
	http.StatusForbidden:        "forbidden",
	http.StatusTooManyRequests:  "throttled",
	http.StatusNotFound:         "not-found",
	http.StatusMethodNotAllowed: "method-not-allowed",
}

// served says whether the metrics listener serves p.
func (auth *metricsAuth) served(p string, profiling bool) bool {
	if p == "/metrics" || slices.Contains(auth.openPaths, p) || slices.Contains(auth.securePaths, p) {
		return true
	}
	name, ok := strings.CutPrefix(p, "/debug/pprof/")
	return ok && profiling && pprofProfiles[name]
}

// Start serves on l until the returned server is closed or serving
// fails, which it reports on errs. ctx bounds the reloading of the
// certificate files; the caller closes the server (at the end of its
// shutdown, so that probes are answered until then).
func (s *Server) Start(ctx context.Context, l net.Listener, errs chan<- error) (*http.Server, error) {
	var cert keypair.Content
	if s.files != nil {
		go s.files.Run(ctx, 1)
		cert = s.files
	} else {
		certPEM, keyPEM, err := selfSignedMetricsCert(l.Addr(), s.cfg.Name)
		if err != nil {
			return nil, err
		}
		if cert, err = dynamiccertificates.NewStaticCertKeyContent("metrics-self-signed", certPEM, keyPEM); err != nil {
			return nil, err
		}
	}
	pairs := keypair.NewCached(cert)
	if _, err := pairs.Get(); err != nil {
		return nil, fmt.Errorf("metrics serving certificate: %w", err)
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Any pod can reach this port: no connection outlives a scrape
		// interval idle, and no request (GETs without bodies) may take
		// long to arrive. Writes get long enough for a 30-second CPU
		// profile, which only loopback callers can ask for.
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 2 * time.Minute,
		IdleTimeout:  60 * time.Second,
		// A scrape or a probe sends a few hundred bytes of headers; a
		// service account token is under 2 KiB.
		MaxHeaderBytes: 64 << 10,
		// Handshake errors of junk connections at V(4), not per
		// connection at the usual -v=2.
		ErrorLog: apihttp.ServerErrorLogAt(klog.FromContext(ctx), 4),
	}
	tlsConfig := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pairs.Get() },
		// HTTP/1.1 only: scrapers and probes need nothing more, and
		// HTTP/2's stream handling is more surface for no gain here.
		NextProtos: []string{"http/1.1"},
	}
	go func() { errs <- srv.Serve(tls.NewListener(l, tlsConfig)) }()
	return srv, nil
}

// certKeyContent is the part of k8s.io/apiserver's certificate providers
// the metrics listener uses.
// selfSignedMetricsCert makes a certificate for the metrics listener at
// addr, naming name (the node, the pod) and the bound IP (unless it is a
// wildcard). Scrapers
// that do not verify it (Prometheus with insecureSkipVerify, the kubelet's
// probes) still get an encrypted channel; TLSCertFile gives one
// they can verify.
func selfSignedMetricsCert(addr net.Addr, name string) ([]byte, []byte, error) {
	var ips []net.IP
	if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsUnspecified() {
		ips = append(ips, tcp.IP)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(name, ips, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the metrics serving certificate: %w", err)
	}
	return certPEM, keyPEM, nil
}
