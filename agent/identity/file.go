package identity

import (
	"context"
	"crypto/tls"
	"fmt"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/keypair"
)

var _ Source = (*FileSource)(nil)

// FileSource serves a certificate and key that an operator provides (for
// example from cert-manager), reloading them when the files change
// (k8s.io/apiserver's dynamic serving content watches them). The same trust
// check as for a CSR-issued certificate decides whether it may be used.
type FileSource struct {
	// Fixed at construction.
	content *dynamiccertificates.DynamicCertKeyPairContent
	ca      *dynamiccertificates.DynamicFileCAContent
	trust   *trustCheck
	pair    *keypair.Cached
}

// NewFileSource loads the certificate, key and CA bundle files. It fails if
// they cannot be read or parsed, or if the certificate is not valid now; a
// certificate the CA bundle does not verify is not an error here but keeps
// Ready failing.
func NewFileSource(certFile, keyFile string, o Options) (*FileSource, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading serving certificate: %w", err)
	}
	ca, err := newCAContent(o.CAFile)
	if err != nil {
		return nil, err
	}
	s := &FileSource{content: content, ca: ca, trust: newTrustCheck(ca, o.SANs, o.now()), pair: keypair.NewCached(content)}
	pair, err := s.current()
	if err != nil {
		return nil, err
	}
	if err := checkValidity(pair.Leaf, o.now()()); err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	return s, nil
}

// newCAContent loads the pods' CA bundle and watches it for changes.
func newCAContent(file string) (*dynamiccertificates.DynamicFileCAContent, error) {
	ca, err := dynamiccertificates.NewDynamicCAContentFromFile("pod-ca-bundle", file)
	if err != nil {
		return nil, fmt.Errorf("loading the pods' CA bundle: %w", err)
	}
	return ca, nil
}

// current returns the parsed certificate for the files' present content.
func (s *FileSource) current() (*tls.Certificate, error) {
	pair, err := s.pair.Get()
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	return pair, nil
}

// Run watches the files until ctx ends.
func (s *FileSource) Run(ctx context.Context) {
	ctx = klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "serving-cert"))
	go s.ca.Run(ctx, 1)
	go s.content.Run(ctx, 1)
	reportReady(ctx, s)
}

// Renew rereads the files now rather than at the next change event.
func (s *FileSource) Renew() {
	_ = s.content.RunOnce(context.Background())
	_ = s.ca.RunOnce(context.Background())
}

// GetCertificate implements Source.
func (s *FileSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.current()
}

// Current implements Source.
func (s *FileSource) Current() *tls.Certificate {
	pair, err := s.current()
	if err != nil {
		return nil
	}
	return pair
}

// Ready implements Source.
func (s *FileSource) Ready() error {
	pair, err := s.current()
	if err != nil {
		return err
	}
	return s.trust.check(pair)
}
