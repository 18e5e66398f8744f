package identity

import (
	"errors"
	"fmt"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultSignerName is the signer the agent asks for its serving
// certificate, and the one the approver approves for, when none is
// configured: kube-controller-manager's kubelet-serving signer, which
// issues from the cluster CA, the CA most distributions put in the pods'
// ca.crt.
const DefaultSignerName = certificatesv1.KubeletServingSignerName

// Length limits of a CSR spec.signerName, as kube-apiserver enforces
// them: the domain is a DNS subdomain, and the path leaves room for a
// namespaced resource, <namespace>.<name> (a label, a dot and a
// subdomain).
const (
	maxSignerDomainLength = validation.DNS1123SubdomainMaxLength
	maxSignerPathLength   = validation.DNS1123LabelMaxLength + 1 + validation.DNS1123SubdomainMaxLength
	maxSignerNameLength   = maxSignerDomainLength + 1 + maxSignerPathLength
)

// ValidateSignerName returns nil if name is a signer the agent may ask
// for its serving certificate: a name kube-apiserver accepts in a CSR's
// spec.signerName, DOMAIN/PATH, where DOMAIN is a DNS subdomain of at
// least two labels and PATH is one or more dot-separated parts of
// lowercase letters, digits and '-' (cert-manager's
// clusterissuers.cert-manager.io/my-issuer, for one). Of the names under
// kubernetes.io, which the Kubernetes project reserves for its own
// signers, only DefaultSignerName is accepted: the others issue client
// certificates or nothing at all, never a serving certificate.
func ValidateSignerName(name string) error {
	if name == "" {
		return errors.New("signer name is empty")
	}
	domain, path, ok := strings.Cut(name, "/")
	if !ok || strings.Contains(path, "/") {
		return fmt.Errorf("signer name %q must be a domain and a path with one '/' between them, as in example.com/my-signer", name)
	}
	if len(name) > maxSignerNameLength {
		return fmt.Errorf("signer name is %d characters long, more than the %d kube-apiserver accepts", len(name), maxSignerNameLength)
	}
	if len(domain) > maxSignerDomainLength {
		return fmt.Errorf("signer name %q: domain is %d characters long, more than %d", name, len(domain), maxSignerDomainLength)
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return fmt.Errorf("signer name %q: domain %q must have at least two dot-separated labels", name, domain)
	}
	for _, l := range labels {
		if errs := validation.IsDNS1123Label(l); len(errs) > 0 {
			return fmt.Errorf("signer name %q: domain label %q: %s", name, l, errs[0])
		}
	}
	if path == "" {
		return fmt.Errorf("signer name %q: the path after '/' is empty", name)
	}
	for _, part := range strings.Split(path, ".") {
		if errs := validation.IsDNS1123Subdomain(part); len(errs) > 0 {
			return fmt.Errorf("signer name %q: path part %q: %s", name, part, errs[0])
		}
	}
	if (domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io")) && name != DefaultSignerName {
		return fmt.Errorf("signer name %q is reserved to Kubernetes' own signers, none of which but %s issues serving certificates", name, DefaultSignerName)
	}
	return nil
}

// RequestUsages returns the key usages the agent's CSRs for signer ask
// for, its keys being ECDSA. For kubernetes.io/kubelet-serving, digital
// signature and server auth: one of the two sets that signer accepts, and
// the one the kubelet asks for with an ECDSA key. For any other signer,
// key encipherment, digital signature and server auth, the set every
// serving signer takes: Amazon EKS's beta.eks.amazonaws.com/app-serving
// accepts these and no others. Never client auth, whatever the signer: a
// certificate for the kubernetes Service's names must not also
// authenticate its holder to kube-apiserver.
func RequestUsages(signer string) []certificatesv1.KeyUsage {
	if signer == DefaultSignerName {
		return []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	return []certificatesv1.KeyUsage{certificatesv1.UsageKeyEncipherment, certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
}

// signerName returns o.SignerName, or DefaultSignerName if it is empty.
func (o *Options) signerName() string {
	if o.SignerName != "" {
		return o.SignerName
	}
	return DefaultSignerName
}
