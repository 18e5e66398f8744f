package webhookproxy

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// writePair writes a new self-signed certificate for host and its key
// into dir, and returns the files.
func writePair(t *testing.T, dir, host string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestServingCertificate: the pair is loaded, refused when it is not one,
// and served anew once the files change.
func TestServingCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "first.test")
	c, err := NewServingCertificate(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetCertificate(nil)
	if err != nil || got.Leaf.Subject.CommonName == "" || !strings.HasPrefix(got.Leaf.Subject.CommonName, "first.test") {
		t.Fatalf("certificate %v, %v; want first.test's", got, err)
	}
	writePair(t, dir, "second.test")
	if err := c.content.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetCertificate(nil); err != nil || !strings.HasPrefix(got.Leaf.Subject.CommonName, "second.test") {
		t.Errorf("after the files changed: %v, %v; want second.test's", got.Leaf.Subject.CommonName, err)
	}

	if _, err := NewServingCertificate(filepath.Join(dir, "missing.crt"), keyFile); err == nil {
		t.Error("a missing certificate file: no error")
	}
	other := t.TempDir()
	_, otherKey := writePair(t, other, "other.test")
	if _, err := NewServingCertificate(certFile, otherKey); err == nil {
		t.Error("a key of another certificate: no error")
	}
}

// writeCA writes the webhook server's certificate as a CA bundle.
func writeCA(t *testing.T, path string, srv *httptest.Server) {
	t.Helper()
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBackendTLS: the webhook server is verified against the CA bundle,
// for the backend's host or the name given, and the bundle is reread when
// it changes.
func TestBackendTLS(t *testing.T) {
	// httptest's certificate names example.com and 127.0.0.1.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	writeCA(t, ca, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	get := func(tr *http.Transport) error {
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(srv.URL)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name string
		b    BackendTLS
		ok   bool
	}{
		{"the backend's IP", BackendTLS{CAFile: ca}, true},
		{"a name the certificate carries", BackendTLS{CAFile: ca, ServerName: "example.com"}, true},
		{"a name it does not carry", BackendTLS{CAFile: ca, ServerName: "webhook.widgets.svc"}, false},
		{"system roots", BackendTLS{}, false},
	} {
		tr, err := tc.b.Transport(ctx, u)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := get(tr); (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want success %v", tc.name, err, tc.ok)
		}
	}

	// A bundle of another CA, replaced by the right one. (httptest's
	// servers all share one certificate: the other CA is made here.)
	otherCA, _ := writePair(t, t.TempDir(), "other.test")
	rotated := filepath.Join(dir, "rotated.crt")
	b, err := os.ReadFile(otherCA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rotated, b, 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := BackendTLS{CAFile: rotated}.Transport(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if err := get(tr); err == nil || !strings.Contains(err.Error(), "verifying the webhook server's certificate") {
		t.Errorf("with another CA: error %v, want a verification failure", err)
	}
	writeCA(t, rotated, srv)
	deadline := time.Now().Add(30 * time.Second)
	for get(tr) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the rewritten CA bundle was not reread within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	if _, err := (BackendTLS{CAFile: filepath.Join(dir, "missing.crt")}).Transport(ctx, u); err == nil {
		t.Error("a missing CA bundle: no error")
	}
	empty := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(empty, []byte("no certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (BackendTLS{CAFile: empty}).Transport(ctx, u); err == nil {
		t.Error("a CA bundle without a certificate: no error")
	}
}

// TestBackendPlainHTTP: an http:// backend gets no TLS configuration.
func TestBackendPlainHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	tr, err := BackendTLS{}.Transport(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}
