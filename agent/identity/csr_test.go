package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// signingClient is a fake clientset whose CSRs are approved and signed by
// ca as they are created (the approver and kube-controller-manager in one),
// keeping only the newest CSR so that a wait for it sees no other.
type signingClient struct {
	*fake.Clientset
	// deny makes every CSR denied instead.
	deny atomic.Bool

	mu   sync.Mutex // protects the field below
	csrs []*certificatesv1.CertificateSigningRequest
}

func newSigningClient(t *testing.T, ca *testCA) *signingClient {
	c := &signingClient{Clientset: fake.NewClientset()}
	c.PrependReactor("create", "certificatesigningrequests", func(action clienttesting.Action) (bool, runtime.Object, error) {
		csr := action.(clienttesting.CreateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, old := range c.csrs {
			_ = c.Tracker().Delete(certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"), "", old.Name)
		}
		csr.Name = fmt.Sprintf("csr-%d", len(c.csrs)+1)
		csr.UID = types.UID(csr.Name)
		block, _ := pem.Decode(csr.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			t.Errorf("CSR %s: %v", csr.Name, err)
			return true, nil, err
		}
		life := time.Duration(*csr.Spec.ExpirationSeconds) * time.Second
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial.Add(1)), Subject: req.Subject,
			DNSNames: req.DNSNames, IPAddresses: req.IPAddresses,
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(life),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, req.PublicKey, ca.key)
		if err != nil {
			return true, nil, err
		}
		if c.deny.Load() {
			csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "WrongSubjectAltNames"}}
		} else {
			csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
			csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		}
		c.csrs = append(c.csrs, csr.DeepCopy())
		return false, nil, nil // the tracker stores the edited object
	})
	return c
}

func (c *signingClient) sent() []*certificatesv1.CertificateSigningRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.csrs)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCSRSource: the source sends the CSR an approver accepts, serves and
// trusts what comes back, and on Renew sends a CSR with a new key and
// switches to the new certificate.
func TestCSRSource(t *testing.T) {
	ca := newTestCA(t, "cluster-ca")
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, ca.pem)
	client := newSigningClient(t, ca)
	sans := testSANs()
	s, err := NewCSRSource(Options{NodeName: "node-a", SANs: sans, CAFile: caFile}, 10*time.Minute,
		func() (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "waiting for a CertificateSigningRequest for system:node:node-a") {
		t.Errorf("Ready before Run = %v, want the wait for the CSR", err)
	}
	if _, err := s.GetCertificate(nil); err == nil {
		t.Errorf("GetCertificate before a certificate was issued succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	waitFor(t, "the first certificate", func() bool { return s.Ready() == nil })

	csrs := client.sent()
	if len(csrs) != 1 {
		t.Fatalf("sent %d CSRs, want 1", len(csrs))
	}
	csr := csrs[0]
	if csr.Spec.SignerName != "kubernetes.io/kubelet-serving" || *csr.Spec.ExpirationSeconds != 600 ||
		!slices.Equal(csr.Spec.Usages, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}) {
		t.Errorf("CSR spec: signer %s, expirationSeconds %d, usages %v", csr.Spec.SignerName, *csr.Spec.ExpirationSeconds, csr.Spec.Usages)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if req.Subject.CommonName != "system:node:node-a" || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) ||
		!slices.Equal(req.DNSNames, sans.DNSNames) || len(req.IPAddresses) != len(sans.IPs) {
		t.Errorf("CSR request: subject %s, DNS %v, IPs %v", req.Subject, req.DNSNames, req.IPAddresses)
	}
	if k, ok := req.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CSR key %T, want ECDSA P-256", req.PublicKey)
	}
	first := s.Current()
	if got, _ := s.GetCertificate(nil); got != first {
		t.Errorf("GetCertificate does not serve the current certificate")
	}

	s.Renew()
	waitFor(t, "the renewed certificate", func() bool { return s.Current() != first && s.Ready() == nil })
	if n := len(client.sent()); n != 2 {
		t.Errorf("sent %d CSRs after Renew, want 2", n)
	}
	if slices.Equal(s.Current().Leaf.RawSubjectPublicKeyInfo, first.Leaf.RawSubjectPublicKeyInfo) {
		t.Errorf("renewal reused the key")
	}
}

func TestNewCSRSourceErrors(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, newTestCA(t, "ca").pem)
	none := func() (kubernetes.Interface, error) { return nil, nil }
	if _, err := NewCSRSource(Options{NodeName: "n", CAFile: caFile}, 9*time.Minute, none); err == nil || !strings.Contains(err.Error(), "floor") {
		t.Errorf("lifetime 9m: %v, want the floor error", err)
	}
	if _, err := NewCSRSource(Options{CAFile: caFile}, time.Hour, none); err == nil {
		t.Errorf("no node name: no error")
	}
	if _, err := NewCSRSource(Options{NodeName: "n", CAFile: filepath.Join(dir, "missing")}, time.Hour, none); err == nil {
		t.Errorf("missing CA bundle: no error")
	}
}

// TestCSRSourceDenied: while every CSR is denied, the source stays not
// ready and says that requests failed; it serves nothing.
func TestCSRSourceDenied(t *testing.T) {
	ca := newTestCA(t, "cluster-ca")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, ca.pem)
	client := newSigningClient(t, ca)
	client.deny.Store(true)
	s, err := NewCSRSource(Options{NodeName: "node-a", SANs: testSANs(), CAFile: caFile}, time.Hour,
		func() (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	waitFor(t, "a failed request", func() bool {
		err := s.Ready()
		return err != nil && strings.Contains(err.Error(), "1 request(s) failed so far")
	})
	if s.Current() != nil {
		t.Errorf("a denied request produced a certificate")
	}
}
