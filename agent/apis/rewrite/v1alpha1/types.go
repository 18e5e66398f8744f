// Package v1alpha1 is the format of the rewrite profiles: one
// RewriteConfiguration file that says which callers see which API groups,
// kinds, resources and metadata keys under which other names.
//
// A profile renames, for the callers its selector chooses, every name of
// its groups: group G becomes its target T, a kind K of G becomes
// kindPrefix+K, a resource r becomes lower(kindPrefix)+r, and the keys of
// labels, annotations and finalizers under a chosen domain move to another
// domain. The mapping is a swap, its own inverse: the same rules rename the
// caller's requests and restore the answers (see agent/rewrite).
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// RewriteConfiguration is the file of rewrite profiles.
type RewriteConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// Profiles are the rewrite profiles. A caller is selected by at most
	// one of them (Validate refuses overlapping selectors).
	Profiles []RewriteProfile `json:"profiles"`
}

// RewriteProfile renames a set of API groups for the callers it selects.
type RewriteProfile struct {
	// Name identifies the profile in errors, logs and metrics: a DNS label.
	Name string `json:"name"`
	// Selector chooses the callers, by the ServiceAccount the agent's
	// TokenReview gave, never by anything the request claims.
	Selector CallerSelector `json:"selector"`
	// Groups are the renamed API groups: each original group and its
	// target, both DNS subdomains.
	Groups []GroupRename `json:"groups"`
	// KindPrefix is put before every kind of a renamed group
	// ("Renamed": Widget becomes RenamedWidget, WidgetList becomes
	// RenamedWidgetList); its lower-case form is put before every resource
	// name, singular name, short name and category (widgets becomes
	// renamedwidgets). Required: an upper-case letter, then letters and
	// digits.
	KindPrefix string `json:"kindPrefix"`
	// ResourcePrefix is put before every resource name, singular name,
	// short name and category of a renamed group. Unset: KindPrefix in
	// lower case. Empty: those names stay as they are, and the renamed
	// group alone keeps the two copies apart (widgets.example.com is
	// stored as widgets.renamed.example.io). Lower-case letters and
	// digits, starting with a letter.
	ResourcePrefix *string `json:"resourcePrefix,omitempty"`
	// KeepCategories are the categories left as they are in renamed
	// groups. Defaults to ["all"].
	KeepCategories []string `json:"keepCategories,omitempty"`
	// Labels move label keys (and label selector keys) from one domain
	// to another.
	Labels []KeyDomainRename `json:"labels,omitempty"`
	// Annotations move annotation keys from one domain to another.
	Annotations []KeyDomainRename `json:"annotations,omitempty"`
	// Finalizers move finalizers from one domain to another. From must
	// not be empty: unprefixed finalizers (orphan, foregroundDeletion)
	// belong to Kubernetes.
	Finalizers []KeyDomainRename `json:"finalizers,omitempty"`
}

// CallerSelector chooses callers: a caller matches if it is one of the
// ServiceAccounts or a ServiceAccount of one of the namespaces. Both lists
// empty is an error: a profile never applies to everyone by omission.
type CallerSelector struct {
	// ServiceAccounts are "namespace/name" pairs.
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// Namespaces select every ServiceAccount of these namespaces.
	Namespaces []string `json:"namespaces,omitempty"`
}

// GroupRename renames one API group.
type GroupRename struct {
	// From is the group the callers know (kubevirt.io).
	From string `json:"from"`
	// To is the group stored in the cluster (x.virtualization.example.io).
	To string `json:"to"`
}

// KeyDomainRename moves the keys of one domain to another: with from
// "kubevirt.io" and to "kubevirt.renamed.example.io", the key
// kubevirt.io/schedulable becomes kubevirt.renamed.example.io/schedulable
// and vm.kubevirt.io/name becomes vm.kubevirt.renamed.example.io/name
// (subdomains move with their domain). An empty From stands for the keys
// without a prefix (app becomes renamed.example.io/app; only keys of
// exactly the domain To move back). Keys of kubernetes.io and k8s.io and
// their subdomains are never moved.
type KeyDomainRename struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// DeepCopyObject implements runtime.Object.
func (c *RewriteConfiguration) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	out := &RewriteConfiguration{TypeMeta: c.TypeMeta}
	for _, p := range c.Profiles {
		out.Profiles = append(out.Profiles, p.DeepCopy())
	}
	return out
}

// DeepCopy returns a copy of p that shares no slices with it.
func (p RewriteProfile) DeepCopy() RewriteProfile {
	out := p
	if p.ResourcePrefix != nil {
		rp := *p.ResourcePrefix
		out.ResourcePrefix = &rp
	}
	out.Selector.ServiceAccounts = clone(p.Selector.ServiceAccounts)
	out.Selector.Namespaces = clone(p.Selector.Namespaces)
	out.Groups = clone(p.Groups)
	out.KeepCategories = clone(p.KeepCategories)
	out.Labels = clone(p.Labels)
	out.Annotations = clone(p.Annotations)
	out.Finalizers = clone(p.Finalizers)
	return out
}

func clone[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append([]T(nil), s...)
}
