package rewrite

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Rewriter renames and restores the names of one profile. It holds no
// state that changes: one Rewriter serves any number of goroutines.
type Rewriter struct {
	name string
	// fingerprint identifies the profile's content (Fingerprint).
	fingerprint string

	// serviceAccounts ("namespace/name") and namespaces select callers.
	serviceAccounts map[string]bool
	namespaces      map[string]bool

	// groups maps each renamed group to its counterpart, both ways.
	groups map[string]string
	// groupNames are groups' keys, longest first, for the text rewriter.
	groupNames []string

	kinds      swapper
	resources  swapper
	categories swapper

	labels, annotations, finalizers keyMapper
}

// New builds the rewriter of profile p. It fails when p is not valid on
// its own (v1alpha1.ValidateProfile); the checks against the cluster and
// the other profiles are the configuration's (v1alpha1.Validate).
func New(p v1alpha1.RewriteProfile) (*Rewriter, error) {
	if errs := v1alpha1.ValidateProfile(&p, field.NewPath("profile")); len(errs) > 0 {
		return nil, fmt.Errorf("rewrite profile %q: %w", p.Name, errs.ToAggregate())
	}
	spec, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("rewrite profile %q: %w", p.Name, err)
	}
	sum := sha256.Sum256(spec)
	r := &Rewriter{
		name:            p.Name,
		fingerprint:     hex.EncodeToString(sum[:6]),
		serviceAccounts: map[string]bool{},
		namespaces:      map[string]bool{},
		groups:          map[string]string{},
		kinds:           kindSwapper(p.KindPrefix),
		labels:          newKeyMapper(p.Labels),
		annotations:     newKeyMapper(p.Annotations),
		finalizers:      newKeyMapper(p.Finalizers),
	}
	lower := strings.ToLower(p.KindPrefix)
	if p.ResourcePrefix != nil {
		lower = *p.ResourcePrefix
	}
	keep := map[string]bool{}
	for _, c := range p.KeepCategories {
		keep[c] = true
	}
	r.resources = resourceSwapper(lower, nil)
	r.categories = resourceSwapper(lower, keep)
	for _, sa := range p.Selector.ServiceAccounts {
		r.serviceAccounts[sa] = true
	}
	for _, ns := range p.Selector.Namespaces {
		r.namespaces[ns] = true
	}
	for _, g := range p.Groups {
		r.groups[g.From] = g.To
		r.groups[g.To] = g.From
		r.groupNames = append(r.groupNames, g.From, g.To)
	}
	slices.SortFunc(r.groupNames, func(a, b string) int { return len(b) - len(a) })
	return r, nil
}

// Fingerprint is a short hex digest of the profile: two rewriters with
// the same fingerprint rewrite alike. Answers a client may keep (OpenAPI
// documents) carry it in their validators, so that what was rewritten
// under one profile is not taken for what another would give.
func (r *Rewriter) Fingerprint() string { return r.fingerprint }

// Name is the profile's name.
func (r *Rewriter) Name() string { return r.name }

const saPrefix = "system:serviceaccount:"

// Selects says whether the profile rewrites the requests of user, a user
// name as a TokenReview returns it. Only ServiceAccounts are selected.
// The caller must take user from the reviewed identity, never from a
// request header.
func (r *Rewriter) Selects(user string) bool {
	rest, ok := strings.CutPrefix(user, saPrefix)
	if !ok {
		return false
	}
	ns, name, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || name == "" || strings.Contains(name, ":") {
		return false
	}
	return r.namespaces[ns] || r.serviceAccounts[ns+"/"+name]
}

// Renamed says whether group is one of the profile's groups, on either
// side of a rename.
func (r *Rewriter) Renamed(group string) bool {
	_, ok := r.groups[group]
	return ok
}

// Group swaps a renamed group with its counterpart; other groups are
// returned as they are.
func (r *Rewriter) Group(group string) string {
	if g, ok := r.groups[group]; ok {
		return g
	}
	return group
}

// Kind swaps a kind of group, returning the group and kind on the other
// side; kinds of other groups are returned as they are.
func (r *Rewriter) Kind(group, kind string) (string, string) {
	if !r.Renamed(group) {
		return group, kind
	}
	return r.groups[group], r.kinds.swap(kind)
}

// Resource swaps a resource of group, returning the group and resource on
// the other side. A subresource ("widgets/status") keeps its second part.
func (r *Rewriter) Resource(group, resource string) (string, string) {
	if !r.Renamed(group) {
		return group, resource
	}
	return r.groups[group], r.resourceName(resource)
}

// resourceName swaps a resource name of a renamed group, keeping a
// subresource as it is.
func (r *Rewriter) resourceName(resource string) string {
	base, sub, ok := strings.Cut(resource, "/")
	if !ok {
		return r.resources.swap(resource)
	}
	return r.resources.swap(base) + "/" + sub
}

// APIVersion swaps the group of an apiVersion ("group/version").
func (r *Rewriter) APIVersion(apiVersion string) string {
	g, v, ok := strings.Cut(apiVersion, "/")
	if !ok || !r.Renamed(g) {
		return apiVersion
	}
	return r.groups[g] + "/" + v
}

// LabelKey moves a label key between the profile's domains.
func (r *Rewriter) LabelKey(key string) string { return r.labels.move(key) }

// AnnotationKey moves an annotation key between the profile's domains.
func (r *Rewriter) AnnotationKey(key string) string { return r.annotations.move(key) }

// Finalizer moves a finalizer between the profile's domains.
func (r *Rewriter) Finalizer(f string) string { return r.finalizers.move(f) }

// groupOf returns the group of an apiVersion.
func groupOf(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}

// Profiles are the rewriters of a configuration's profiles.
type Profiles []*Rewriter

// NewProfiles builds the rewriter of each of c's profiles. c must have
// passed v1alpha1.Validate, which also makes sure that no caller is
// selected by two profiles.
func NewProfiles(c *v1alpha1.RewriteConfiguration) (Profiles, error) {
	out := make(Profiles, 0, len(c.Profiles))
	for _, p := range c.Profiles {
		r, err := New(p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// For returns the rewriter of the profile that selects user (a reviewed
// user name, see Selects), or nil: that caller's requests and answers
// pass untouched.
func (p Profiles) For(user string) *Rewriter {
	for _, r := range p {
		if r.Selects(user) {
			return r
		}
	}
	return nil
}
