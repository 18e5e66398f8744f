package approver

import (
	"context"
	"crypto/x509"
	"net"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// TestController: given a good agent CSR, an agent CSR with an extra SAN, a
// kubelet's own serving CSR and an already denied agent CSR, the controller
// approves the first, denies the second with its reason, and leaves the
// other two as they were.
func TestController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	mk := func(name string, edit func(*x509.CertificateRequest, *certificatesv1.CertificateSigningRequest)) *certificatesv1.CertificateSigningRequest {
		tmpl, csr := good()
		if edit != nil {
			edit(tmpl, csr)
		}
		csr.Name = name
		csr.Spec.Request = encode(t, tmpl, ecKey)
		return csr
	}
	denied := mk("denied-before", nil)
	denied.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "ByHand"}}
	client := fake.NewClientset(
		mk("good", nil),
		mk("extra-san", func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(r.DNSNames, "evil.example.com")
		}),
		mk("kubelet", func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
			r.DNSNames, r.IPAddresses = []string{node}, []net.IP{net.ParseIP("192.0.2.10")}
		}),
		denied,
	)
	go func() { _ = NewController(client, testPolicy()).Run(ctx, 2) }()

	conditions := func(name string) []certificatesv1.CertificateSigningRequestCondition {
		csr, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return csr.Status.Conditions
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(conditions("good")) > 0 && len(conditions("extra-san")) > 0, nil
	})
	if err != nil {
		t.Fatalf("no decisions: %v", err)
	}
	if c := conditions("good"); len(c) != 1 || c[0].Type != certificatesv1.CertificateApproved || c[0].Reason != ReasonApproved {
		t.Errorf("good: conditions %+v, want one Approved", c)
	}
	if c := conditions("extra-san"); len(c) != 1 || c[0].Type != certificatesv1.CertificateDenied || c[0].Reason != ReasonWrongSANs {
		t.Errorf("extra-san: conditions %+v, want one Denied %s", c, ReasonWrongSANs)
	}
	// Let the workers see the remaining objects; neither may change.
	time.Sleep(200 * time.Millisecond)
	if c := conditions("kubelet"); len(c) != 0 {
		t.Errorf("kubelet: conditions %+v, want none (not the approver's business)", c)
	}
	if c := conditions("denied-before"); len(c) != 1 || c[0].Reason != "ByHand" {
		t.Errorf("denied-before: conditions %+v, want the operator's denial alone", c)
	}
}
