package identity

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Verify checks that cert can stand in for kube-apiserver: its leaf is
// valid at now, is meant for server authentication, and chains to roots
// (the pods' CA bundle) for every DNS name and IP in want. The error names
// the first name that fails and why.
func Verify(cert *tls.Certificate, roots *x509.CertPool, want SANs, now time.Time) error {
	if cert == nil || len(cert.Certificate) == 0 {
		return errors.New("no serving certificate yet")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("parsing serving certificate: %w", err)
		}
	}
	if err := checkValidity(leaf, now); err != nil {
		return err
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		return fmt.Errorf("serving certificate (serial %s) lacks the server auth extended key usage", leaf.SerialNumber)
	}
	if roots == nil {
		return errors.New("no CA bundle to verify the serving certificate against")
	}
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parsing serving certificate chain: %w", err)
		}
		intermediates.AddCert(c)
	}
	for _, name := range want.all() {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName:       name,
			Roots:         roots,
			Intermediates: intermediates,
			CurrentTime:   now,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("serving certificate (serial %s, issuer %q) does not verify for %s with the pods' CA bundle: %w",
				leaf.SerialNumber, leaf.Issuer.String(), name, err)
		}
	}
	return nil
}

func checkValidity(leaf *x509.Certificate, now time.Time) error {
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return fmt.Errorf("serving certificate (serial %s) is not valid now (valid %s to %s)", leaf.SerialNumber,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// bundleSource supplies the pods' CA bundle (PEM) as it is now.
type bundleSource interface {
	CurrentCABundleContent() []byte
}

// trustCheck runs Verify for the current certificate and CA bundle. The
// chain verification is repeated when either changes, and at least every
// recheckPeriod (so an expiring CA is noticed); the leaf's validity window
// is checked on every call.
type trustCheck struct {
	// Fixed at construction.
	bundle bundleSource
	sans   SANs
	now    func() time.Time

	mu sync.Mutex // protects the fields below
	// The inputs and result of the last full verification.
	cert      *tls.Certificate
	caPEM     []byte
	checkedAt time.Time
	err       error
}

const recheckPeriod = time.Minute

func newTrustCheck(bundle bundleSource, sans SANs, now func() time.Time) *trustCheck {
	return &trustCheck{bundle: bundle, sans: sans, now: now}
}

// check returns nil if cert may serve pods now, else the reason.
func (t *trustCheck) check(cert *tls.Certificate) error {
	if cert == nil {
		return errors.New("no serving certificate yet")
	}
	caPEM := t.bundle.CurrentCABundleContent()
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if cert != t.cert || !bytes.Equal(caPEM, t.caPEM) || now.Sub(t.checkedAt) >= recheckPeriod || now.Before(t.checkedAt) {
		t.cert, t.caPEM, t.checkedAt = cert, caPEM, now
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			t.err = errors.New("the pods' CA bundle holds no certificate")
		} else {
			t.err = Verify(cert, roots, t.sans, now)
		}
	}
	if t.err != nil || cert.Leaf == nil {
		return t.err
	}
	return checkValidity(cert.Leaf, now)
}
