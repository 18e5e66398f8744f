package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate"
	"k8s.io/klog/v2"
)

// MinLifetime is the shortest certificate lifetime the kubernetes.io signers
// grant (CSR spec.expirationSeconds has a floor of ten minutes).
const MinLifetime = 10 * time.Minute

// SignerName is the signer the agent asks for its certificate: the one that
// issues kubelet serving certificates, from the cluster CA in most
// distributions.
const SignerName = certificatesv1.KubeletServingSignerName

var _ Source = (*CSRSource)(nil)

// CSRSource obtains the serving certificate through the
// CertificateSigningRequest API with client-go's certificate manager, which
// generates an ECDSA P-256 key per request, submits a CSR for signer
// kubernetes.io/kubelet-serving, waits for it to be approved and issued, and
// rotates at a jittered 70-90% of the certificate's lifetime. The key lives
// only in memory: the manager's store here is a variable, never a file, so a
// restarted agent asks for a new certificate.
type CSRSource struct {
	// Fixed at construction.
	opts      Options
	template  *x509.CertificateRequest
	lifetime  time.Duration
	clientset func() (kubernetes.Interface, error)
	ca        *dynamiccertificates.DynamicFileCAContent
	trust     *trustCheck
	store     *memoryStore
	renewals  *prometheus.CounterVec
	renew     chan struct{}
	// failures counts requests that were not issued (denied, timed out,
	// failed to send), for Ready's message.
	failures atomic.Int64
}

// NewCSRSource prepares a source that requests a certificate for o.SANs
// valid for lifetime, with clients from clientset (the agent's own
// credentials). Nothing is requested before Run.
func NewCSRSource(o Options, lifetime time.Duration, clientset func() (kubernetes.Interface, error)) (*CSRSource, error) {
	if o.NodeName == "" {
		return nil, errors.New("the node name is required to request a serving certificate")
	}
	if lifetime < MinLifetime {
		return nil, fmt.Errorf("certificate lifetime %s is below the signers' floor of %s", lifetime, MinLifetime)
	}
	ca, err := newCAContent(o.CAFile)
	if err != nil {
		return nil, err
	}
	renewals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_apicache_serving_certificate_renewals_total",
		Help: "Serving certificates requested through the CSR API, by result (issued, failed).",
	}, []string{"result"})
	return &CSRSource{
		opts: o,
		template: &x509.CertificateRequest{
			Subject:     pkix.Name{CommonName: NodeCommonName(o.NodeName), Organization: []string{NodesOrganization}},
			DNSNames:    o.SANs.DNSNames,
			IPAddresses: o.SANs.NetIPs(),
		},
		lifetime:  lifetime,
		clientset: clientset,
		ca:        ca,
		trust:     newTrustCheck(ca, o.SANs, o.now()),
		renewals:  renewals,
		store:     &memoryStore{issued: renewals.WithLabelValues("issued")},
		renew:     make(chan struct{}, 1),
	}, nil
}

func (s *CSRSource) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.renewals}
}

// Run requests a certificate at once and keeps rotating it until ctx ends.
// Renew restarts the manager, which then requests a new certificate at
// once; the current one is served until its successor arrives.
func (s *CSRSource) Run(ctx context.Context) {
	ctx = klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "serving-cert"))
	logger := klog.FromContext(ctx)
	go s.ca.Run(ctx, 1)
	go reportReady(ctx, s)
	for {
		mctx, stop := context.WithCancel(ctx)
		m, err := s.newManager(mctx)
		if err != nil {
			// Only a broken configuration gets here; NewCSRSource checked it.
			logger.Error(err, "Starting the certificate manager")
			stop()
			return
		}
		m.Start()
		select {
		case <-ctx.Done():
			stop()
			return
		case <-s.renew:
			logger.Info("Renewing the serving certificate now")
			stop()
		}
	}
}

// Renew asks for a new key and certificate now.
func (s *CSRSource) Renew() {
	select {
	case s.renew <- struct{}{}:
	default:
	}
}

func (s *CSRSource) newManager(ctx context.Context) (certificate.Manager, error) {
	lifetime := s.lifetime
	return certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) { return s.clientset() },
		Template:    s.template,
		SignerName:  SignerName,
		// Digital signature and server auth; key encipherment only for
		// RSA keys (the manager generates ECDSA P-256).
		GetUsages:                    certificate.DefaultKubeletServingGetUsages,
		RequestedCertificateLifetime: &lifetime,
		// Every manager starts without a certificate and so requests one
		// at once; what it obtains goes to s.store.
		CertificateStore: forceRequest{s.store},
		CertificateRenewFailure: counterFunc(func() {
			s.failures.Add(1)
			s.renewals.WithLabelValues("failed").Inc()
		}),
		Name: "serving",
		Ctx:  &ctx,
	})
}

// GetCertificate implements Source.
func (s *CSRSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.store.get(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// Current implements Source.
func (s *CSRSource) Current() *tls.Certificate { return s.store.get() }

// Ready implements Source.
func (s *CSRSource) Ready() error {
	c := s.store.get()
	if c == nil {
		msg := fmt.Sprintf("no serving certificate yet: waiting for a CertificateSigningRequest for %s (signer %s) to be approved and issued",
			s.template.Subject.CommonName, SignerName)
		if n := s.failures.Load(); n > 0 {
			msg += fmt.Sprintf("; %d request(s) failed so far (see the CSRs' conditions and the agent's log)", n)
		}
		return errors.New(msg)
	}
	return s.trust.check(c)
}

// memoryStore is a certificate.Store that keeps the pair in memory only.
type memoryStore struct {
	// issued counts successful updates.
	issued prometheus.Counter

	mu   sync.Mutex // protects the field below
	pair *tls.Certificate
}

func (m *memoryStore) get() *tls.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pair
}

// Current implements certificate.Store.
func (m *memoryStore) Current() (*tls.Certificate, error) {
	if c := m.get(); c != nil {
		return c, nil
	}
	e := certificate.NoCertKeyError("no serving certificate yet")
	return nil, &e
}

// Update implements certificate.Store. The key PEM is parsed and dropped;
// it is never written anywhere.
func (m *memoryStore) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing issued certificate: %w", err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing issued certificate: %w", err)
		}
	}
	m.mu.Lock()
	m.pair = &pair
	m.mu.Unlock()
	if m.issued != nil {
		m.issued.Inc()
	}
	return &pair, nil
}

// forceRequest hides the current certificate from a new manager, which then
// requests a certificate at once instead of waiting for the current one's
// rotation deadline.
type forceRequest struct{ *memoryStore }

func (forceRequest) Current() (*tls.Certificate, error) {
	e := certificate.NoCertKeyError("renewal requested")
	return nil, &e
}

type counterFunc func()

func (f counterFunc) Inc() { f() }
