// Package keypair parses the certificates and keys the agent's listeners
// serve: with the leaf parsed, and, for content that changes (files that
// k8s.io/apiserver's dynamic certificate content rereads), once per change
// rather than once per handshake.
package keypair

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
)

// Parse parses a PEM certificate chain and its private key, and the chain's
// first certificate as the pair's Leaf.
func Parse(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate and key: %w", err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parsing the certificate: %w", err)
		}
	}
	return &pair, nil
}

// Content is a certificate and key that may change, as k8s.io/apiserver's
// dynamiccertificates content provides them.
type Content interface {
	CurrentCertKeyContent() (certPEM, keyPEM []byte)
}

// Cached is the parsed pair of a Content's present certificate and key.
type Cached struct {
	content Content

	mu sync.Mutex // protects the fields below
	// The last pair parsed, kept while the certificate is the same.
	certPEM []byte
	pair    *tls.Certificate
}

// NewCached returns the parsed pair of content; it parses nothing yet.
func NewCached(content Content) *Cached { return &Cached{content: content} }

// Get returns the pair of the content's present certificate and key,
// parsing them only when the certificate has changed since the last call.
// A content that does not parse is an error on every call until it
// changes to one that does.
func (c *Cached) Get() (*tls.Certificate, error) {
	certPEM, keyPEM := c.content.CurrentCertKeyContent()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pair != nil && bytes.Equal(certPEM, c.certPEM) {
		return c.pair, nil
	}
	pair, err := Parse(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	c.certPEM, c.pair = certPEM, pair
	return pair, nil
}
