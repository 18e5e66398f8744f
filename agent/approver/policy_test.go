package approver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"k8s.io/utils/ptr"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/kube-apicache/kube-apicache/agent/identity"
)

const (
	agentUser = "system:serviceaccount:kube-apicache:kube-apicache"
	node      = "node-a"
)

var (
	ecKey, _  = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ = rsa.GenerateKey(rand.Reader, 2048)
	_, edKey  = mustEd25519()
)

func mustEd25519() (ed25519.PublicKey, ed25519.PrivateKey) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	return pub, priv
}

func testPolicy() *Policy {
	return &Policy{
		AgentUser: agentUser,
		SANs: identity.ServingSANs([]netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")},
			[]netip.Addr{netip.MustParseAddr("169.254.25.10"), netip.MustParseAddr("fd00:169:254:25::10")}, "cluster.local"),
		MaxLifetime: 48 * time.Hour,
	}
}

// good returns the template and CSR an agent on node sends.
func good() (*x509.CertificateRequest, *certificatesv1.CertificateSigningRequest) {
	sans := testPolicy().SANs
	tmpl := &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    sans.DNSNames,
		IPAddresses: sans.NetIPs(),
	}
	csr := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		SignerName:        "kubernetes.io/kubelet-serving",
		Username:          agentUser,
		Groups:            []string{"system:serviceaccounts", "system:serviceaccounts:kube-apicache", "system:authenticated"},
		Extra:             map[string]certificatesv1.ExtraValue{NodeNameExtra: {node}},
		Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		ExpirationSeconds: ptr.To[int32](24 * 3600),
	}}
	return tmpl, csr
}

func encode(t *testing.T, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		// edit changes a good request; key signs it (ECDSA if nil).
		edit       func(tmpl *x509.CertificateRequest, csr *certificatesv1.CertificateSigningRequest)
		key        crypto.Signer
		rawRequest []byte
		// wantReason is empty for approval; wantMessage is a substring.
		wantReason, wantMessage string
	}{{
		// What the agent sends, with an ECDSA key: approved.
		name: "agent request ECDSA",
	}, {
		// RSA keys need key encipherment too.
		name: "agent request RSA with key encipherment",
		key:  rsaKey,
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
		},
	}, {
		// The SANs may come in any order.
		name: "SANs reordered",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = []string{r.DNSNames[3], r.DNSNames[2], r.DNSNames[1], r.DNSNames[0]}
			r.IPAddresses = []net.IP{r.IPAddresses[3], r.IPAddresses[2], r.IPAddresses[0], r.IPAddresses[1]}
		},
	}, {
		// A lifetime of exactly the maximum is fine.
		name: "lifetime at the maximum",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](48 * 3600)
		},
	}, {
		name: "lifetime above the maximum",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](365 * 24 * 3600)
		},
		wantReason: ReasonWrongLifetime, wantMessage: "above the maximum",
	}, {
		// Without expirationSeconds the signer's own maximum (a year by
		// default) would apply.
		name: "lifetime not set",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = nil
		},
		wantReason: ReasonWrongLifetime, wantMessage: "must be set",
	}, {
		name: "other signer",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = "kubernetes.io/kube-apiserver-client"
		},
		wantReason: ReasonWrongSigner, wantMessage: `signer "kubernetes.io/kube-apiserver-client"`,
	}, {
		name: "requester is another ServiceAccount",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:serviceaccount:default:default"
		},
		wantReason: ReasonWrongRequester, wantMessage: `"system:serviceaccount:default:default" is not the agent's`,
	}, {
		name: "requester is the node itself",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
		},
		wantReason: ReasonWrongRequester,
	}, {
		// Another authenticator (webhook, OIDC, a client certificate) that
		// yields the ServiceAccount's username without its groups.
		name: "ServiceAccount's username without ServiceAccount groups",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Groups = []string{"system:authenticated", "system:serviceaccounts"}
		},
		wantReason: ReasonWrongRequester, wantMessage: "not authenticated as a ServiceAccount",
	}, {
		// A legacy (Secret-based) token carries no node.
		name: "token not bound to a node",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Extra = nil
		},
		wantReason: ReasonNodeMismatch, wantMessage: "not bound to a node",
	}, {
		name: "two node names",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Extra = map[string]certificatesv1.ExtraValue{NodeNameExtra: {node, "node-b"}}
		},
		wantReason: ReasonNodeMismatch,
	}, {
		name: "CN names another node",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.CommonName = "system:node:node-b"
		},
		wantReason: ReasonNodeMismatch, wantMessage: `"system:node:node-b" does not match the requester's node: want "system:node:node-a"`,
	}, {
		name: "CN is not a node",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.CommonName = "kube-apiserver"
		},
		wantReason: ReasonNodeMismatch,
	}, {
		name: "organization system:masters",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.Organization = []string{"system:masters"}
		},
		wantReason: ReasonWrongSubject,
	}, {
		name: "extra organization",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.Organization = []string{"system:nodes", "system:masters"}
		},
		wantReason: ReasonWrongSubject,
	}, {
		name: "extra subject field",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.OrganizationalUnit = []string{"x"}
		},
		wantReason: ReasonWrongSubject,
	}, {
		// Parsers disagree on which of two CNs counts.
		name: "two common names",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.ExtraNames = []pkix.AttributeTypeAndValue{
				{Type: asn1.ObjectIdentifier{2, 5, 4, 3}, Value: "system:node:node-b"},
				{Type: asn1.ObjectIdentifier{2, 5, 4, 3}, Value: "system:node:" + node},
			}
		},
		wantReason: ReasonWrongSubject,
	}, {
		name: "other subject attribute",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject.ExtraNames = []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 1}, Value: "x"}}
		},
		wantReason: ReasonWrongSubject,
	}, {
		// DNS names are compared exactly: case, a trailing dot or a
		// wildcard make a different name.
		name: "upper-case DNS SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(slices.Clone(r.DNSNames[:3]), strings.ToUpper(r.DNSNames[3]))
		},
		wantReason: ReasonWrongSANs, wantMessage: "KUBERNETES.DEFAULT.SVC.CLUSTER.LOCAL",
	}, {
		name: "DNS SAN with a trailing dot",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(slices.Clone(r.DNSNames[:3]), r.DNSNames[3]+".")
		},
		wantReason: ReasonWrongSANs,
	}, {
		name: "wildcard DNS SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(slices.Clone(r.DNSNames), "*.default.svc")
		},
		wantReason: ReasonWrongSANs, wantMessage: "*.default.svc",
	}, {
		// Two SAN extensions (a second one hiding names from a parser
		// that reads the first) do not parse.
		name: "two SAN extensions",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			ext := func(names ...string) pkix.Extension {
				var raw []asn1.RawValue
				for _, n := range names {
					raw = append(raw, asn1.RawValue{Tag: 2, Class: asn1.ClassContextSpecific, Bytes: []byte(n)})
				}
				b, err := asn1.Marshal(raw)
				if err != nil {
					panic(err)
				}
				return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: b}
			}
			r.ExtraExtensions = []pkix.Extension{ext("evil.example.com"), ext(r.DNSNames...)}
			r.DNSNames, r.IPAddresses = nil, nil
		},
		wantReason: ReasonMalformed, wantMessage: "duplicate",
	}, {
		name: "extra DNS SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(r.DNSNames, "evil.example.com")
		},
		wantReason: ReasonWrongSANs, wantMessage: `DNS names ["evil.example.com"] are not allowed`,
	}, {
		name: "missing DNS SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = r.DNSNames[:3]
		},
		wantReason: ReasonWrongSANs, wantMessage: `"kubernetes.default.svc.cluster.local"] are missing`,
	}, {
		name: "other cluster domain",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames[3] = "kubernetes.default.svc.example.org"
		},
		wantReason: ReasonWrongSANs,
	}, {
		name: "repeated DNS SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(r.DNSNames, "kubernetes")
		},
		wantReason: ReasonWrongSANs, wantMessage: "repeat",
	}, {
		name: "extra IP SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.IPAddresses = append(r.IPAddresses, net.ParseIP("10.0.0.1"))
		},
		wantReason: ReasonWrongSANs, wantMessage: "IP addresses [10.0.0.1] are not allowed",
	}, {
		name: "missing IPv6 VIP",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.IPAddresses = []net.IP{r.IPAddresses[0], r.IPAddresses[2], r.IPAddresses[3]}
		},
		wantReason: ReasonWrongSANs, wantMessage: "IP addresses [fd00::1] are missing",
	}, {
		name: "missing IPv6 listen IP of a dual-stack agent",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.IPAddresses = r.IPAddresses[:3]
		},
		wantReason: ReasonWrongSANs, wantMessage: "IP addresses [fd00:169:254:25::10] are missing",
	}, {
		name: "email SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.EmailAddresses = []string{"a@example.com"}
		},
		wantReason: ReasonWrongSANs,
	}, {
		name: "URI SAN",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/x"}}
		},
		wantReason: ReasonWrongSANs,
	}, {
		name: "extra usage client auth",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageClientAuth)
		},
		wantReason: ReasonWrongUsages, wantMessage: `"client auth"`,
	}, {
		name: "key encipherment with an ECDSA key",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageKeyEncipherment)
		},
		wantReason: ReasonWrongUsages,
	}, {
		name:       "RSA without key encipherment",
		key:        rsaKey,
		wantReason: ReasonWrongUsages,
	}, {
		name: "missing server auth",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}
		},
		wantReason: ReasonWrongUsages,
	}, {
		name: "repeated usage",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageServerAuth)
		},
		wantReason: ReasonWrongUsages,
	}, {
		name:       "Ed25519 key",
		key:        edKey,
		wantReason: ReasonUnsupportedKey,
	}, {
		name:       "not PEM",
		rawRequest: []byte("garbage"),
		wantReason: ReasonMalformed,
	}, {
		name:       "PEM of the wrong type",
		rawRequest: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}),
		wantReason: ReasonMalformed,
	}}
	p := testPolicy()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, csr := good()
			if tc.edit != nil {
				tc.edit(tmpl, csr)
			}
			key := tc.key
			if key == nil {
				key = ecKey
			}
			csr.Spec.Request = encode(t, tmpl, key)
			if tc.rawRequest != nil {
				csr.Spec.Request = tc.rawRequest
			}
			d := p.Decide(csr)
			if tc.wantReason == "" {
				if !d.Approve || d.Reason != ReasonApproved {
					t.Fatalf("Decide = %+v, want approval", d)
				}
				return
			}
			if d.Approve {
				t.Fatalf("Decide approved; want denial with reason %s", tc.wantReason)
			}
			if d.Reason != tc.wantReason || !strings.Contains(d.Message, tc.wantMessage) {
				t.Errorf("Decide = %s: %q; want %s containing %q", d.Reason, d.Message, tc.wantReason, tc.wantMessage)
			}
		})
	}
}

// customSigner is a signer other than kubelet-serving, as cert-manager
// names its ClusterIssuers' signers.
const customSigner = "clusterissuers.cert-manager.io/kube-apicache"

// TestSigner: a policy owns, and may approve, only CSRs for its own signer
// (kubelet-serving unless SignerName says otherwise). A CSR for any other
// signer is not owned, whoever sent it, and Decide denies it as
// WrongSigner should it ever be asked.
func TestSigner(t *testing.T) {
	custom := testPolicy()
	custom.SignerName = customSigner
	tests := []struct {
		name   string
		policy *Policy
		// signer is the CSR's spec.signerName; requester, if set, replaces
		// the agent's ServiceAccount.
		signer, requester string
		wantOwns          bool
		// wantReason is empty for approval.
		wantReason string
	}{{
		// An empty SignerName is the kubelet-serving signer.
		name: "default policy, kubelet-serving CSR", policy: testPolicy(), signer: "kubernetes.io/kubelet-serving",
		wantOwns: true,
	}, {
		name: "default policy, CSR for a custom signer", policy: testPolicy(), signer: customSigner,
		wantReason: ReasonWrongSigner,
	}, {
		// The agent's request to the configured custom signer, otherwise
		// good: approved.
		name: "custom policy, CSR for its signer", policy: custom, signer: customSigner,
		wantOwns: true,
	}, {
		// Someone else naming the Service to the custom signer is the
		// approver's business, and denied.
		name: "custom policy, other requester naming the Service", policy: custom, signer: customSigner, requester: "system:node:" + node,
		wantOwns: true, wantReason: ReasonWrongRequester,
	}, {
		// The agent's otherwise good request to kubelet-serving, when the
		// approver is configured for another signer: left alone (its RBAC
		// has no approve on kubelet-serving either).
		name: "custom policy, agent's kubelet-serving CSR", policy: custom, signer: "kubernetes.io/kubelet-serving",
		wantReason: ReasonWrongSigner,
	}, {
		name: "custom policy, other requester's kubelet-serving CSR naming the Service", policy: custom, signer: "kubernetes.io/kubelet-serving", requester: "system:node:" + node,
		wantReason: ReasonWrongSigner,
	}, {
		name: "custom policy, CSR for a third signer", policy: custom, signer: "example.com/other",
		wantReason: ReasonWrongSigner,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, csr := good()
			csr.Spec.SignerName = tc.signer
			if tc.requester != "" {
				csr.Spec.Username = tc.requester
			}
			csr.Spec.Request = encode(t, tmpl, ecKey)
			if got := tc.policy.Owns(csr); got != tc.wantOwns {
				t.Errorf("Owns = %v, want %v", got, tc.wantOwns)
			}
			d := tc.policy.Decide(csr)
			switch {
			case tc.wantReason == "" && (!d.Approve || d.Reason != ReasonApproved):
				t.Errorf("Decide = %+v, want approval", d)
			case tc.wantReason != "" && (d.Approve || d.Reason != tc.wantReason):
				t.Errorf("Decide = %+v, want denial %s", d, tc.wantReason)
			case tc.wantReason == ReasonWrongSigner && !strings.Contains(d.Message, tc.policy.Signer()):
				t.Errorf("Decide message %q does not name the configured signer %s", d.Message, tc.policy.Signer())
			}
		})
	}
}

// TestDecideBadSignature: a request whose signature does not match its key
// (tampered after signing) is denied.
func TestDecideBadSignature(t *testing.T) {
	tmpl, csr := good()
	block, _ := pem.Decode(encode(t, tmpl, ecKey))
	block.Bytes[len(block.Bytes)-5] ^= 0xff
	csr.Spec.Request = pem.EncodeToMemory(block)
	d := testPolicy().Decide(csr)
	if d.Approve || d.Reason != ReasonMalformed {
		t.Errorf("Decide = %+v, want %s", d, ReasonMalformed)
	}
}

func TestOwns(t *testing.T) {
	p := testPolicy()
	kubeletTmpl := &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    []string{node},
		IPAddresses: []net.IP{net.ParseIP("192.0.2.10")},
	}
	tests := []struct {
		name string
		edit func(tmpl *x509.CertificateRequest, csr *certificatesv1.CertificateSigningRequest)
		want bool
	}{{
		name: "agent's request",
		want: true,
	}, {
		// Someone else asking for the kubernetes Service's names is
		// decided (and denied).
		name: "other requester naming the Service",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
		},
		want: true,
	}, {
		name: "other requester naming only the VIP",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
			r.DNSNames = nil
			r.IPAddresses = []net.IP{net.ParseIP("10.96.0.1")}
		},
		want: true,
	}, {
		// A wildcard that covers a Service name is as good to pods.
		name: "other requester with a wildcard covering a Service name",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
			r.DNSNames = []string{"*.Default.svc."}
			r.IPAddresses = nil
		},
		want: true,
	}, {
		// A kubelet's own serving CSR is left alone.
		name: "kubelet serving request",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:node:" + node
			*r = *kubeletTmpl
		},
		want: false,
	}, {
		name: "agent's request for another signer",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = "example.com/other"
		},
		want: false,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, csr := good()
			if tc.edit != nil {
				tc.edit(tmpl, csr)
			}
			csr.Spec.Request = encode(t, tmpl, ecKey)
			if got := p.Owns(csr); got != tc.want {
				t.Errorf("Owns = %v, want %v", got, tc.want)
			}
		})
	}
}

// eksSigner is Amazon EKS's signer for workloads' serving certificates: any
// subject and SANs, key encipherment, digital signature and server auth, a
// year whatever is asked. Whoever may create CSRs may ask it for anything,
// so the approver is the only thing between a tenant and a certificate for
// the kubernetes Service's names.
const eksSigner = "beta.eks.amazonaws.com/app-serving"

// TestEKSSigner: configured for EKS's app-serving signer, the approver
// approves the agent's request (with the usages the agent asks that signer
// for, or those of earlier releases) and nothing else that names the
// kubernetes Service: not another requester, not other SANs, not another
// subject, not client auth. A tenant's CSR for its own names is left
// alone.
func TestEKSSigner(t *testing.T) {
	p := testPolicy()
	p.SignerName = eksSigner
	tenant := "system:serviceaccount:tenant:app"
	asTenant := func(c *certificatesv1.CertificateSigningRequest) {
		c.Spec.Username = tenant
		c.Spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:tenant", "system:authenticated"}
	}
	tests := []struct {
		name string
		edit func(tmpl *x509.CertificateRequest, csr *certificatesv1.CertificateSigningRequest)
		// wantOwns is whether the approver decides the CSR at all;
		// wantReason is empty for approval.
		wantOwns   bool
		wantReason string
	}{{
		name:     "agent's request",
		wantOwns: true,
	}, {
		// What agents of earlier releases asked every signer for.
		name: "agent's request without key encipherment",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		},
		wantOwns: true,
	}, {
		name: "agent's request with client auth",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageClientAuth)
		},
		wantOwns: true, wantReason: ReasonWrongUsages,
	}, {
		// A tenant who can create CSRs asks for the agent's very request.
		name:     "tenant asking for the Service names",
		edit:     func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) { asTenant(c) },
		wantOwns: true, wantReason: ReasonWrongRequester,
	}, {
		name: "tenant asking for the VIP alone",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			asTenant(c)
			r.Subject = pkix.Name{CommonName: "app"}
			r.DNSNames = nil
			r.IPAddresses = []net.IP{net.ParseIP("10.96.0.1")}
		},
		wantOwns: true, wantReason: ReasonWrongRequester,
	}, {
		name: "tenant asking for a wildcard covering the Service",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			asTenant(c)
			r.Subject = pkix.Name{CommonName: "app"}
			r.DNSNames = []string{"*.default.svc"}
			r.IPAddresses = nil
		},
		wantOwns: true, wantReason: ReasonWrongRequester,
	}, {
		// A user named like the agent but not authenticated as a
		// ServiceAccount.
		name: "agent's name without the ServiceAccount groups",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Groups = []string{"system:authenticated"}
		},
		wantOwns: true, wantReason: ReasonWrongRequester,
	}, {
		name: "agent's request with an extra name",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = append(r.DNSNames, "evil.example.com")
		},
		wantOwns: true, wantReason: ReasonWrongSANs,
	}, {
		name: "agent's request missing a name",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.DNSNames = r.DNSNames[1:]
		},
		wantOwns: true, wantReason: ReasonWrongSANs,
	}, {
		// The signer takes any subject; the approver does not.
		name: "agent's request with another subject",
		edit: func(r *x509.CertificateRequest, _ *certificatesv1.CertificateSigningRequest) {
			r.Subject = pkix.Name{CommonName: "kubernetes"}
		},
		wantOwns: true, wantReason: ReasonWrongSubject,
	}, {
		// The signer ignores expirationSeconds, but the approver still
		// holds the agents to their configuration.
		name: "agent's request above the maximum lifetime",
		edit: func(_ *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](365 * 24 * 3600)
		},
		wantOwns: true, wantReason: ReasonWrongLifetime,
	}, {
		// A tenant's certificate for its own Service is not the
		// approver's to decide.
		name: "tenant asking for its own names",
		edit: func(r *x509.CertificateRequest, c *certificatesv1.CertificateSigningRequest) {
			asTenant(c)
			r.Subject = pkix.Name{CommonName: "app.tenant.svc"}
			r.DNSNames = []string{"app.tenant.svc", "app.tenant.svc.cluster.local"}
			r.IPAddresses = []net.IP{net.ParseIP("10.96.14.2")}
		},
		wantOwns: false, wantReason: ReasonWrongRequester,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, csr := good()
			csr.Spec.SignerName = eksSigner
			csr.Spec.Usages = identity.RequestUsages(eksSigner)
			if tc.edit != nil {
				tc.edit(tmpl, csr)
			}
			csr.Spec.Request = encode(t, tmpl, ecKey)
			if got := p.Owns(csr); got != tc.wantOwns {
				t.Errorf("Owns = %v, want %v", got, tc.wantOwns)
			}
			d := p.Decide(csr)
			switch {
			case tc.wantReason == "" && (!d.Approve || d.Reason != ReasonApproved):
				t.Errorf("Decide = %+v, want approval", d)
			case tc.wantReason != "" && (d.Approve || d.Reason != tc.wantReason):
				t.Errorf("Decide = %+v, want denial %s", d, tc.wantReason)
			}
		})
	}
}
