package identity

import (
	"slices"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
)

func TestValidateSignerName(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	domain253 := strings.Repeat(long(63)+".", 3) + long(61)
	tests := []struct {
		name, signer string
		// want is a substring of the error; empty means valid.
		want string
	}{
		{"kubelet-serving", "kubernetes.io/kubelet-serving", ""},
		{"cert-manager ClusterIssuer", "clusterissuers.cert-manager.io/node-serving", ""},
		// A namespaced issuer: <namespace>.<name> in the path.
		{"cert-manager Issuer", "issuers.cert-manager.io/kube-apicache.serving", ""},
		{"digits and hyphens", "ca-1.example.com/signer-2", ""},
		{"empty", "", "empty"},
		{"no slash", "example.com", "one '/'"},
		{"two slashes", "example.com/a/b", "one '/'"},
		{"empty path", "example.com/", "path after '/' is empty"},
		{"empty domain", "/signer", "at least two"},
		{"single-label domain", "example/signer", "at least two"},
		{"upper case domain", "Example.com/signer", `domain label "Example"`},
		{"empty domain label", "example..com/signer", `domain label ""`},
		{"domain label too long", long(64) + ".com/signer", "domain label"},
		{"domain too long", strings.Repeat(long(60)+".", 5) + "com/signer", "domain is 308 characters"},
		{"upper case path", "example.com/Signer", `path part "Signer"`},
		{"empty path part", "example.com/a..b", `path part ""`},
		{"path part with underscore", "example.com/my_signer", `path part "my_signer"`},
		{"path part of 253", "example.com/" + long(253), ""},
		{"path part of 254", "example.com/" + long(254), `path part`},
		// 253 + '/' + 253 + '.' + 63 = 571, kube-apiserver's maximum.
		{"longest name", domain253 + "/" + long(253) + "." + long(63), ""},
		{"name too long", domain253 + "/" + long(253) + "." + long(64), "more than the 571"},
		// kubernetes.io is reserved; its other signers issue no serving
		// certificates.
		{"kube-apiserver-client", "kubernetes.io/kube-apiserver-client", "reserved"},
		{"legacy-unknown", "kubernetes.io/legacy-unknown", "reserved"},
		{"kubernetes.io subdomain", "beta.kubernetes.io/serving", "reserved"},
		{"kubernetes.io lookalike", "notkubernetes.io/serving", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSignerName(tc.signer)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("ValidateSignerName(%q) = %v, want nil", tc.signer, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("ValidateSignerName(%q) = %v, want an error containing %q", tc.signer, err, tc.want)
			}
		})
	}
}

// TestRequestUsages: the usages each signer accepts, never client auth.
func TestRequestUsages(t *testing.T) {
	ds, ke, sa := certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth
	tests := []struct {
		signer string
		want   []certificatesv1.KeyUsage
	}{
		// What the kubelet asks for with an ECDSA key, and what the
		// approver has always required for that signer.
		{"kubernetes.io/kubelet-serving", []certificatesv1.KeyUsage{ds, sa}},
		// EKS's app-serving signer: these three, no client auth.
		{"beta.eks.amazonaws.com/app-serving", []certificatesv1.KeyUsage{ke, ds, sa}},
		{"clusterissuers.cert-manager.io/kube-apicache", []certificatesv1.KeyUsage{ke, ds, sa}},
	}
	for _, tc := range tests {
		got := RequestUsages(tc.signer)
		if !slices.Equal(got, tc.want) {
			t.Errorf("RequestUsages(%q) = %q, want %q", tc.signer, got, tc.want)
		}
		if slices.Contains(got, certificatesv1.UsageClientAuth) {
			t.Errorf("RequestUsages(%q) asks for client auth", tc.signer)
		}
	}
}
