package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	mathrand "math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/keypair"
)

// MinLifetime is the shortest certificate lifetime the kubernetes.io signers
// grant (CSR spec.expirationSeconds has a floor of ten minutes).
const MinLifetime = 10 * time.Minute

// PendingCSRTimeout is how long the agent waits for one CSR to be approved
// and issued before it gives up on it and, after its backoff, sends
// another. Half of kube-controller-manager's 24h deletion of pending CSRs:
// an approver outage leaves about two pending CSRs per node, not one per
// quarter hour. A CSR older than this is of no use to any agent, so the
// approver leaves it alone (its --max-csr-age default).
const PendingCSRTimeout = 12 * time.Hour

// RequestBackoff spaces out the requests of an agent whose requests fail
// (cannot be sent, fail at the signer, are deleted or time out): 2s after
// the first failure, doubling to at most 15 minutes (plus up to 20%
// jitter, so a fleet that failed together does not retry together). A
// denial is not retried at all: see CSRSource.
var RequestBackoff = wait.Backoff{Duration: 2 * time.Second, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 15 * time.Minute}

// minReuseFraction is the share of its lifetime a saved certificate must
// still have for a restarted agent to serve it: the approver then has that
// long to approve its successor.
const minReuseFraction = 0.1

var _ Source = (*CSRSource)(nil)

// CSRSource obtains the serving certificate through the
// CertificateSigningRequest API: it generates an ECDSA P-256 key per
// request, submits a CSR for the configured signer (Options.SignerName,
// kubernetes.io/kubelet-serving by default), waits for it to be approved
// and issued, and renews at a jittered 70-90% of the certificate's
// lifetime.
//
// It sends at most one CSR at a time and waits for it (up to
// PendingCSRTimeout) rather than replacing it. A failed request is retried
// with RequestBackoff. A denied one is final: the source sends no other CSR
// with the same request template (names, IPs, signer, lifetime) until
// Renew is called; a new configuration means a new process anyway.
//
// Without a state directory the key lives only in this process's memory and
// a restarted agent asks for a new certificate. With one (a memory-backed
// volume), the key and certificate, the pending request and the last
// denial are kept there, 0600, so a restarted process serves a still-valid
// certificate, resumes the wait for its CSR, or keeps honouring a denial,
// without sending a CSR.
type CSRSource struct {
	// Fixed at construction.
	opts      Options
	signer    string                    // Options.SignerName, defaulted
	usages    []certificatesv1.KeyUsage // RequestUsages(signer)
	template  *x509.CertificateRequest
	hash      string // of the request template
	lifetime  time.Duration
	clientset func() (kubernetes.Interface, error)
	ca        *dynamiccertificates.DynamicFileCAContent
	trust     *trustCheck
	state     *stateDir
	store     *memoryStore
	renewals  *prometheus.CounterVec
	renew     chan struct{}
	// backoff and pendingTimeout are RequestBackoff and PendingCSRTimeout
	// outside tests.
	backoff        wait.Backoff
	pendingTimeout time.Duration
	// failures counts requests that were not issued (timed out, failed to
	// send, failed at the signer), for Ready's message.
	failures atomic.Int64

	mu sync.Mutex // protects the fields below
	// pending is the CSR being waited for, or nil.
	pending *pendingCSR
	// denied is the denial that stops further requests, or nil.
	denied *denial
	// force makes the next request go out now, whatever the current
	// certificate's deadline (Renew).
	force bool
	// retryAt is when the next request goes out after a failure.
	retryAt time.Time
	// deadline is when the current certificate is renewed.
	deadline time.Time
	// certPEM and keyPEM are the current pair, kept to be saved.
	certPEM, keyPEM []byte
}

// pendingCSR is a request sent (or about to be) and its key.
type pendingCSR struct {
	savedRequest
	key    *ecdsa.PrivateKey
	csrPEM []byte
}

// NewCSRSource prepares a source that requests a certificate for o.SANs
// valid for lifetime, with clients from clientset (the agent's own
// credentials). Nothing is requested before Run.
func NewCSRSource(o Options, lifetime time.Duration, clientset func() (kubernetes.Interface, error)) (*CSRSource, error) {
	if o.NodeName == "" {
		return nil, errors.New("the node name is required to request a serving certificate")
	}
	if lifetime < MinLifetime {
		return nil, fmt.Errorf("certificate lifetime %s is below the signers' floor of %s", lifetime, MinLifetime)
	}
	signer := o.signerName()
	if err := ValidateSignerName(signer); err != nil {
		return nil, err
	}
	ca, err := newCAContent(o.CAFile)
	if err != nil {
		return nil, err
	}
	state, err := newStateDir(o.StateDir)
	if err != nil {
		return nil, err
	}
	renewals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kube_apicache_serving_certificate_renewals_total",
		Help: "Serving certificates obtained or requested through the CSR API, by result: issued, failed (retried with backoff), denied (not retried), reused (restored from the state directory at start, no CSR sent).",
	}, []string{"result"})
	// The request is a kubelet serving certificate's, whatever the
	// signer: the kubelet-serving signer takes nothing else, and the
	// approver checks exactly this. A custom signer must therefore accept
	// (and copy into the certificate) the subject CN=system:node:<node>,
	// O=system:nodes, the DNS names and IPs of the kubernetes Service and
	// the agent's listen addresses, an ECDSA P-256 key and the usages of
	// RequestUsages; it must issue from a CA the pods' CA bundle trusts,
	// or the agent never intercepts. It may issue for another lifetime
	// than spec.expirationSeconds asks (EKS's app-serving signer issues
	// for one year whatever is asked): renewal follows the issued
	// certificate's own validity.
	tmpl := &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: NodeCommonName(o.NodeName), Organization: []string{NodesOrganization}},
		DNSNames:    o.SANs.DNSNames,
		IPAddresses: o.SANs.NetIPs(),
	}
	return &CSRSource{
		opts:           o,
		signer:         signer,
		template:       tmpl,
		usages:         RequestUsages(signer),
		hash:           templateOf(tmpl, signer, lifetime).hash(),
		lifetime:       lifetime,
		clientset:      clientset,
		ca:             ca,
		trust:          newTrustCheck(ca, o.SANs, o.now()),
		state:          state,
		renewals:       renewals,
		store:          &memoryStore{},
		renew:          make(chan struct{}, 1),
		backoff:        RequestBackoff,
		pendingTimeout: PendingCSRTimeout,
	}, nil
}

// templateOf describes the requests made from tmpl to signer: ECDSA keys
// and RequestUsages(signer).
func templateOf(tmpl *x509.CertificateRequest, signer string, lifetime time.Duration) requestTemplate {
	t := requestTemplate{
		Signer:      signer,
		CommonName:  tmpl.Subject.CommonName,
		Orgs:        tmpl.Subject.Organization,
		DNSNames:    tmpl.DNSNames,
		LifetimeSec: int64(lifetime / time.Second),
	}
	for _, ip := range tmpl.IPAddresses {
		t.IPs = append(t.IPs, ip.String())
	}
	for _, u := range RequestUsages(signer) {
		t.Usages = append(t.Usages, string(u))
	}
	return t
}

func (s *CSRSource) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.renewals}
}

// Run restores the saved state, then requests (or waits for) a certificate
// and keeps renewing it until ctx ends.
func (s *CSRSource) Run(ctx context.Context) {
	ctx = klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "serving-cert"))
	logger := klog.FromContext(ctx)
	go s.ca.Run(ctx, 1)
	go reportReady(ctx, s)
	s.restore(ctx)
	backoff := s.backoff
	for {
		if !s.waitForWork(ctx) {
			return
		}
		switch s.attempt(ctx) {
		case attemptStopped:
			return
		case attemptFailed:
			delay := backoff.Step()
			s.mu.Lock()
			s.retryAt = time.Now().Add(delay)
			s.mu.Unlock()
			logger.Info("Serving certificate request failed; retrying after a backoff", "backoff", delay.Round(time.Millisecond), "failures", s.failures.Load())
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-s.renew:
				t.Stop()
				s.renewRequested(ctx)
				backoff = s.backoff
			}
			s.mu.Lock()
			s.retryAt = time.Time{}
			s.mu.Unlock()
		default:
			backoff = s.backoff
		}
	}
}

// Renew asks for a new key and certificate now. It also drops a pending
// CSR (the new request replaces it) and a denial.
func (s *CSRSource) Renew() {
	select {
	case s.renew <- struct{}{}:
	default:
	}
}

// renewRequested applies a Renew that arrived: the next request goes out
// at once, with a new key.
func (s *CSRSource) renewRequested(ctx context.Context) {
	klog.FromContext(ctx).Info("Renewing the serving certificate now")
	s.mu.Lock()
	s.pending, s.denied, s.force = nil, nil, true
	s.mu.Unlock()
	s.persist(ctx)
}

// waitForWork returns true when a request is due: a pending one to wait
// for, no certificate, the current one's renewal deadline, or Renew. While
// a denial stands it waits for Renew only. It returns false when ctx ends.
func (s *CSRSource) waitForWork(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	for {
		s.mu.Lock()
		pending, denied, force, deadline := s.pending, s.denied, s.force, s.deadline
		s.force = false
		s.mu.Unlock()
		if pending != nil || force {
			return true
		}
		var timer <-chan time.Time
		switch {
		case denied != nil:
			logger.Info("Not requesting a serving certificate: the last request was denied; the same request would be denied again. Fix the approver's or the agent's configuration, then restart the agent or send it SIGHUP",
				"csr", denied.CSR, "reason", denied.Reason, "message", denied.Message)
		case s.store.get() == nil:
			return true
		default:
			wait := time.Until(deadline)
			if wait <= 0 {
				return true
			}
			logger.V(2).Info("Waiting for the serving certificate's renewal", "renewAt", deadline.UTC().Format(time.RFC3339))
			t := time.NewTimer(wait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer:
			return true
		case <-s.renew:
			s.renewRequested(ctx)
		}
	}
}

type attemptResult int

const (
	attemptIssued attemptResult = iota
	attemptDenied
	attemptFailed
	attemptRenewed
	attemptStopped
)

var errRenew = errors.New("renewal requested")

// attempt sends a CSR (unless one is pending already) and waits for its
// outcome.
func (s *CSRSource) attempt(ctx context.Context) attemptResult {
	logger := klog.FromContext(ctx)
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.renew:
			cancel(errRenew)
		case <-actx.Done():
		}
	}()
	res := s.requestAndWait(actx)
	if errors.Is(context.Cause(actx), errRenew) {
		s.renewRequested(ctx)
		return attemptRenewed
	}
	if ctx.Err() != nil {
		return attemptStopped
	}
	switch res {
	case attemptFailed:
		s.failures.Add(1)
		s.renewals.WithLabelValues("failed").Inc()
	case attemptDenied:
		s.renewals.WithLabelValues("denied").Inc()
	case attemptIssued:
		s.renewals.WithLabelValues("issued").Inc()
		if c := s.store.get(); c != nil {
			// The lifetime is the signer's to choose (EKS's app-serving
			// issues for a year whatever is asked); renewAt follows it.
			logger.Info("Serving certificate issued", "signer", s.signer, "serial", c.Leaf.SerialNumber.String(),
				"notAfter", c.Leaf.NotAfter.UTC().Format(time.RFC3339), "renewAt", s.renewAt().UTC().Format(time.RFC3339),
				"lifetime", c.Leaf.NotAfter.Sub(c.Leaf.NotBefore).String(), "requestedLifetime", s.lifetime.String())
		}
	}
	return res
}

func (s *CSRSource) renewAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// requestAndWait is one attempt; ctx ends on Renew or shutdown.
func (s *CSRSource) requestAndWait(ctx context.Context) attemptResult {
	logger := klog.FromContext(ctx)
	client, err := s.clientset()
	if err != nil {
		logger.Error(err, "Building a client to request the serving certificate")
		return attemptFailed
	}
	p, err := s.send(ctx, client)
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Sending the serving certificate request")
		}
		return attemptFailed
	}
	wctx, cancel := context.WithDeadline(ctx, p.Created.Add(s.pendingTimeout))
	defer cancel()
	got, err := waitForCSR(wctx, client, p.Name, p.UID)
	switch {
	case ctx.Err() != nil:
		return attemptFailed // the caller looks at why ctx ended
	case err == nil:
	case errors.Is(err, errCSRGone):
		logger.Info("Serving certificate request is gone; sending a new one after a backoff", "csr", p.Name, "why", err.Error())
		s.dropPending(ctx)
		return attemptFailed
	case wctx.Err() != nil:
		logger.Info("Serving certificate request was not issued in time; sending a new one after a backoff", "csr", p.Name, "waited", time.Since(p.Created).Round(time.Second))
		s.dropPending(ctx)
		return attemptFailed
	default:
		// Keep the request: the next attempt waits for the same CSR.
		logger.Error(err, "Waiting for the serving certificate request", "csr", p.Name)
		return attemptFailed
	}
	if c := condition(got, certificatesv1.CertificateDenied); c != nil {
		d := &denial{CSR: got.Name, Reason: c.Reason, Message: c.Message}
		logger.Info("Serving certificate request was denied; no new request until the configuration changes or SIGHUP",
			"csr", got.Name, "signer", s.signer, "reason", c.Reason, "message", c.Message)
		s.mu.Lock()
		s.pending, s.denied = nil, d
		s.mu.Unlock()
		s.persist(ctx)
		return attemptDenied
	}
	if c := condition(got, certificatesv1.CertificateFailed); c != nil {
		logger.Info("Serving certificate request failed at the signer; sending a new one after a backoff",
			"csr", got.Name, "signer", s.signer, "reason", c.Reason, "message", c.Message)
		s.dropPending(ctx)
		return attemptFailed
	}
	if err := s.install(ctx, got.Status.Certificate, p.key); err != nil {
		logger.Error(err, "Using the issued serving certificate", "csr", got.Name)
		s.dropPending(ctx)
		return attemptFailed
	}
	return attemptIssued
}

// send returns the pending request, creating its key and CSR first if
// there is none. The key is saved before the CSR is created, and the CSR's
// name derives from the key, so a retry (or the next process) that finds a
// CSR of that name with that key waits for it instead of sending another.
func (s *CSRSource) send(ctx context.Context, client kubernetes.Interface) (*pendingCSR, error) {
	s.mu.Lock()
	p := s.pending
	s.mu.Unlock()
	if p == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generating a key: %w", err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		p = &pendingCSR{
			savedRequest: savedRequest{
				Name:    requestName(s.opts.NodeName, &key.PublicKey),
				Key:     string(pem.EncodeToMemory(&pem.Block{Type: keyutil.ECPrivateKeyBlockType, Bytes: keyDER})),
				Created: time.Now(),
			},
			key: key,
		}
		s.mu.Lock()
		s.pending = p
		s.mu.Unlock()
		s.persist(ctx)
	}
	if p.UID != "" {
		return p, nil
	}
	if p.csrPEM == nil {
		der, err := x509.CreateCertificateRequest(rand.Reader, s.template, p.key)
		if err != nil {
			return nil, fmt.Errorf("creating the request: %w", err)
		}
		p.csrPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	lifetime := s.lifetime
	name, uid, err := csr.RequestCertificateWithContext(ctx, client, p.csrPEM, p.Name, s.signer, &lifetime, s.usages, p.key)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	p.Name, p.UID = name, uid
	s.mu.Unlock()
	s.persist(ctx)
	return p, nil
}

// requestName names the CSR for key: the node (for people reading
// `kubectl get csr`) and a digest of the public key.
func requestName(node string, pub *ecdsa.PublicKey) string {
	if len(node) > 200 {
		node = strings.TrimRight(node[:200], ".-")
	}
	return "kube-apicache-" + node + "-" + keyDigest(pub)
}

// keyDigest is 16 hex digits of the SHA-256 of pub's DER encoding.
func keyDigest(pub *ecdsa.PublicKey) string {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:8])
}

func (s *CSRSource) dropPending(ctx context.Context) {
	s.mu.Lock()
	s.pending = nil
	s.mu.Unlock()
	s.persist(ctx)
}

// install makes the issued certificate current and saves it.
func (s *CSRSource) install(ctx context.Context, certPEM []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: keyutil.ECPrivateKeyBlockType, Bytes: keyDER})
	pair, err := keypair.Parse(certPEM, keyPEM)
	if err != nil {
		return err
	}
	s.store.set(pair)
	s.mu.Lock()
	s.pending = nil
	s.deadline = rotationDeadline(pair.Leaf)
	if s.state != nil {
		s.certPEM, s.keyPEM = certPEM, keyPEM
	}
	s.mu.Unlock()
	s.persist(ctx)
	return nil
}

// rotationDeadline is a random point at 70-90% of leaf's lifetime, as
// client-go's certificate manager picks it, so a fleet issued at once
// does not renew at once. The lifetime is the issued certificate's
// (NotBefore to NotAfter), not the one the CSR asked for: a signer may
// ignore spec.expirationSeconds or cap it.
func rotationDeadline(leaf *x509.Certificate) time.Time {
	total := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(time.Duration(float64(total) * (0.7 + 0.2*mathrand.Float64())))
}

// persist saves the current state, if there is a state directory. Only the
// Run goroutine changes the state, so saves do not race.
func (s *CSRSource) persist(ctx context.Context) {
	if s.state == nil {
		return
	}
	s.mu.Lock()
	st := &savedState{Template: s.hash, Denied: s.denied}
	if s.certPEM != nil {
		st.Signer, st.Certificate, st.Key = s.signer, string(s.certPEM), string(s.keyPEM)
	}
	if s.pending != nil {
		r := s.pending.savedRequest
		st.Pending = &r
	}
	s.mu.Unlock()
	if err := s.state.save(st); err != nil {
		klog.FromContext(ctx).Error(err, "Saving the serving certificate state; a restarted agent will send a new CSR")
	}
}

// restore loads what the previous process in this pod saved: a
// certificate still worth serving, a request still worth waiting for, a
// denial that still applies.
func (s *CSRSource) restore(ctx context.Context) {
	logger := klog.FromContext(ctx)
	st, err := s.state.load()
	if err != nil {
		logger.Error(err, "Ignoring the saved serving certificate state")
	}
	if st == nil {
		return
	}
	if st.Certificate != "" {
		pair, why := s.reusable(st)
		if pair != nil {
			deadline := rotationDeadline(pair.Leaf)
			s.store.set(pair)
			s.mu.Lock()
			s.deadline, s.certPEM, s.keyPEM = deadline, []byte(st.Certificate), []byte(st.Key)
			s.mu.Unlock()
			s.renewals.WithLabelValues("reused").Inc()
			logger.Info("Reusing the saved serving certificate; no CSR sent", "serial", pair.Leaf.SerialNumber.String(),
				"notAfter", pair.Leaf.NotAfter.UTC().Format(time.RFC3339), "renewAt", deadline.UTC().Format(time.RFC3339))
		} else {
			logger.Info("Not reusing the saved serving certificate", "reason", why)
		}
	}
	switch {
	case st.Template != s.hash:
		if st.Pending != nil || st.Denied != nil {
			logger.Info("The certificate request configuration changed; forgetting the saved request and denial", "signer", s.signer)
		}
	default:
		if st.Pending != nil {
			if p, err := restorePending(st.Pending); err != nil {
				logger.Error(err, "Ignoring the saved pending request")
			} else {
				s.mu.Lock()
				s.pending = p
				s.mu.Unlock()
				logger.Info("Waiting for the serving certificate request sent before the restart", "csr", p.Name)
			}
		}
		if st.Denied != nil {
			s.mu.Lock()
			s.denied = st.Denied
			s.mu.Unlock()
		}
	}
	s.persist(ctx)
}

// reusable returns the saved pair if it may be served: valid now with at
// least minReuseFraction of its lifetime left, for exactly this agent's
// subject, names and IPs, from the configured signer, and verified by the
// pods' CA bundle. Otherwise it says why not.
func (s *CSRSource) reusable(st *savedState) (*tls.Certificate, string) {
	if st.Signer != s.signer {
		// Even if it verifies, a certificate from the signer the agent
		// was moved away from is not served: the operator chose another
		// issuer, and the approver for that one did not approve it.
		return nil, fmt.Sprintf("it was issued by signer %q, and the agent now requests its certificate from signer %q", st.Signer, s.signer)
	}
	pair, err := keypair.Parse([]byte(st.Certificate), []byte(st.Key))
	if err != nil {
		return nil, err.Error()
	}
	leaf := pair.Leaf
	now := s.opts.now()()
	total := leaf.NotAfter.Sub(leaf.NotBefore)
	if left := leaf.NotAfter.Sub(now); left < time.Duration(float64(total)*minReuseFraction) {
		return nil, fmt.Sprintf("expires too soon (%s left of %s)", left.Round(time.Second), total.Round(time.Second))
	}
	if leaf.Subject.CommonName != s.template.Subject.CommonName {
		return nil, fmt.Sprintf("subject %q is not %q", leaf.Subject.CommonName, s.template.Subject.CommonName)
	}
	if !sameSet(leaf.DNSNames, s.opts.SANs.DNSNames) {
		return nil, fmt.Sprintf("DNS names %q are not %q", leaf.DNSNames, s.opts.SANs.DNSNames)
	}
	var ips []netip.Addr
	for _, ip := range leaf.IPAddresses {
		a, _ := netip.AddrFromSlice(ip)
		ips = append(ips, a.Unmap())
	}
	if !sameSet(ips, s.opts.SANs.IPs) {
		return nil, fmt.Sprintf("IP addresses %v are not %v", ips, s.opts.SANs.IPs)
	}
	if err := s.trust.check(pair); err != nil {
		return nil, err.Error()
	}
	return pair, ""
}

func sameSet[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			return false
		}
	}
	return true
}

func restorePending(r *savedRequest) (*pendingCSR, error) {
	block, _ := pem.Decode([]byte(r.Key))
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	return &pendingCSR{savedRequest: *r, key: key}, nil
}

// GetCertificate implements Source.
func (s *CSRSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.store.get(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// Current implements Source.
func (s *CSRSource) Current() *tls.Certificate { return s.store.get() }

// Ready implements Source.
func (s *CSRSource) Ready() error {
	c := s.store.get()
	if c != nil {
		return s.trust.check(c)
	}
	s.mu.Lock()
	var pendingName string
	if s.pending != nil && s.pending.UID != "" {
		pendingName = s.pending.Name
	}
	denied, retryAt := s.denied, s.retryAt
	s.mu.Unlock()
	if denied != nil {
		return fmt.Errorf("no serving certificate: CertificateSigningRequest %s was denied (%s: %s); no new request is sent until the agent's certificate configuration changes or it gets SIGHUP",
			denied.CSR, denied.Reason, denied.Message)
	}
	msg := fmt.Sprintf("no serving certificate yet: waiting for a CertificateSigningRequest for %s (signer %s) to be approved and issued",
		s.template.Subject.CommonName, s.signer)
	if pendingName != "" {
		msg += fmt.Sprintf(" (%s)", pendingName)
	}
	if n := s.failures.Load(); n > 0 {
		msg += fmt.Sprintf("; %d request(s) failed so far (see the CSRs' conditions and the agent's log)", n)
		if !retryAt.IsZero() {
			msg += fmt.Sprintf(", next in %s", time.Until(retryAt).Round(time.Second))
		}
	}
	return errors.New(msg)
}

// condition returns csr's condition of type typ, or nil.
func condition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

// memoryStore holds the current pair in memory.
type memoryStore struct {
	mu   sync.Mutex // protects the field below
	pair *tls.Certificate
}

func (m *memoryStore) get() *tls.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pair
}

func (m *memoryStore) set(pair *tls.Certificate) {
	m.mu.Lock()
	m.pair = pair
	m.mu.Unlock()
}
