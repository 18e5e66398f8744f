package approver

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
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
	go func() { _ = NewController(client, testPolicy(), ControllerOptions{}).Run(ctx, 2) }()

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

// TestControllerCustomSigner: given an approver configured for a custom
// signer, its informer asks kube-apiserver for that signer's CSRs only;
// and even where the server does not filter (the fake clientset ignores
// field selectors), it approves the agent's good CSR for that signer,
// denies a bad one for it, and leaves the agent's otherwise good
// kubelet-serving CSR and a kubelet-serving CSR naming the Service as
// they were.
func TestControllerCustomSigner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	mk := func(name, signer string, edit func(*x509.CertificateRequest, *certificatesv1.CertificateSigningRequest)) *certificatesv1.CertificateSigningRequest {
		tmpl, csr := good()
		csr.Spec.SignerName = signer
		if edit != nil {
			edit(tmpl, csr)
		}
		csr.Name = name
		csr.Spec.Request = encode(t, tmpl, ecKey)
		return csr
	}
	client := fake.NewClientset(
		mk("custom-good", customSigner, nil),
		mk("custom-extra-san", customSigner, func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(r.DNSNames, "evil.example.com")
		}),
		mk("kubelet-serving-agent", certificatesv1.KubeletServingSignerName, nil),
		mk("kubelet-serving-other", certificatesv1.KubeletServingSignerName, func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
		}),
	)
	var selectors sync.Map
	client.PrependReactor("list", "certificatesigningrequests", func(action clienttesting.Action) (bool, runtime.Object, error) {
		selectors.Store(action.(clienttesting.ListAction).GetListRestrictions().Fields.String(), true)
		return false, nil, nil
	})
	policy := testPolicy()
	policy.SignerName = customSigner
	go func() { _ = NewController(client, policy, ControllerOptions{}).Run(ctx, 2) }()

	conditions := func(name string) []certificatesv1.CertificateSigningRequestCondition {
		csr, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return csr.Status.Conditions
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(conditions("custom-good")) > 0 && len(conditions("custom-extra-san")) > 0, nil
	})
	if err != nil {
		t.Fatalf("no decisions: %v", err)
	}
	want := "spec.signerName=" + customSigner
	selectors.Range(func(k, _ any) bool {
		if k.(string) != want {
			t.Errorf("listed CSRs with field selector %q, want %q", k, want)
		}
		return true
	})
	if _, ok := selectors.Load(want); !ok {
		t.Errorf("never listed CSRs with field selector %q", want)
	}
	if c := conditions("custom-good"); len(c) != 1 || c[0].Type != certificatesv1.CertificateApproved || c[0].Reason != ReasonApproved {
		t.Errorf("custom-good: conditions %+v, want one Approved", c)
	}
	if c := conditions("custom-extra-san"); len(c) != 1 || c[0].Type != certificatesv1.CertificateDenied || c[0].Reason != ReasonWrongSANs {
		t.Errorf("custom-extra-san: conditions %+v, want one Denied %s", c, ReasonWrongSANs)
	}
	// Let the workers see the remaining objects; neither may change.
	time.Sleep(200 * time.Millisecond)
	for _, name := range []string{"kubelet-serving-agent", "kubelet-serving-other"} {
		if c := conditions(name); len(c) != 0 {
			t.Errorf("%s: conditions %+v, want none (another signer's CSR)", name, c)
		}
	}
}

// agentCSR returns a good agent CSR from node n, created at created.
func agentCSR(t *testing.T, name, n string, created time.Time) *certificatesv1.CertificateSigningRequest {
	tmpl, csr := good()
	tmpl.Subject.CommonName = "system:node:" + n
	csr.Spec.Extra = map[string]certificatesv1.ExtraValue{NodeNameExtra: {n}}
	csr.Name = name
	csr.CreationTimestamp = metav1.NewTime(created)
	csr.Spec.Request = encode(t, tmpl, ecKey)
	return csr
}

// TestControllerIgnoresUseless: given, besides a fresh CSR, one older than
// MaxAge and, from one node, an older and a newer CSR, the controller
// approves the fresh one and the newer one, leaves the stale one and the
// superseded one pending (also once the newer one is decided), and counts
// both in its metrics.
func TestControllerIgnoresUseless(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now()
	client := fake.NewClientset(
		agentCSR(t, "fresh", "node-a", now.Add(-time.Minute)),
		agentCSR(t, "stale", "node-b", now.Add(-13*time.Hour)),
		agentCSR(t, "older", "node-c", now.Add(-2*time.Hour)),
		agentCSR(t, "newer", "node-c", now.Add(-time.Hour)),
	)
	m := NewMetrics()
	c := NewController(client, testPolicy(), ControllerOptions{MaxAge: 12 * time.Hour, Metrics: m, Clock: clocktesting.NewFakePassiveClock(now)})
	go func() { _ = c.Run(ctx, 2) }()

	get := func(name string) *certificatesv1.CertificateSigningRequest {
		csr, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return csr
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(get("fresh").Status.Conditions) > 0 && len(get("newer").Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("no decisions: %v", err)
	}
	// Let the workers see the approval of "newer" and everything else.
	time.Sleep(300 * time.Millisecond)
	for _, name := range []string{"fresh", "newer"} {
		if c := get(name).Status.Conditions; len(c) != 1 || c[0].Type != certificatesv1.CertificateApproved {
			t.Errorf("%s: conditions %+v, want Approved", name, c)
		}
	}
	for _, name := range []string{"stale", "older"} {
		if c := get(name).Status.Conditions; len(c) != 0 {
			t.Errorf("%s: conditions %+v, want none", name, c)
		}
	}
	for reason, want := range map[string]float64{"stale": 1, "superseded": 1} {
		if got := testutil.ToFloat64(m.ignored.WithLabelValues(reason)); got < want {
			t.Errorf("ignored{reason=%q} = %v, want at least %v", reason, got, want)
		}
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("approved", ReasonApproved)); got != 2 {
		t.Errorf("approved decisions %v, want 2", got)
	}
}

// TestTrim: the informer keeps a pending agent CSR whole but for its
// managed fields, and of a decided, stale or foreign CSR only what the
// skip checks and the node index read; trimming twice changes nothing.
func TestTrim(t *testing.T) {
	now := time.Now()
	c := NewController(fake.NewClientset(), testPolicy(), ControllerOptions{MaxAge: 12 * time.Hour, Clock: clocktesting.NewFakePassiveClock(now)})
	withFields := func(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequest {
		csr.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		csr.Annotations = map[string]string{"note": strings.Repeat("x", 1000)}
		return csr
	}
	pending := withFields(agentCSR(t, "pending", "node-a", now))
	got, _ := c.trim(pending)
	p := got.(*certificatesv1.CertificateSigningRequest)
	if p.ManagedFields != nil || len(p.Spec.Request) == 0 || p.Annotations["note"] == "" {
		t.Errorf("pending CSR trimmed to %+v, want it whole without managed fields", p)
	}

	decidedCSR := withFields(agentCSR(t, "decided", "node-a", now))
	decidedCSR.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Message: "long"}}
	decidedCSR.Status.Certificate = []byte(strings.Repeat("c", 1000))
	stale := withFields(agentCSR(t, "stale", "node-b", now.Add(-13*time.Hour)))
	// A kubelet's own serving CSR.
	foreign := withFields(agentCSR(t, "foreign", "node-a", now))
	foreign.Spec.Username = "system:node:node-a"
	foreign.Spec.Request = encode(t, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "system:node:node-a", Organization: []string{"system:nodes"}},
		DNSNames: []string{"node-a"}, IPAddresses: []net.IP{net.ParseIP("192.0.2.10")},
	}, ecKey)
	for _, csr := range []*certificatesv1.CertificateSigningRequest{decidedCSR, stale, foreign} {
		name, created, user := csr.Name, csr.CreationTimestamp, csr.Spec.Username
		wantDecided := decided(csr)
		got, _ := c.trim(csr)
		stub := got.(*certificatesv1.CertificateSigningRequest)
		if stub.Name != name || !stub.CreationTimestamp.Equal(&created) || stub.Spec.Username != user || decided(stub) != wantDecided {
			t.Errorf("%s: stub %+v lost what the checks read", name, stub)
		}
		if len(stub.Spec.Request) > 0 || len(stub.Status.Certificate) > 0 || stub.Annotations != nil || stub.ManagedFields != nil {
			t.Errorf("%s: stub %+v keeps what no check reads", name, stub)
		}
		nodes, _ := c.nodeOf(stub)
		if wantNodes, _ := c.nodeOf(csr); !slices.Equal(nodes, wantNodes) {
			t.Errorf("%s: stub indexed under %v, want %v", name, nodes, wantNodes)
		}
		again, _ := c.trim(stub.DeepCopy())
		if !apiequality.Semantic.DeepEqual(again, stub) {
			t.Errorf("%s: trimming twice changed the stub: %+v", name, again)
		}
	}
}
