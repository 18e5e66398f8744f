// Package approver decides and records the approval of the agents' serving
// certificate requests. The policy is a pure function of the
// CertificateSigningRequest; the controller applies it to the CSRs it owns.
package approver

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kube-apicache/kube-apicache/agent/identity"
)

// NodeNameExtra is the user extra that kube-apiserver derives from a
// ServiceAccount token bound to a Pod: the node the Pod runs on.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Policy says which serving CSRs to approve.
type Policy struct {
	// AgentUser is the username of the agent's ServiceAccount,
	// system:serviceaccount:<namespace>:<name>.
	AgentUser string
	// SANs are exactly the names and IPs an agent's certificate carries.
	SANs identity.SANs
	// MaxLifetime caps the lifetime a CSR may ask for (spec.expirationSeconds,
	// which must be set). Zero leaves it to the signer's own maximum. A
	// stolen agent token must not buy a certificate for the kubernetes
	// Service names that outlives the token by months.
	MaxLifetime time.Duration
	// SignerName is the signer whose CSRs the approver decides, the
	// agents' --signer-name; empty means identity.DefaultSignerName. CSRs
	// for any other signer are not the approver's: it never approves or
	// denies them (nor may it: its RBAC grants `approve` on this signer
	// alone). Must pass identity.ValidateSignerName.
	SignerName string
}

// Signer returns the signer whose CSRs p decides: SignerName, or
// identity.DefaultSignerName if that is empty.
func (p *Policy) Signer() string {
	if p.SignerName != "" {
		return p.SignerName
	}
	return identity.DefaultSignerName
}

// Reasons on the Approved or Denied condition.
const (
	ReasonApproved       = "KubeApicacheServingApproved"
	ReasonWrongSigner    = "WrongSigner"
	ReasonWrongRequester = "WrongRequester"
	ReasonMalformed      = "MalformedRequest"
	ReasonWrongSubject   = "WrongSubject"
	ReasonNodeMismatch   = "NodeMismatch"
	ReasonWrongSANs      = "WrongSubjectAltNames"
	ReasonWrongUsages    = "WrongUsages"
	ReasonUnsupportedKey = "UnsupportedKey"
	ReasonWrongLifetime  = "WrongLifetime"
)

// Decision is the outcome for one CSR.
type Decision struct {
	Approve bool
	// Reason is a CamelCase word for the condition, Message a sentence.
	Reason, Message string
}

func deny(reason, format string, args ...any) Decision {
	return Decision{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Owns reports whether the approver decides csr: a CSR for p's signer that
// either comes from the agent's ServiceAccount or asks for any of the
// kubernetes Service's names or IPs, or a wildcard covering one (nobody
// else may get a certificate pods would take for kube-apiserver from this
// signer). Kubelets' own serving CSRs are neither, and are left to
// whoever approves them; so is every CSR for another signer, even the
// agent's.
func (p *Policy) Owns(csr *certificatesv1.CertificateSigningRequest) bool {
	if csr.Spec.SignerName != p.Signer() {
		return false
	}
	if csr.Spec.Username == p.AgentUser {
		return true
	}
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return false
	}
	for _, name := range req.DNSNames {
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		if slices.Contains(p.SANs.DNSNames, name) {
			return true
		}
		// A wildcard that covers one of the names (*.default.svc covers
		// kubernetes.default.svc) would be as good to pods.
		if suffix, ok := strings.CutPrefix(name, "*"); ok && suffix != "" {
			for _, want := range p.SANs.DNSNames {
				if _, rest, found := strings.Cut(want, "."); found && "."+rest == suffix {
					return true
				}
			}
		}
	}
	for _, ip := range req.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok && slices.Contains(p.SANs.IPs, a.Unmap()) {
			return true
		}
	}
	return false
}

// Decide approves csr only if every rule holds: p's signer, the
// agent's ServiceAccount as requester, a node name bound to the requester's
// token that matches the subject, exactly the allowed SANs, and exactly the
// serving usages for the key type. The first rule that fails is the reason
// for the denial.
func (p *Policy) Decide(csr *certificatesv1.CertificateSigningRequest) Decision {
	spec := &csr.Spec
	// The controller passes only CSRs that Owns, which are for p's signer;
	// this holds the line for any other caller.
	if spec.SignerName != p.Signer() {
		return deny(ReasonWrongSigner, "signer %q is not %q", spec.SignerName, p.Signer())
	}
	if spec.Username != p.AgentUser {
		return deny(ReasonWrongRequester, "requester %q is not the agent's ServiceAccount %q", spec.Username, p.AgentUser)
	}
	// kube-apiserver puts every ServiceAccount token's user in these
	// groups; another authenticator (webhook, OIDC, a client certificate)
	// that yields the same username does not.
	if groups := serviceAccountGroups(p.AgentUser); !sets.New(spec.Groups...).HasAll(groups...) {
		return deny(ReasonWrongRequester, "requester %q is not authenticated as a ServiceAccount (groups %q lack %q)", spec.Username, spec.Groups, groups)
	}
	nodes := spec.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return deny(ReasonNodeMismatch, "the requester's credential is not bound to a node (user extra %s = %q); use a Pod-bound ServiceAccount token", NodeNameExtra, []string(nodes))
	}
	node := nodes[0]
	req, err := parseRequest(spec.Request)
	if err != nil {
		return deny(ReasonMalformed, "%v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return deny(ReasonMalformed, "the request's signature does not verify: %v", err)
	}
	subj := req.Subject
	if !slices.Equal(subj.Organization, []string{identity.NodesOrganization}) || len(subj.OrganizationalUnit) > 0 ||
		len(subj.Country) > 0 || len(subj.Province) > 0 || len(subj.Locality) > 0 || len(subj.StreetAddress) > 0 ||
		len(subj.PostalCode) > 0 || subj.SerialNumber != "" || len(subj.ExtraNames) > 0 ||
		// Exactly one O and one CN attribute: a repeated CN (parsers
		// disagree on which one counts) or any other attribute is refused.
		len(subj.Names) != 2 {
		return deny(ReasonWrongSubject, "subject %q must be exactly O=%s, CN=%s<node>", subj.String(), identity.NodesOrganization, identity.NodeUserPrefix)
	}
	if want := identity.NodeCommonName(node); subj.CommonName != want {
		return deny(ReasonNodeMismatch, "subject CN %q does not match the requester's node: want %q", subj.CommonName, want)
	}
	if err := p.checkSANs(req); err != nil {
		return deny(ReasonWrongSANs, "%v", err)
	}
	wants, err := p.servingUsages(req.PublicKey)
	if err != nil {
		return deny(ReasonUnsupportedKey, "%v", err)
	}
	if got := sets.New(spec.Usages...); len(got) != len(spec.Usages) || !slices.ContainsFunc(wants, got.Equal) {
		allowed := make([]string, len(wants))
		for i, w := range wants {
			allowed[i] = fmt.Sprintf("%q", sets.List(w))
		}
		return deny(ReasonWrongUsages, "usages %q must be exactly %s", spec.Usages, strings.Join(allowed, " or "))
	}
	if p.MaxLifetime > 0 {
		if spec.ExpirationSeconds == nil {
			return deny(ReasonWrongLifetime, "expirationSeconds must be set, at most %d", int64(p.MaxLifetime/time.Second))
		}
		if got := time.Duration(*spec.ExpirationSeconds) * time.Second; got > p.MaxLifetime {
			return deny(ReasonWrongLifetime, "expirationSeconds %d is above the maximum %d", *spec.ExpirationSeconds, int64(p.MaxLifetime/time.Second))
		}
	}
	return Decision{Approve: true, Reason: ReasonApproved,
		Message: fmt.Sprintf("kube-apicache serving certificate for node %s", node)}
}

// servingUsages returns the sets of usages an agent CSR for p's signer
// with key pub may ask for: a serving certificate's, never client auth.
// An ECDSA key asks for what identity.RequestUsages gives for the signer;
// for a signer other than kubelet-serving, digital signature and server
// auth alone are accepted too, as agents of earlier releases asked for
// them whatever the signer (an approver upgraded first still approves
// their renewals). An RSA key needs key encipherment as well.
func (p *Policy) servingUsages(pub any) ([]sets.Set[certificatesv1.KeyUsage], error) {
	ecdsaOnly := sets.New(certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth)
	withEncipherment := sets.New(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth)
	switch pub.(type) {
	case *ecdsa.PublicKey:
		if p.Signer() == identity.DefaultSignerName {
			return []sets.Set[certificatesv1.KeyUsage]{ecdsaOnly}, nil
		}
		return []sets.Set[certificatesv1.KeyUsage]{withEncipherment, ecdsaOnly}, nil
	case *rsa.PublicKey:
		return []sets.Set[certificatesv1.KeyUsage]{withEncipherment}, nil
	default:
		return nil, fmt.Errorf("key type %T is not ECDSA or RSA", pub)
	}
}

// serviceAccountGroups returns the groups kube-apiserver gives the
// ServiceAccount user name: system:serviceaccounts and
// system:serviceaccounts:<namespace>.
func serviceAccountGroups(user string) []string {
	ns, _, _ := strings.Cut(strings.TrimPrefix(user, serviceAccountUserPrefix), ":")
	return []string{serviceAccountGroup, serviceAccountGroup + ":" + ns}
}

const (
	serviceAccountUserPrefix = "system:serviceaccount:"
	serviceAccountGroup      = "system:serviceaccounts"
)

// checkSANs requires exactly p.SANs: no other name, IP, email or URI, none
// missing, none twice.
func (p *Policy) checkSANs(req *x509.CertificateRequest) error {
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return fmt.Errorf("email and URI SANs are not allowed (got %q, %d URIs)", req.EmailAddresses, len(req.URIs))
	}
	gotDNS := sets.New(req.DNSNames...)
	wantDNS := sets.New(p.SANs.DNSNames...)
	if extra := gotDNS.Difference(wantDNS); extra.Len() > 0 {
		return fmt.Errorf("DNS names %q are not allowed; allowed exactly %q", sets.List(extra), p.SANs.DNSNames)
	}
	if missing := wantDNS.Difference(gotDNS); missing.Len() > 0 {
		return fmt.Errorf("DNS names %q are missing; required exactly %q", sets.List(missing), p.SANs.DNSNames)
	}
	if gotDNS.Len() != len(req.DNSNames) {
		return fmt.Errorf("DNS names %q repeat a name", req.DNSNames)
	}
	gotIPs := sets.New[netip.Addr]()
	for _, ip := range req.IPAddresses {
		a, _ := netip.AddrFromSlice(ip)
		gotIPs.Insert(a.Unmap())
	}
	wantIPs := sets.New(p.SANs.IPs...)
	if extra := gotIPs.Difference(wantIPs); extra.Len() > 0 {
		return fmt.Errorf("IP addresses %s are not allowed; allowed exactly %s", addrs(extra), addrs(wantIPs))
	}
	if missing := wantIPs.Difference(gotIPs); missing.Len() > 0 {
		return fmt.Errorf("IP addresses %s are missing; required exactly %s", addrs(missing), addrs(wantIPs))
	}
	if gotIPs.Len() != len(req.IPAddresses) {
		return fmt.Errorf("IP addresses %v repeat an address", req.IPAddresses)
	}
	return nil
}

func addrs(s sets.Set[netip.Addr]) string {
	l := s.UnsortedList()
	slices.SortFunc(l, func(a, b netip.Addr) int { return a.Compare(b) })
	out := make([]string, len(l))
	for i, a := range l {
		out[i] = a.String()
	}
	return "[" + strings.Join(out, " ") + "]"
}

// parseRequest decodes the PEM CERTIFICATE REQUEST in a CSR's spec.request.
func parseRequest(data []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("spec.request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing spec.request: %w", err)
	}
	return req, nil
}
