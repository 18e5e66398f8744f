package serving

import (
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// Callers that authenticate with a TLS client certificate.
//
// The agent terminates TLS, so a certificate the caller presents ends at the
// agent: it cannot be passed on (the agent does not hold the caller's key),
// and forwarding the request without it would make kube-apiserver see
// someone else, system:anonymous or whatever token the request also
// carries. kube-apiserver authenticates a valid client certificate before
// any token, so the only faithful answer is to let such a caller talk to
// kube-apiserver itself.
//
// The handshake therefore asks for a client certificate (without verifying
// it; that is kube-apiserver's job). A request on a connection that
// presented one is never forwarded or answered from the cache:
//
//   - From a pod, its source address goes into the skip set, the same set
//     the pod-path check uses: while the entry lives (--bypass-duration),
//     the chain returns that source's new connections to kube-proxy's path,
//     that is to kube-apiserver. The request itself gets what
//     kube-apiserver answers while it shuts down: 429 with Retry-After: 1
//     and Connection: close, so client-go reconnects, now past the agent,
//     and retries. The caller sees one retried request per bypass period;
//     its identity, authorization and audit are kube-apiserver's own.
//     Other clients of the same pod also bypass the cache meanwhile: they
//     lose its savings, not their answers.
//   - From the host network (a source address of the node itself), or
//     with the skip set unavailable (the pod-path check off), nothing can
//     be steered by source without steering the whole node, the agent's own
//     self-check included. Such a caller gets a 401 that says why and what
//     to do: present a token, or connect to kube-apiserver's own address.

// clientCertificates hands client-certificate callers to kube-apiserver.
type clientCertificates struct {
	// skip sends a source to kube-proxy's path for bypass; steerable is
	// false where it cannot (no skip set for the source's family).
	skip     func(src netip.Addr) (steerable bool, err error)
	bypass   time.Duration
	isLocal  func(netip.Addr) bool
	handoffs *prometheus.CounterVec
}

func newClientCertificates(o Options) *clientCertificates {
	cc := &clientCertificates{
		skip:    o.SkipSource,
		bypass:  o.BypassDuration,
		isLocal: o.IsNodeAddress,
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_client_certificate_requests_total",
			Help: "Requests on connections that presented a TLS client certificate, which the agent cannot pass on: outcome bypassed (the source goes to kube-apiserver through kube-proxy's path for --bypass-duration, the request is told to retry), refused (a host-network caller, or no skip set: 401), error (the skip set could not be updated: 503 to retry).",
		}, []string{"outcome"}),
	}
	o.Registry.MustRegister(cc.handoffs)
	return cc
}

// wrap sends requests of connections with a client certificate to handOff
// and every other request to h.
func (cc *clientCertificates) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		cc.handOff(w, r)
	})
}

func (cc *clientCertificates) handOff(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	subject := r.TLS.PeerCertificates[0].Subject.CommonName
	src, err := netip.ParseAddrPort(r.RemoteAddr)
	steerable := false
	if err == nil && !cc.isLocal(src.Addr().Unmap()) {
		steerable, err = cc.skip(src.Addr().Unmap())
	}
	if !steerable {
		cc.handoffs.WithLabelValues("refused").Inc()
		logger.V(2).Info("Refusing a client-certificate caller the agent cannot steer to kube-apiserver",
			"source", r.RemoteAddr, "commonName", subject)
		apihttp.WriteStatus(w, r, apierrors.NewUnauthorized(
			"the node-local API proxy (kube-apicache) cannot pass a TLS client certificate on to kube-apiserver; "+
				"from the host network, connect to kube-apiserver's own address, or authenticate with a token"))
		return
	}
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Connection", "close")
	if err != nil {
		cc.handoffs.WithLabelValues("error").Inc()
		logger.Error(err, "Adding a client-certificate caller to the skip set", "source", src.Addr())
		apihttp.WriteStatus(w, r, apierrors.NewServiceUnavailable("the node-local API proxy could not hand this client-certificate connection to kube-apiserver; retry"))
		return
	}
	cc.handoffs.WithLabelValues("bypassed").Inc()
	logger.V(2).Info("Client-certificate caller goes to kube-apiserver through kube-proxy's path",
		"source", src.Addr(), "commonName", subject, "bypassDuration", cc.bypass)
	apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests(fmt.Sprintf(
		"this connection presented a TLS client certificate, which the node-local API proxy cannot pass on; "+
			"new connections from %s now reach kube-apiserver directly for %s, please retry", src.Addr(), cc.bypass), 1))
}
