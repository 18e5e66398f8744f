package keypair

import (
	"strings"
	"sync"
	"testing"

	certutil "k8s.io/client-go/util/cert"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// files is a Content whose certificate and key the test sets.
type files struct {
	mu        sync.Mutex
	cert, key []byte
}

func (f *files) set(cert, key []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cert, f.key = cert, key
}

func (f *files) CurrentCertKeyContent() ([]byte, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cert, f.key
}

func selfSigned(t *testing.T, host string) (cert, key []byte) {
	t.Helper()
	cert, key, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestCached: the pair is parsed, with its leaf, once per change of the
// certificate; content that does not parse is an error until it changes
// to content that does.
func TestCached(t *testing.T) {
	f := &files{}
	c := NewCached(f)
	if _, err := c.Get(); err == nil {
		t.Fatal("no content: no error")
	}
	cert, key := selfSigned(t, "one.example")
	f.set(cert, key)
	first, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	if first.Leaf == nil || !strings.HasPrefix(first.Leaf.Subject.CommonName, "one.example@") {
		t.Fatalf("leaf %v, want one.example's", first.Leaf)
	}
	// The same content as fresh slices: not parsed again.
	f.set(append([]byte(nil), cert...), append([]byte(nil), key...))
	if again, err := c.Get(); err != nil || again != first {
		t.Fatalf("unchanged content: %p, %v; want the pair parsed before (%p)", again, err, first)
	}

	otherCert, otherKey := selfSigned(t, "two.example")
	// A key that is not the certificate's.
	f.set(otherCert, key)
	if _, err := c.Get(); err == nil || !strings.Contains(err.Error(), "parsing the certificate and key") {
		t.Fatalf("a mismatched key: %v, want a parse error", err)
	}
	f.set(otherCert, otherKey)
	second, err := c.Get()
	if err != nil {
		t.Fatal(err)
	}
	if second == first || !strings.HasPrefix(second.Leaf.Subject.CommonName, "two.example@") {
		t.Fatalf("after a change: leaf %q, want two.example's", second.Leaf.Subject.CommonName)
	}
}

// TestImports: the package depends on no other of the module's.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/internal/keypair")
}
