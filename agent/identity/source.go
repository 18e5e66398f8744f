package identity

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Source supplies the serving certificate. Both sources serve through
// tls.Config.GetCertificate, so a rotated certificate goes to new handshakes
// while established connections keep theirs.
type Source interface {
	// GetCertificate is a tls.Config GetCertificate.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Ready returns nil only while a certificate is present, valid now,
	// meant for server authentication and verified by the pods' CA bundle
	// for every name and IP they dial; else the reason.
	Ready() error
	// Run keeps the certificate and CA bundle current until ctx ends.
	Run(ctx context.Context)
	// Renew asks for a new certificate now (a new key and CSR, or a reread
	// of the files).
	Renew()
	// Current returns the certificate being served, or nil.
	Current() *tls.Certificate
}

// Options are what both sources need to know.
type Options struct {
	// NodeName is the node the agent runs on.
	NodeName string
	// SANs are the names and IPs pods dial (see ServingSANs).
	SANs SANs
	// CAFile is the pods' CA bundle: the ServiceAccount ca.crt, which the
	// kubelet fills from the kube-root-ca.crt ConfigMap.
	CAFile string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// StateDir, for the CSR source only, is a directory (a memory-backed
	// volume) where the key, certificate, pending request and last denial
	// are kept for the next process in the same pod. Empty keeps them in
	// this process's memory only.
	StateDir string
	// SignerName, for the CSR source only, is the signer named in the
	// CSRs (spec.signerName); empty means DefaultSignerName. Whatever the
	// signer, the subject, names and key are those the kubelet-serving
	// signer requires (see NewCSRSource), the usages are
	// RequestUsages(SignerName), and the certificate it issues is served
	// only once it verifies against CAFile, for whatever lifetime the
	// signer chose.
	SignerName string
}

func (o *Options) now() func() time.Time {
	if o.Now != nil {
		return o.Now
	}
	return time.Now
}

// reportReady logs every change of src.Ready() until ctx ends: the reason
// the agent may not intercept is in its log as well as in /readyz.
func reportReady(ctx context.Context, src Source) {
	logger := klog.FromContext(ctx)
	last := "unset"
	check := func() {
		err := src.Ready()
		now := ""
		if err != nil {
			now = err.Error()
		}
		if now == last {
			return
		}
		last = now
		if err != nil {
			logger.Info("Serving certificate cannot be used to intercept", "reason", now)
			return
		}
		cur := src.Current()
		if cur == nil || cur.Leaf == nil {
			return
		}
		leaf := cur.Leaf
		logger.Info("Serving certificate verified by the pods' CA bundle", "serial", leaf.SerialNumber.String(),
			"issuer", leaf.Issuer.String(), "notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	check()
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			check()
		}
	}
}

// Metrics returns the collectors that describe src.
func Metrics(src Source) []prometheus.Collector {
	out := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kube_apicache_serving_certificate_ready",
			Help: "1 while the serving certificate is valid and verified by the pods' CA bundle for every name and IP they dial, 0 otherwise.",
		}, func() float64 {
			if src.Ready() == nil {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kube_apicache_serving_certificate_expiration_timestamp_seconds",
			Help: "When the serving certificate expires, in seconds since the epoch; 0 while there is none.",
		}, func() float64 {
			if c := src.Current(); c != nil && c.Leaf != nil {
				return float64(c.Leaf.NotAfter.Unix())
			}
			return 0
		}),
	}
	if c, ok := src.(interface{ collectors() []prometheus.Collector }); ok {
		out = append(out, c.collectors()...)
	}
	return out
}
