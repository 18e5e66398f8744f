package identity

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// signingClient is a fake clientset that answers CSRs as they are created
// (the approver and kube-controller-manager in one): by default approved
// and signed by ca, or denied, or left pending. It keeps only the newest
// CSR, so that a wait for it sees no other, and remembers every one sent.
type signingClient struct {
	*fake.Clientset
	ca *testCA
	// mode is how new CSRs are answered.
	mode atomic.Int32
	// createErr makes every create fail.
	createErr atomic.Bool
	// creates counts create calls, failed ones included.
	creates atomic.Int32
	// issueFor, if not zero, is the lifetime of the certificates issued
	// (a time.Duration), whatever the CSR asks for, as a signer that sets
	// the lifetime itself does.
	issueFor atomic.Int64

	mu   sync.Mutex // protects the fields below
	csrs []*certificatesv1.CertificateSigningRequest
	// issued holds the certificate signed for each CSR, by name.
	issued map[string][]byte
}

const (
	modeApprove int32 = iota
	modeDeny
	modePending
)

var csrResource = certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")

func newSigningClient(t *testing.T, ca *testCA) *signingClient {
	c := &signingClient{Clientset: fake.NewClientset(), ca: ca, issued: map[string][]byte{}}
	c.PrependReactor("create", "certificatesigningrequests", func(action clienttesting.Action) (bool, runtime.Object, error) {
		c.creates.Add(1)
		if c.createErr.Load() {
			return true, nil, apierrors.NewServiceUnavailable("apiserver is down")
		}
		csr := action.(clienttesting.CreateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, old := range c.csrs {
			_ = c.Tracker().Delete(csrResource, "", old.Name)
		}
		csr.Name = fmt.Sprintf("csr-%d", len(c.csrs)+1)
		csr.UID = types.UID(csr.Name)
		csr.CreationTimestamp = metav1.Now()
		block, _ := pem.Decode(csr.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			t.Errorf("CSR %s: %v", csr.Name, err)
			return true, nil, err
		}
		life := time.Duration(*csr.Spec.ExpirationSeconds) * time.Second
		if d := c.issueFor.Load(); d != 0 {
			life = time.Duration(d)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial.Add(1)), Subject: req.Subject,
			DNSNames: req.DNSNames, IPAddresses: req.IPAddresses,
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(life),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca.cert, req.PublicKey, c.ca.key)
		if err != nil {
			return true, nil, err
		}
		c.issued[csr.Name] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		switch c.mode.Load() {
		case modeDeny:
			csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "WrongSubjectAltNames"}}
		case modeApprove:
			csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
			csr.Status.Certificate = c.issued[csr.Name]
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

// approve approves and issues the pending CSR name.
func (c *signingClient) approve(t *testing.T, name string) {
	t.Helper()
	csr := c.stored(t, name).DeepCopy()
	c.mu.Lock()
	csr.Status.Certificate = c.issued[name]
	c.mu.Unlock()
	csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
	if err := c.Tracker().Update(csrResource, csr, ""); err != nil {
		t.Fatal(err)
	}
}

// stored waits until the tracker holds the CSR name and returns it: the
// create reactor counts a CSR before the tracker stores it.
func (c *signingClient) stored(t *testing.T, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var obj runtime.Object
	waitFor(t, "CSR "+name+" to be stored", func() bool {
		var err error
		obj, err = c.Tracker().Get(csrResource, "", name)
		return err == nil
	})
	return obj.(*certificatesv1.CertificateSigningRequest)
}

// fastSource returns a CSR source for node-a with a short backoff, a
// ten-minute lifetime and, if dir is not empty, that state directory.
func fastSource(t *testing.T, client kubernetes.Interface, caFile, dir string, sans SANs) *CSRSource {
	t.Helper()
	s, err := NewCSRSource(Options{NodeName: "node-a", SANs: sans, CAFile: caFile, StateDir: dir}, 10*time.Minute,
		func() (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	s.backoff = wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 80 * time.Millisecond}
	return s
}

// run runs s until the returned function is called, which waits for Run
// to return.
func run(s *CSRSource) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// counter returns the value of s's renewals counter for result.
func counter(s *CSRSource, result string) float64 {
	return testutil.ToFloat64(s.renewals.WithLabelValues(result))
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
	if _, err := NewCSRSource(Options{NodeName: "n", CAFile: caFile, SignerName: "example.com"}, time.Hour, none); err == nil || !strings.Contains(err.Error(), "signer name") {
		t.Errorf("signer name without a path: %v, want the signer name error", err)
	}
}

// TestCSRSourceCustomSigner: a source configured for another signer asks
// that signer, says so while it waits, and saves the certificate as that
// signer's. Restarted with the same signer it reuses the certificate; with
// another one (here the default) it refuses it, saying which signer issued
// it, and sends a CSR to the signer it is now configured for.
func TestCSRSourceCustomSigner(t *testing.T) {
	const custom = "clusterissuers.cert-manager.io/kube-apicache"
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	dir := t.TempDir()
	source := func(signer string) *CSRSource {
		t.Helper()
		s, err := NewCSRSource(Options{NodeName: "node-a", SANs: testSANs(), CAFile: caFile, StateDir: dir, SignerName: signer}, 10*time.Minute,
			func() (kubernetes.Interface, error) { return client, nil })
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	s1 := source(custom)
	if err := s1.Ready(); err == nil || !strings.Contains(err.Error(), "(signer "+custom+")") {
		t.Errorf("Ready before Run = %v, want the wait naming signer %s", err, custom)
	}
	stop := run(s1)
	waitFor(t, "the first certificate", func() bool { return s1.Ready() == nil })
	stop()
	sent := client.sent()
	if len(sent) != 1 {
		t.Fatalf("sent %d CSRs, want 1", len(sent))
	}
	if sent[0].Spec.SignerName != custom {
		t.Errorf("sent a CSR for signer %q, want %s", sent[0].Spec.SignerName, custom)
	}

	s2 := source(custom)
	stop = run(s2)
	waitFor(t, "the reused certificate", func() bool { return s2.Ready() == nil })
	stop()
	if got := counter(s2, "reused"); got != 1 {
		t.Errorf("same signer: reused counter %v, want 1", got)
	}

	s3 := source("")
	st, err := s3.state.load()
	if err != nil || st == nil {
		t.Fatalf("loading the saved state: %v, %v", st, err)
	}
	if pair, why := s3.reusable(st); pair != nil || !strings.Contains(why, `signer "`+custom+`"`) || !strings.Contains(why, `signer "kubernetes.io/kubelet-serving"`) {
		t.Errorf("reusable for another signer = %v, %q; want a refusal naming both signers", pair != nil, why)
	}
	stop = run(s3)
	defer stop()
	waitFor(t, "a certificate from the default signer", func() bool { return client.creates.Load() == 2 && s3.Ready() == nil })
	if got := counter(s3, "reused"); got != 0 {
		t.Errorf("reused a certificate from another signer")
	}
	if sent = client.sent(); sent[len(sent)-1].Spec.SignerName != DefaultSignerName {
		t.Errorf("after the change, sent a CSR for signer %q, want %s", sent[len(sent)-1].Spec.SignerName, DefaultSignerName)
	}
}

// caBundle returns a test CA and a file holding its certificate, as the
// pods' CA bundle.
func caBundle(t *testing.T) (*testCA, string) {
	t.Helper()
	ca := newTestCA(t, "cluster-ca")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, ca.pem)
	return ca, caFile
}

// TestRequestBackoff: the agents' backoff doubles from 2s and stays at 15m.
func TestRequestBackoff(t *testing.T) {
	b := RequestBackoff
	b.Jitter = 0
	var got []time.Duration
	for range 12 {
		got = append(got, b.Step())
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second,
		128 * time.Second, 256 * time.Second, 512 * time.Second, 15 * time.Minute, 15 * time.Minute, 15 * time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("backoff steps %v, want %v", got, want)
	}
}

// TestCSRSourceDenied: a denial is final. Given an approver that denies
// every request, the source sends one CSR, says why on Ready and in its
// metrics, and sends no other while its backoff would have retried many
// times. Renew (SIGHUP) clears the denial and sends exactly one more.
func TestCSRSourceDenied(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	client.mode.Store(modeDeny)
	s := fastSource(t, client, caFile, "", testSANs())
	stop := run(s)
	defer stop()
	waitFor(t, "the denial", func() bool {
		err := s.Ready()
		return err != nil && strings.Contains(err.Error(), "CertificateSigningRequest csr-1 was denied (WrongSubjectAltNames")
	})
	time.Sleep(500 * time.Millisecond) // more than six backoff periods
	if n := client.creates.Load(); n != 1 {
		t.Errorf("sent %d CSRs after a denial, want 1", n)
	}
	if got := counter(s, "denied"); got != 1 {
		t.Errorf("denied counter %v, want 1", got)
	}
	if s.Current() != nil {
		t.Errorf("a denied request produced a certificate")
	}

	s.Renew()
	waitFor(t, "the second denial", func() bool { return counter(s, "denied") == 2 })
	time.Sleep(300 * time.Millisecond)
	if n := client.creates.Load(); n != 2 {
		t.Errorf("sent %d CSRs after Renew, want 2", n)
	}
}

// TestCSRSourceBackoff: while CSRs cannot be created, attempts are spaced
// by the exponential backoff up to its cap and Ready counts the failures;
// once creation works, the certificate is issued.
func TestCSRSourceBackoff(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	client.createErr.Store(true)
	var mu sync.Mutex
	var times []time.Time
	client.PrependReactor("create", "certificatesigningrequests", func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return false, nil, nil
	})
	s := fastSource(t, client, caFile, "", testSANs())
	stop := run(s)
	defer stop()
	waitFor(t, "seven attempts", func() bool { return client.creates.Load() >= 7 })
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "request(s) failed so far") {
		t.Errorf("Ready = %v, want the failures counted", err)
	}
	client.createErr.Store(false)
	waitFor(t, "the certificate", func() bool { return s.Ready() == nil })

	mu.Lock()
	defer mu.Unlock()
	// Timers never fire early: each gap is at least its backoff step
	// (20ms doubling to the 80ms cap). Uncapped, the sixth would be 640ms.
	want := []time.Duration{20, 40, 80, 80, 80, 80}
	for i, w := range want {
		gap := times[i+1].Sub(times[i])
		if gap < w*time.Millisecond-time.Millisecond {
			t.Errorf("gap %d = %v, want at least %dms", i+1, gap, w)
		}
		if i == 5 && gap >= 640*time.Millisecond {
			t.Errorf("gap %d = %v: the backoff is not capped", i+1, gap)
		}
	}
	if got := counter(s, "failed"); got < 6 {
		t.Errorf("failed counter %v, want at least 6", got)
	}
	if got := counter(s, "issued"); got != 1 {
		t.Errorf("issued counter %v, want 1", got)
	}
}

// TestCSRSourceReuse: with a state directory, a restarted source (the next
// container in the pod) serves the saved certificate without a CSR; the
// saved file is 0600. A source whose clock is past 90% of the
// certificate's lifetime, or with other SANs, does not reuse it and sends
// a CSR.
func TestCSRSourceReuse(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	dir := t.TempDir()
	sans := testSANs()

	s1 := fastSource(t, client, caFile, dir, sans)
	stop := run(s1)
	waitFor(t, "the first certificate", func() bool { return s1.Ready() == nil })
	first := s1.Current().Leaf
	stop()
	info, err := os.Stat(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", info.Mode().Perm())
	}

	s2 := fastSource(t, client, caFile, dir, sans)
	stop = run(s2)
	waitFor(t, "the reused certificate", func() bool { return s2.Ready() == nil })
	if got := s2.Current().Leaf.SerialNumber; got.Cmp(first.SerialNumber) != 0 {
		t.Errorf("restarted source serves serial %s, want the saved %s", got, first.SerialNumber)
	}
	time.Sleep(100 * time.Millisecond)
	if n := client.creates.Load(); n != 1 {
		t.Errorf("sent %d CSRs across a restart, want 1", n)
	}
	if got := counter(s2, "reused"); got != 1 {
		t.Errorf("reused counter %v, want 1", got)
	}
	stop()

	late := fastSource(t, client, caFile, dir, sans)
	// 10m lifetime, backdated 1m: at +9.5m 30s of 11m are left.
	late.opts.Now = func() time.Time { return time.Now().Add(9*time.Minute + 30*time.Second) }
	stop = run(late)
	waitFor(t, "a new certificate near expiry", func() bool { return client.creates.Load() == 2 && late.Ready() == nil })
	if got := counter(late, "reused"); got != 0 {
		t.Errorf("reused a certificate with 30s left")
	}
	stop()

	other := ServingSANs([]netip.Addr{netip.MustParseAddr("10.96.0.1")}, []netip.Addr{netip.MustParseAddr("169.254.25.10")}, "example.org")
	s3 := fastSource(t, client, caFile, dir, other)
	stop = run(s3)
	waitFor(t, "a certificate for the new names", func() bool { return client.creates.Load() == 3 && s3.Ready() == nil })
	if got := counter(s3, "reused"); got != 0 {
		t.Errorf("reused a certificate for other names")
	}
	stop()
}

// TestCSRSourceResumesPending: a source restarted while its CSR is pending
// waits for that CSR instead of sending a second one, and serves the
// certificate issued for it with the key the first process generated.
func TestCSRSourceResumesPending(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	client.mode.Store(modePending)
	dir := t.TempDir()

	s1 := fastSource(t, client, caFile, dir, testSANs())
	stop := run(s1)
	waitFor(t, "the pending CSR", func() bool {
		err := s1.Ready()
		return err != nil && strings.Contains(err.Error(), "(csr-1)")
	})
	stop()

	s2 := fastSource(t, client, caFile, dir, testSANs())
	stop = run(s2)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	if n := client.creates.Load(); n != 1 {
		t.Fatalf("sent %d CSRs across a restart with a pending one, want 1", n)
	}
	client.approve(t, "csr-1")
	waitFor(t, "the certificate of the resumed CSR", func() bool { return s2.Ready() == nil })
	if n := client.creates.Load(); n != 1 {
		t.Errorf("sent %d CSRs, want 1", n)
	}
}

// TestCSRSourcePendingTimeout: a CSR nobody answers within the pending
// timeout is given up and, after the backoff, replaced by one with a new
// key; a CSR deleted while pending is replaced too. One CSR at a time.
func TestCSRSourcePendingTimeout(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	client.mode.Store(modePending)
	s := fastSource(t, client, caFile, "", testSANs())
	s.pendingTimeout = 300 * time.Millisecond
	start := time.Now()
	stop := run(s)
	defer func() { stop() }()
	waitFor(t, "the replacement", func() bool { return len(client.sent()) == 2 })
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("replaced the pending CSR after %v, before the 300ms timeout", d)
	}
	sent := client.sent()
	if bytes.Equal(sent[0].Spec.Request, sent[1].Spec.Request) {
		t.Errorf("the replacement reused the request")
	}
	if got := counter(s, "failed"); got < 1 {
		t.Errorf("failed counter %v, want the timeout counted", got)
	}

	stop()

	client = newSigningClient(t, ca)
	client.mode.Store(modePending)
	s = fastSource(t, client, caFile, "", testSANs())
	stop = run(s)
	waitFor(t, "the first CSR", func() bool { return client.creates.Load() == 1 })
	client.stored(t, "csr-1")
	if err := client.Tracker().Delete(csrResource, "", "csr-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CSR after the deletion", func() bool { return client.creates.Load() == 2 })
	client.approve(t, "csr-2")
	waitFor(t, "the certificate", func() bool { return s.Ready() == nil })
}

// TestCSRSourceDenialRemembered: a denial saved in the state directory
// holds across a restart with the same configuration (no CSR is sent), and
// is forgotten when the request changes (another lifetime).
func TestCSRSourceDenialRemembered(t *testing.T) {
	ca, caFile := caBundle(t)
	client := newSigningClient(t, ca)
	client.mode.Store(modeDeny)
	dir := t.TempDir()

	s1 := fastSource(t, client, caFile, dir, testSANs())
	stop := run(s1)
	waitFor(t, "the denial", func() bool { return counter(s1, "denied") == 1 })
	stop()

	s2 := fastSource(t, client, caFile, dir, testSANs())
	stop = run(s2)
	waitFor(t, "the remembered denial", func() bool {
		err := s2.Ready()
		return err != nil && strings.Contains(err.Error(), "csr-1 was denied")
	})
	time.Sleep(200 * time.Millisecond)
	if n := client.creates.Load(); n != 1 {
		t.Errorf("sent %d CSRs after a restart with a denial, want 1", n)
	}
	stop()

	client.mode.Store(modeApprove)
	s3, err := NewCSRSource(Options{NodeName: "node-a", SANs: testSANs(), CAFile: caFile, StateDir: dir}, 20*time.Minute,
		func() (kubernetes.Interface, error) { return client, nil })
	if err != nil {
		t.Fatal(err)
	}
	stop = run(s3)
	defer stop()
	waitFor(t, "a certificate for the new lifetime", func() bool { return s3.Ready() == nil })
	if n := client.creates.Load(); n != 2 {
		t.Errorf("sent %d CSRs, want 2", n)
	}
}

// TestCSRSourceIssuedLifetime: the signer, not the CSR, has the last word
// on the lifetime. Whatever the certificate's lifetime, the source serves
// it and renews at 70-90% of the lifetime it was issued for (NotBefore to
// NotAfter), not of the one it asked for.
func TestCSRSourceIssuedLifetime(t *testing.T) {
	const year = 365 * 24 * time.Hour
	tests := []struct {
		name   string
		signer string
		// asked is the lifetime the source asks for, issued the one the
		// signer grants.
		asked, issued time.Duration
	}{
		// EKS's beta.eks.amazonaws.com/app-serving ignores
		// expirationSeconds and issues for one year.
		{"one year when a day was asked", "beta.eks.amazonaws.com/app-serving", 24 * time.Hour, year},
		// A signer whose maximum is below the lifetime asked for.
		{"shorter than asked", DefaultSignerName, 24 * time.Hour, time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca, caFile := caBundle(t)
			client := newSigningClient(t, ca)
			client.issueFor.Store(int64(tc.issued))
			s, err := NewCSRSource(Options{NodeName: "node-a", SANs: testSANs(), CAFile: caFile, SignerName: tc.signer}, tc.asked,
				func() (kubernetes.Interface, error) { return client, nil })
			if err != nil {
				t.Fatal(err)
			}
			stop := run(s)
			defer stop()
			waitFor(t, "the certificate", func() bool { return s.Ready() == nil })

			sent := client.sent()
			if len(sent) != 1 {
				t.Fatalf("sent %d CSRs, want 1", len(sent))
			}
			if got := int64(*sent[0].Spec.ExpirationSeconds); got != int64(tc.asked/time.Second) {
				t.Errorf("expirationSeconds = %d, want %d", got, int64(tc.asked/time.Second))
			}
			if got := sent[0].Spec.Usages; !slices.Equal(got, RequestUsages(tc.signer)) {
				t.Errorf("usages = %q, want %q", got, RequestUsages(tc.signer))
			}
			leaf := s.Current().Leaf
			total := leaf.NotAfter.Sub(leaf.NotBefore)
			earliest := leaf.NotBefore.Add(time.Duration(float64(total) * 0.7))
			latest := leaf.NotBefore.Add(time.Duration(float64(total) * 0.9))
			if at := s.renewAt(); at.Before(earliest) || at.After(latest) {
				t.Errorf("renewal at %s; want between %s and %s (70-90%% of the issued %s, not of the %s asked)",
					at.Format(time.RFC3339), earliest.Format(time.RFC3339), latest.Format(time.RFC3339), total, tc.asked)
			}
			// No renewal is due: the source keeps the certificate.
			time.Sleep(100 * time.Millisecond)
			if n := client.creates.Load(); n != 1 || s.Ready() != nil {
				t.Errorf("after the certificate was issued: %d CSRs sent, Ready %v; want 1 and nil", n, s.Ready())
			}
		})
	}
}

// TestRotationDeadline: the deadline is 70-90% into the certificate's own
// validity, for a year-long certificate as for a ten-minute one.
func TestRotationDeadline(t *testing.T) {
	notBefore := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, life := range []time.Duration{10 * time.Minute, 24 * time.Hour, 365 * 24 * time.Hour} {
		leaf := &x509.Certificate{NotBefore: notBefore, NotAfter: notBefore.Add(life)}
		for range 100 {
			got := rotationDeadline(leaf).Sub(notBefore)
			if got < time.Duration(float64(life)*0.7) || got > time.Duration(float64(life)*0.9) {
				t.Fatalf("lifetime %s: deadline %s after NotBefore, want 70-90%%", life, got)
			}
		}
	}
}
