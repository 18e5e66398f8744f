package rewrite

import (
	"strings"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
)

// keyMapper moves label, annotation or finalizer keys between domains. Each
// rule swaps the keys of its two domains (and their subdomains); an empty
// From swaps the unprefixed keys with those of exactly the domain To. The
// rules' domains never overlap (v1alpha1 validation), so at most one rule
// applies to a key and move(move(k)) == k. Keys starting with "$" are
// strategic-merge-patch directives and never move.
type keyMapper struct {
	rules []v1alpha1.KeyDomainRename
	// unprefixed is the domain that the unprefixed keys swap with, or "".
	unprefixed string
}

func newKeyMapper(rules []v1alpha1.KeyDomainRename) keyMapper {
	m := keyMapper{}
	for _, r := range rules {
		if r.From == "" {
			m.unprefixed = r.To
			continue
		}
		m.rules = append(m.rules, r)
	}
	return m
}

// movableName says whether an unprefixed key may swap with domain/name.
func movableName(name string) bool {
	return name != "" && !strings.HasPrefix(name, "$") && !strings.Contains(name, "/")
}

func (m keyMapper) move(key string) string {
	if strings.HasPrefix(key, "$") {
		return key
	}
	domain, name, prefixed := strings.Cut(key, "/")
	if !prefixed {
		if m.unprefixed != "" && movableName(key) {
			return m.unprefixed + "/" + key
		}
		return key
	}
	if m.unprefixed != "" && domain == m.unprefixed && movableName(name) {
		return name
	}
	for _, r := range m.rules {
		if d, ok := swapDomain(domain, r.From, r.To); ok {
			return d + "/" + name
		}
		if d, ok := swapDomain(domain, r.To, r.From); ok {
			return d + "/" + name
		}
	}
	return key
}

// swapDomain replaces the domain from at the end of d (d is from or a
// subdomain of it) by to.
func swapDomain(d, from, to string) (string, bool) {
	if d == from {
		return to, true
	}
	if strings.HasSuffix(d, "."+from) {
		return d[:len(d)-len(from)] + to, true
	}
	return "", false
}

// empty says whether m moves nothing.
func (m keyMapper) empty() bool { return m.unprefixed == "" && len(m.rules) == 0 }
