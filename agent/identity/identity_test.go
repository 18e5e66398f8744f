package identity

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testCA is a CA for tests.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

var serial atomic.Int64

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leafSpec describes a leaf the CA issues.
type leafSpec struct {
	dns       []string
	ips       []net.IP
	usages    []x509.ExtKeyUsage
	notBefore time.Time
	notAfter  time.Time
	pub       crypto.PublicKey
}

// issue returns the leaf's PEM, and the key PEM if spec.pub was nil.
func (ca *testCA) issue(t *testing.T, s leafSpec) (certPEM, keyPEM []byte) {
	t.Helper()
	if s.notBefore.IsZero() {
		s.notBefore = time.Now().Add(-time.Minute)
	}
	if s.notAfter.IsZero() {
		s.notAfter = time.Now().Add(time.Hour)
	}
	if s.usages == nil {
		s.usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	pub := s.pub
	if pub == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pub = key.Public()
		der, _ := x509.MarshalECPrivateKey(key)
		keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: "system:node:n", Organization: []string{"system:nodes"}},
		DNSNames:     s.dns, IPAddresses: s.ips,
		NotBefore: s.notBefore, NotAfter: s.notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: s.usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

func testSANs() SANs {
	return ServingSANs([]netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")}, []netip.Addr{netip.MustParseAddr("169.254.25.10")}, "cluster.local")
}

func TestServingSANs(t *testing.T) {
	s := ServingSANs([]netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("::ffff:10.96.0.1"), netip.MustParseAddr("fd00::1")},
		[]netip.Addr{netip.MustParseAddr("169.254.25.10"), netip.MustParseAddr("fd00:169:254:25::10"), {}}, "example.org")
	wantDNS := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.example.org"}
	if strings.Join(s.DNSNames, ",") != strings.Join(wantDNS, ",") {
		t.Errorf("DNSNames = %v, want %v", s.DNSNames, wantDNS)
	}
	if got := strings.Join(s.all()[4:], ","); got != "10.96.0.1,fd00::1,169.254.25.10,fd00:169:254:25::10" {
		t.Errorf("IPs = %s, want the VIPs (deduplicated) then the listen IPs of both families", got)
	}
}

func TestVerify(t *testing.T) {
	ca, other := newTestCA(t, "cluster-ca"), newTestCA(t, "other-ca")
	sans := testSANs()
	all := leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	tests := []struct {
		name    string
		ca      *testCA
		spec    leafSpec
		roots   *x509.CertPool
		wantErr string // empty: verifies
	}{{
		name: "issued by the pods' CA for every name",
		ca:   ca, spec: all,
	}, {
		name: "another CA",
		ca:   other, spec: all,
		wantErr: `does not verify for kubernetes with the pods' CA bundle: x509: certificate signed by unknown authority`,
	}, {
		name: "missing the cluster-domain name",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames[:3], ips: sans.NetIPs()},
		wantErr: "does not verify for kubernetes.default.svc.cluster.local",
	}, {
		name: "missing the IPv6 VIP",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()[:1]},
		wantErr: "does not verify for fd00::1",
	}, {
		name: "missing the listen IP",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()[:2]},
		wantErr: "does not verify for 169.254.25.10",
	}, {
		name: "client auth only",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames, ips: sans.NetIPs(), usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		wantErr: "lacks the server auth extended key usage",
	}, {
		name: "expired",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames, ips: sans.NetIPs(), notBefore: time.Now().Add(-2 * time.Hour), notAfter: time.Now().Add(-time.Hour)},
		wantErr: "is not valid now",
	}, {
		name: "not yet valid",
		ca:   ca, spec: leafSpec{dns: sans.DNSNames, ips: sans.NetIPs(), notBefore: time.Now().Add(time.Hour), notAfter: time.Now().Add(2 * time.Hour)},
		wantErr: "is not valid now",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, keyPEM := tc.ca.issue(t, tc.spec)
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			err = Verify(&pair, roots, sans, time.Now())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Verify = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	if err := Verify(nil, roots, sans, time.Now()); err == nil {
		t.Errorf("Verify(nil) = nil, want an error")
	}
}

// fakeBundle is a bundleSource whose content the test sets.
type fakeBundle struct{ v atomic.Pointer[[]byte] }

func (f *fakeBundle) set(b []byte)                   { f.v.Store(&b) }
func (f *fakeBundle) CurrentCABundleContent() []byte { return *f.v.Load() }

// TestTrustCheckFollowsBundle: the verdict changes when the CA bundle
// changes (a CA rotation that drops the certificate's issuer, then one that
// adds it back), and when the certificate expires.
func TestTrustCheckFollowsBundle(t *testing.T) {
	ca, other := newTestCA(t, "cluster-ca"), newTestCA(t, "other-ca")
	sans := testSANs()
	certPEM, keyPEM := ca.issue(t, leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	bundle := &fakeBundle{}
	bundle.set(ca.pem)
	tc := newTrustCheck(bundle, sans, func() time.Time { return now })
	if err := tc.check(&pair); err != nil {
		t.Fatalf("trusted: %v", err)
	}
	bundle.set(other.pem)
	if err := tc.check(&pair); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("after the bundle lost the issuer: %v, want unknown authority", err)
	}
	bundle.set(append(append([]byte{}, other.pem...), ca.pem...))
	if err := tc.check(&pair); err != nil {
		t.Errorf("after the bundle regained the issuer: %v", err)
	}
	bundle.set([]byte("garbage"))
	if err := tc.check(&pair); err == nil || !strings.Contains(err.Error(), "holds no certificate") {
		t.Errorf("garbage bundle: %v", err)
	}
	bundle.set(ca.pem)
	now = pair.Leaf.NotAfter.Add(time.Second)
	if err := tc.check(&pair); err == nil || !strings.Contains(err.Error(), "not valid now") {
		t.Errorf("after expiry: %v, want not valid now", err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFileSource: given files from a CA the pods do not trust, the source
// is not ready and says why; when the files are replaced with a trusted
// pair, it serves and is ready without being recreated.
func TestFileSource(t *testing.T) {
	ca, other := newTestCA(t, "cluster-ca"), newTestCA(t, "other-ca")
	sans := testSANs()
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, caFile, ca.pem)
	badCert, badKey := other.issue(t, leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()})
	writeFile(t, certFile, badCert)
	writeFile(t, keyFile, badKey)

	s, err := NewFileSource(certFile, keyFile, Options{NodeName: "n", SANs: sans, CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("Ready with an untrusted certificate = %v, want unknown authority", err)
	}

	goodCert, goodKey := ca.issue(t, leafSpec{dns: sans.DNSNames, ips: sans.NetIPs()})
	writeFile(t, keyFile, goodKey)
	writeFile(t, certFile, goodCert)
	deadline := time.Now().Add(20 * time.Second)
	for s.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready after the files changed: %v", s.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	served, err := s.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(goodCert)
	if string(served.Certificate[0]) != string(block.Bytes) {
		t.Errorf("served certificate is not the new file's")
	}
}

func TestNewFileSourceErrors(t *testing.T) {
	ca := newTestCA(t, "cluster-ca")
	sans := testSANs()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, ca.pem)
	expiredCert, expiredKey := ca.issue(t, leafSpec{dns: sans.DNSNames, notBefore: time.Now().Add(-2 * time.Hour), notAfter: time.Now().Add(-time.Hour)})
	writeFile(t, filepath.Join(dir, "expired.crt"), expiredCert)
	writeFile(t, filepath.Join(dir, "expired.key"), expiredKey)
	goodCert, goodKey := ca.issue(t, leafSpec{dns: sans.DNSNames})
	writeFile(t, filepath.Join(dir, "good.crt"), goodCert)
	writeFile(t, filepath.Join(dir, "good.key"), goodKey)
	tests := []struct{ name, cert, key, ca, want string }{
		{"missing certificate", "missing.crt", "good.key", "ca.crt", "loading serving certificate"},
		{"key of another certificate", "good.crt", "expired.key", "ca.crt", "loading serving certificate"},
		{"expired", "expired.crt", "expired.key", "ca.crt", "not valid now"},
		{"missing CA bundle", "good.crt", "good.key", "missing-ca.crt", "loading the pods' CA bundle"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewFileSource(filepath.Join(dir, tc.cert), filepath.Join(dir, tc.key), Options{SANs: sans, CAFile: filepath.Join(dir, tc.ca)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewFileSource = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
