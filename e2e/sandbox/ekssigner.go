package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// EKSAppServingSignerName is Amazon EKS's signer for workloads' serving
// certificates.
const EKSAppServingSignerName = "beta.eks.amazonaws.com/app-serving"

// EKSAppServingLifetime is the lifetime of every certificate that signer
// issues: one year, its default and maximum, whatever spec.expirationSeconds
// asks for.
const EKSAppServingLifetime = 365 * 24 * time.Hour

// eksBackdate is how far NotBefore is set in the past, as
// kube-controller-manager's signer backdates it, for clocks behind ours.
const eksBackdate = 5 * time.Minute

// Reasons on the Failed condition, as kube-controller-manager's signer
// writes them.
const (
	ReasonSignerValidationFailure = "SignerValidationFailure"
)

// eksUsages are the usages EKS's app-serving signer takes: AWS documents
// that a CSR must not ask for any other (no client auth, no CA), and the
// request for this signer is read the strictest way, all three required.
// A real EKS signer takes whatever this one does.
var eksUsages = []certificatesv1.KeyUsage{certificatesv1.UsageKeyEncipherment, certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}

// EKSSigner behaves, for the e2e suite, as Amazon EKS's
// beta.eks.amazonaws.com/app-serving signer is documented to: it signs
// approved CSRs for that signer with the cluster CA (the CA in the pods'
// ca.crt), any subject, copying the SANs from the request, the key usages
// asked for and server auth, for exactly EKSAppServingLifetime whatever
// spec.expirationSeconds says. A CSR that asks for a usage outside
// key encipherment, digital signature and server auth (client auth, say),
// or that does not parse, gets a Failed condition instead. It approves
// nothing: that is the approver's job.
type EKSSigner struct {
	// Fixed at construction.
	client  kubernetes.Interface
	ca      *CA
	now     func() time.Time
	factory informers.SharedInformerFactory
	lister  certlisters.CertificateSigningRequestLister
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
}

// NewEKSSigner returns a signer that issues from ca and writes through
// client, which needs get, list and watch on certificatesigningrequests,
// update on certificatesigningrequests/status and sign on
// signers/EKSAppServingSignerName (the sandbox's admin has them all).
func NewEKSSigner(client kubernetes.Interface, ca *CA) *EKSSigner {
	s := &EKSSigner{
		client: client,
		ca:     ca,
		now:    time.Now,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "eks-signer"}),
	}
	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", EKSAppServingSignerName).String()
		}))
	inf := s.factory.Certificates().V1().CertificateSigningRequests()
	s.lister, s.synced = inf.Lister(), inf.Informer().HasSynced
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			s.queue.Add(key)
		}
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return s
}

// Run signs CSRs until ctx ends.
func (s *EKSSigner) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer s.queue.ShutDown()
	s.factory.Start(ctx.Done())
	defer s.factory.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, s.synced) {
		return fmt.Errorf("waiting for the CertificateSigningRequest informer: %w", context.Cause(ctx))
	}
	go wait.UntilWithContext(ctx, s.worker, time.Second)
	<-ctx.Done()
	return nil
}

func (s *EKSSigner) worker(ctx context.Context) {
	for s.next(ctx) {
	}
}

func (s *EKSSigner) next(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	if err := s.sync(ctx, key); err != nil {
		klog.FromContext(ctx).Error(err, "Signing", "csr", key)
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

// sync signs (or fails) the CSR name if it is approved and not yet
// issued, failed or denied.
func (s *EKSSigner) sync(ctx context.Context, name string) error {
	csr, err := s.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !pendingSignature(csr) {
		return nil
	}
	csr = csr.DeepCopy()
	certPEM, failure := s.Sign(csr)
	if failure != "" {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue,
			Reason: ReasonSignerValidationFailure, Message: failure, LastUpdateTime: metav1.Now(),
		})
	} else {
		csr.Status.Certificate = certPEM
	}
	_, err = s.client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// pendingSignature reports whether csr is this signer's to sign now:
// approved, not denied or failed, and without a certificate.
func pendingSignature(csr *certificatesv1.CertificateSigningRequest) bool {
	if csr.Spec.SignerName != EKSAppServingSignerName || len(csr.Status.Certificate) > 0 {
		return false
	}
	approved := false
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return false
		case certificatesv1.CertificateApproved:
			approved = c.Status == corev1.ConditionTrue
		}
	}
	return approved
}

// Sign returns the PEM certificate for csr, or why it cannot be issued.
// It ignores spec.expirationSeconds and whether csr is approved (see
// pendingSignature).
func (s *EKSSigner) Sign(csr *certificatesv1.CertificateSigningRequest) (certPEM []byte, failure string) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, "spec.request is not a PEM CERTIFICATE REQUEST"
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Sprintf("parsing spec.request: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Sprintf("the request's signature does not verify: %v", err)
	}
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(eksUsages, u) {
			return nil, fmt.Sprintf("usage %q is not allowed; this signer issues only %q", u, eksUsages)
		}
	}
	for _, u := range eksUsages {
		if !slices.Contains(csr.Spec.Usages, u) {
			return nil, fmt.Sprintf("usages %q must include %q", csr.Spec.Usages, eksUsages)
		}
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err.Error()
	}
	notBefore := s.now().Add(-eksBackdate).Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               req.Subject,
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPAddresses,
		EmailAddresses:        req.EmailAddresses,
		URIs:                  req.URIs,
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(EKSAppServingLifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca.Cert, req.PublicKey, s.ca.Key)
	if err != nil {
		return nil, fmt.Sprintf("signing: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ""
}
