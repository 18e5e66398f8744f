package sandbox

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// serviceCSR returns a CSR for the kubernetes Service's names, as the
// agent sends it to the EKS signer, asking for ten minutes.
func serviceCSR(t *testing.T, name string, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:node-a", Organization: []string{"system:nodes"}},
		DNSNames:    []string{"kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("10.96.0.1")},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName:        EKSAppServingSignerName,
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			Usages:            usages,
			ExpirationSeconds: ptr.To[int32](600),
		},
	}
}

var (
	ke = certificatesv1.UsageKeyEncipherment
	ds = certificatesv1.UsageDigitalSignature
	sa = certificatesv1.UsageServerAuth
	ca = certificatesv1.UsageClientAuth
)

// TestEKSSignerSign: the signing decision. A serving request gets a
// certificate from the cluster CA for exactly a year, whatever it asked
// for, with its subject and SANs; one that asks for client auth, or lacks
// a serving usage, or does not parse, fails.
func TestEKSSignerSign(t *testing.T) {
	clusterCA, err := NewCA("cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	s := NewEKSSigner(fake.NewClientset(), clusterCA)
	s.now = func() time.Time { return now }

	tests := []struct {
		name string
		csr  *certificatesv1.CertificateSigningRequest
		// wantFailure is a substring of the failure; empty: issued.
		wantFailure string
	}{
		{name: "serving usages", csr: serviceCSR(t, "a", ke, ds, sa)},
		{name: "serving usages in another order", csr: serviceCSR(t, "b", sa, ke, ds)},
		{name: "client auth", csr: serviceCSR(t, "c", ke, ds, sa, ca), wantFailure: `"client auth" is not allowed`},
		{name: "client auth alone", csr: serviceCSR(t, "d", ca), wantFailure: "not allowed"},
		{name: "without key encipherment", csr: serviceCSR(t, "e", ds, sa), wantFailure: "must include"},
		{name: "garbage", csr: func() *certificatesv1.CertificateSigningRequest {
			c := serviceCSR(t, "f", ke, ds, sa)
			c.Spec.Request = []byte("garbage")
			return c
		}(), wantFailure: "not a PEM"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, failure := s.Sign(tc.csr)
			if tc.wantFailure != "" {
				if certPEM != nil || !strings.Contains(failure, tc.wantFailure) {
					t.Fatalf("Sign = %d bytes, %q; want a failure containing %q", len(certPEM), failure, tc.wantFailure)
				}
				return
			}
			if failure != "" {
				t.Fatalf("Sign failed: %s", failure)
			}
			block, _ := pem.Decode(certPEM)
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if got := cert.NotAfter.Sub(cert.NotBefore); got != EKSAppServingLifetime {
				t.Errorf("lifetime %s, want %s (expirationSeconds 600 ignored)", got, EKSAppServingLifetime)
			}
			if !cert.NotBefore.Equal(now.Add(-eksBackdate)) {
				t.Errorf("NotBefore %s, want %s", cert.NotBefore, now.Add(-eksBackdate))
			}
			if cert.Subject.CommonName != "system:node:node-a" || !slices.Equal(cert.DNSNames, []string{"kubernetes.default.svc"}) ||
				len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.ParseIP("10.96.0.1")) {
				t.Errorf("subject %s, DNS %v, IPs %v; want the request's", cert.Subject, cert.DNSNames, cert.IPAddresses)
			}
			if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || cert.IsCA {
				t.Errorf("extended key usages %v, CA %v; want server auth only, not a CA", cert.ExtKeyUsage, cert.IsCA)
			}
			roots := x509.NewCertPool()
			roots.AddCert(clusterCA.Cert)
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "kubernetes.default.svc", CurrentTime: now}); err != nil {
				t.Errorf("does not verify with the cluster CA: %v", err)
			}
		})
	}
}

// TestEKSSignerRun: through the API, the signer issues approved CSRs,
// fails approved ones it must not sign with a Failed condition, and leaves
// pending, denied and other signers' CSRs alone.
func TestEKSSignerRun(t *testing.T) {
	clusterCA, err := NewCA("cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	approved := func(c *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequest {
		c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
		return c
	}
	good := approved(serviceCSR(t, "good", ke, ds, sa))
	client := approved(serviceCSR(t, "client", ke, ds, sa, ca))
	pending := serviceCSR(t, "pending", ke, ds, sa)
	denied := serviceCSR(t, "denied", ke, ds, sa)
	denied.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue}}
	other := approved(serviceCSR(t, "other", ke, ds, sa))
	other.Spec.SignerName = "kubernetes.io/kubelet-serving"
	cs := fake.NewClientset(good, client, pending, denied, other)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = NewEKSSigner(cs, clusterCA).Run(ctx) }()

	get := func(name string) *certificatesv1.CertificateSigningRequest {
		c, err := cs.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(get("good").Status.Certificate) > 0 && len(get("client").Status.Conditions) == 2, nil
	})
	if err != nil {
		t.Fatalf("the signer did not answer: good %+v, client %+v", get("good").Status, get("client").Status)
	}
	if c := get("client").Status.Conditions[1]; c.Type != certificatesv1.CertificateFailed || c.Reason != ReasonSignerValidationFailure {
		t.Errorf("CSR asking for client auth: condition %+v, want Failed", c)
	}
	if len(get("client").Status.Certificate) > 0 {
		t.Errorf("CSR asking for client auth was issued")
	}
	for _, name := range []string{"pending", "denied", "other"} {
		if c := get(name); len(c.Status.Certificate) > 0 || slices.ContainsFunc(c.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
			return c.Type == certificatesv1.CertificateFailed
		}) {
			t.Errorf("CSR %s was touched: %+v", name, c.Status)
		}
	}
}
