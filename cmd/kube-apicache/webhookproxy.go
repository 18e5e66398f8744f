package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/agent/webhookproxy"
)

// Defaults of `kube-apicache webhook-proxy`.
const (
	defaultWebhookProxyListen = "0.0.0.0:9444"
	// defaultWebhookProxyGracePeriod leaves a few seconds of a pod's
	// default 30-second termination grace period for the exit.
	defaultWebhookProxyGracePeriod = 25 * time.Second
)

type webhookProxyOptions struct {
	listenAddress      string
	certFile           string
	keyFile            string
	backend            string
	backendCAFile      string
	backendServerName  string
	rewriteConfig      string
	profile            string
	metricsBindAddress string
	timeout            time.Duration
	maxBodyBytes       int64
	gracePeriod        time.Duration
}

// webhookProxy is what the flags make: the checked settings the proxy
// runs with.
type webhookProxy struct {
	opts     webhookProxyOptions
	rewriter *rewrite.Rewriter
	proxy    webhookproxy.Options
	tls      webhookproxy.BackendTLS
}

// newWebhookProxyCommand returns `kube-apicache webhook-proxy`, the
// webhook path of API rewriting.
func newWebhookProxyCommand() *cobra.Command {
	o := &webhookProxyOptions{}
	cmd := &cobra.Command{
		Use:   "webhook-proxy",
		Short: "Serve an operator's admission and conversion webhooks under a rewrite profile's renamed names",
		Long: `webhook-proxy runs beside an operator's webhook server (an extra container in
its pod, or a Deployment in front of its Service) and serves kube-apiserver's
calls to the operator's admission and conversion webhooks: it restores the
original names of each AdmissionReview and ConversionReview, which name the
renamed resources, forwards it to the webhook server (--backend, the
request's own path appended), and renames the answer back: objects, the
JSON patch, warnings and status. The names swap as the rewrite profile
--profile of --rewrite-config says, for every review: the caller is
kube-apiserver, so the profile's selector plays no part here. It serves
TLS with the webhook's own serving certificate (reloaded when the files
change), so the webhook configurations' caBundle stays as it is; only
their Service port changes. Only POST of a review is forwarded: 405, 415,
413 or 400 otherwise. A webhook server's failure is passed on with its
status; 502 when it cannot be reached, 504 past --timeout. GET /healthz
and /readyz are answered on the same listener for the kubelet's probes.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			wp, err := o.complete()
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", o.listenAddress)
			if err != nil {
				return fmt.Errorf("--listen-address: %w", err)
			}
			var metricsLn net.Listener
			if o.metricsBindAddress != "" {
				if metricsLn, err = net.Listen("tcp", o.metricsBindAddress); err != nil {
					_ = ln.Close()
					return fmt.Errorf("--metrics-bind-address: %w", err)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("webhook-proxy"))
			return wp.run(ctx, ln, metricsLn)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.listenAddress, "listen-address", defaultWebhookProxyListen, "host:port to serve kube-apiserver's webhook calls on (TLS): the port the webhook Service's targetPort names.")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "Required. The webhook's own serving certificate chain (PEM), as kube-apiserver verifies it with the webhook configurations' caBundle. Reloaded on change.")
	fs.StringVar(&o.keyFile, "tls-private-key-file", "", "Required. Private key (PEM) of --tls-cert-file. Reloaded on change.")
	fs.StringVar(&o.backend, "backend", "", "Required. URL of the operator's webhook server, https://host:port (http:// for a plain-HTTP server), with an optional path prefix each request's path is appended to: https://127.0.0.1:9443 beside it in its pod.")
	fs.StringVar(&o.backendCAFile, "backend-ca-file", "", "CA bundle (PEM) that verifies the webhook server's certificate, reloaded on change; the ca.crt of the webhook's certificate Secret, where it has one. Empty: the system's roots.")
	fs.StringVar(&o.backendServerName, "backend-server-name", "", "Name the webhook server's certificate must carry, also sent as SNI: the webhook Service's DNS name (NAME.NAMESPACE.svc) when --backend is a loopback address the certificate does not name. Empty: --backend's host.")
	fs.StringVar(&o.rewriteConfig, "rewrite-config", "", "Required. The RewriteConfiguration file (YAML or JSON), decoded strictly and validated without the cluster's groups.")
	fs.StringVar(&o.profile, "profile", "", "Name of the --rewrite-config profile whose names are swapped. May be omitted when the file has exactly one profile.")
	fs.DurationVar(&o.timeout, "timeout", webhookproxy.DefaultTimeout, "How long a call to the webhook server may take (504 past it). kube-apiserver waits for a webhook at most 30s, and for its timeoutSeconds (default 10s) first.")
	fs.Int64Var(&o.maxBodyBytes, "max-body-bytes", webhookproxy.DefaultMaxBodyBytes, "Largest review (413 past it) and webhook server answer (502 past it), in bytes. The default holds an update's two objects of kube-apiserver's 3 MiB request limit each; raise it for conversion webhooks of large lists.")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", "", "host:port serving /metrics, /healthz and /readyz over plain HTTP, with no authentication (bind it to the pod's IP or loopback). Empty: no metrics listener; the health paths are on --listen-address anyway.")
	fs.DurationVar(&o.gracePeriod, "shutdown-grace-period", defaultWebhookProxyGracePeriod, "On SIGTERM, how long the calls in flight may run before the listener closes them; /readyz fails meanwhile. Keep the pod's terminationGracePeriodSeconds above it.")
	return cmd
}

// complete checks the flags, loads the rewrite configuration and builds
// the proxy's settings. Each error is one line naming its flag.
func (o *webhookProxyOptions) complete() (*webhookProxy, error) {
	if err := checkHostPort("--listen-address", o.listenAddress); err != nil {
		return nil, err
	}
	if o.metricsBindAddress != "" {
		if err := checkHostPort("--metrics-bind-address", o.metricsBindAddress); err != nil {
			return nil, err
		}
	}
	switch {
	case o.certFile == "" || o.keyFile == "":
		return nil, errors.New("--tls-cert-file and --tls-private-key-file are required: the webhook's serving certificate")
	case o.backend == "":
		return nil, errors.New("--backend is required: the webhook server's URL")
	case o.rewriteConfig == "":
		return nil, errors.New("--rewrite-config is required")
	case o.timeout <= 0:
		return nil, fmt.Errorf("--timeout %s must be positive", o.timeout)
	case o.maxBodyBytes <= 0:
		return nil, fmt.Errorf("--max-body-bytes %d must be positive", o.maxBodyBytes)
	case o.gracePeriod < 0:
		return nil, fmt.Errorf("--shutdown-grace-period %s must not be negative", o.gracePeriod)
	}
	backend, err := webhookproxy.ParseBackend(o.backend)
	if err != nil {
		return nil, fmt.Errorf("--backend %q: %w", o.backend, err)
	}
	if backend.Scheme != "https" && (o.backendCAFile != "" || o.backendServerName != "") {
		return nil, errors.New("--backend-ca-file and --backend-server-name need an https --backend")
	}
	profile, err := loadProfile(o.rewriteConfig, o.profile)
	if err != nil {
		return nil, err
	}
	r, err := rewrite.New(profile)
	if err != nil {
		return nil, fmt.Errorf("--rewrite-config: %w", err)
	}
	return &webhookProxy{
		opts:     *o,
		rewriter: r,
		proxy: webhookproxy.Options{
			Rewriter:     r,
			Backend:      backend,
			MaxBodyBytes: o.maxBodyBytes,
			Timeout:      o.timeout,
		},
		tls: webhookproxy.BackendTLS{CAFile: o.backendCAFile, ServerName: o.backendServerName},
	}, nil
}

// checkHostPort checks that a listen flag is host:port.
func checkHostPort(flag, s string) error {
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		return fmt.Errorf("%s %q: must be host:port", flag, s)
	}
	return nil
}

// loadProfile reads and validates the rewrite configuration at path, as
// far as it can be without the cluster, and returns its profile name: the
// only one when name is empty.
func loadProfile(path, name string) (v1alpha1.RewriteProfile, error) {
	cfg, err := v1alpha1.Load(path)
	if err != nil {
		return v1alpha1.RewriteProfile{}, fmt.Errorf("--rewrite-config: %w", err)
	}
	if errs := v1alpha1.Validate(cfg, nil); len(errs) > 0 {
		return v1alpha1.RewriteProfile{}, fmt.Errorf("--rewrite-config %s: %w", path, errs.ToAggregate())
	}
	var names []string
	for _, p := range cfg.Profiles {
		names = append(names, p.Name)
	}
	if name == "" {
		if len(cfg.Profiles) != 1 {
			return v1alpha1.RewriteProfile{}, fmt.Errorf("--profile is required: %s has %d profiles (%s)", path, len(cfg.Profiles), strings.Join(names, ", "))
		}
		return cfg.Profiles[0], nil
	}
	i := slices.Index(names, name)
	if i < 0 {
		return v1alpha1.RewriteProfile{}, fmt.Errorf("--profile %q: %s has no such profile (it has %s)", name, path, strings.Join(names, ", "))
	}
	return cfg.Profiles[i], nil
}

// run serves the proxy on ln, and the metrics on metricsLn if it is not
// nil, until ctx ends; then it stops taking new connections and lets the
// calls in flight finish for up to the grace period. It closes the
// listeners.
func (wp *webhookProxy) run(ctx context.Context, ln, metricsLn net.Listener) error {
	logger := klog.FromContext(ctx)
	closeAll := func() {
		_ = ln.Close()
		if metricsLn != nil {
			_ = metricsLn.Close()
		}
	}
	cert, err := webhookproxy.NewServingCertificate(wp.opts.certFile, wp.opts.keyFile)
	if err != nil {
		closeAll()
		return fmt.Errorf("--tls-cert-file: %w", err)
	}
	go cert.Run(ctx)
	transport, err := wp.tls.Transport(ctx, wp.proxy.Backend)
	if err != nil {
		closeAll()
		return fmt.Errorf("--backend-ca-file: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(status.BuildInfo(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o := wp.proxy
	o.Transport, o.Registry = transport, reg
	proxy, err := webhookproxy.New(o)
	if err != nil {
		closeAll()
		return err
	}

	var draining atomic.Bool
	readyz := func() error {
		if draining.Load() {
			return errors.New("shutting down")
		}
		if _, err := cert.GetCertificate(nil); err != nil {
			return err
		}
		return nil
	}
	// The server's requests do not end with ctx: at SIGTERM they run on,
	// for the grace period.
	base := context.WithoutCancel(ctx)
	errorLog := log.New(serverLogWriter{logger.V(4)}, "", 0)
	srv := &http.Server{
		Handler: withProbes(proxy, readyz),
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: cert.GetCertificate,
		},
		ReadHeaderTimeout: 10 * time.Second,
		// A review of --max-body-bytes arrives well within this; the
		// answer waits for the webhook server for up to --timeout.
		ReadTimeout:    30 * time.Second,
		WriteTimeout:   wp.opts.timeout + 30*time.Second,
		IdleTimeout:    90 * time.Second,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       errorLog,
		BaseContext:    func(net.Listener) context.Context { return base },
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	var metricsSrv *http.Server
	if metricsLn != nil {
		metricsSrv = &http.Server{
			Handler:           metricsHandler(reg, readyz),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          errorLog,
			BaseContext:       func(net.Listener) context.Context { return base },
		}
		go func() { serveErr <- metricsSrv.Serve(metricsLn) }()
	}
	logger.Info("Serving webhooks", "listen", ln.Addr().String(), "backend", wp.proxy.Backend.Redacted(), "profile", wp.rewriter.Name(), "metrics", wp.opts.metricsBindAddress)

	var failed error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		failed = fmt.Errorf("serving: %w", err)
	}
	draining.Store(true)
	logger.Info("Shutting down", "gracePeriod", wp.opts.gracePeriod)
	shutdownCtx, cancel := context.WithTimeout(base, wp.opts.gracePeriod)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Info("Calls still in flight at the end of the grace period; closed", "err", err)
		_ = srv.Close()
	}
	if metricsSrv != nil {
		_ = metricsSrv.Close()
	}
	return failed
}

// withProbes answers GET and HEAD of /healthz, /livez and /readyz on the
// webhook listener, for the kubelet's probes; everything else goes to
// the proxy (which forwards only POST).
func withProbes(proxy http.Handler, readyz func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/healthz", "/livez":
				probe(w, nil)
				return
			case "/readyz":
				probe(w, readyz())
				return
			}
		}
		proxy.ServeHTTP(w, r)
	})
}

// metricsHandler serves /metrics from reg and the health paths, over the
// plain-HTTP metrics listener.
func metricsHandler(reg *prometheus.Registry, readyz func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { probe(w, nil) })
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { probe(w, nil) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { probe(w, readyz()) })
	return mux
}

// probe answers a health check: ok, or 503 with the reason.
func probe(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(err.Error() + "\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// serverLogWriter puts net/http's own messages (handshake errors of junk
// connections) into the log at a verbosity of their own.
type serverLogWriter struct{ logger klog.Logger }

func (w serverLogWriter) Write(p []byte) (int, error) {
	w.logger.Info("HTTP server", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}
