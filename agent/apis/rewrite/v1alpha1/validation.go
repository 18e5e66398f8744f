package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GroupServing is how the cluster serves an API group, as the agent finds
// out at start-up.
type GroupServing int

const (
	// NotServed: the cluster does not serve the group.
	NotServed GroupServing = iota
	// ServedByCustomResources: only CustomResourceDefinitions serve the
	// group, and the profile's callers may use it. The renamed copy made
	// by an earlier start is such a group.
	ServedByCustomResources
	// ServedByCluster: kube-apiserver itself or an aggregated APIService
	// serves the group; custom resources cannot stand in for it.
	ServedByCluster
	// ServedDenied: the group is served and the profile's callers have no
	// rights on it (the agent asks with SubjectAccessReviews): it belongs
	// to someone else.
	ServedDenied
)

// ServedGroups is what the cluster serves. The agent builds it at
// start-up from discovery and SubjectAccessReviews; Validate only asks.
type ServedGroups interface {
	// Serving says how the cluster serves group to the callers of the
	// named profile.
	Serving(profile, group string) GroupServing
}

// StaticServedGroups is a ServedGroups that answers the same for every
// profile.
type StaticServedGroups map[string]GroupServing

// Serving implements ServedGroups.
func (s StaticServedGroups) Serving(_, group string) GroupServing { return s[group] }

var (
	kindPrefixRE     = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	resourcePrefixRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
)

// reservedDomains are the domains whose keys and groups belong to
// Kubernetes: never renamed, never a target.
var reservedDomains = []string{"kubernetes.io", "k8s.io"}

// Validate checks c, one error per mistake, each naming its field.
// served may be nil when the cluster is not known (a dry check of the
// file): the checks against served groups are then skipped.
func Validate(c *RewriteConfiguration, served ServedGroups) field.ErrorList {
	var errs field.ErrorList
	root := field.NewPath("profiles")
	if len(c.Profiles) == 0 {
		return append(errs, field.Required(root, "at least one profile"))
	}
	names := map[string]*field.Path{}
	// Every group each profile names, on either side, for the check that
	// a renamed group is no other profile's group.
	type named struct {
		profile int
		path    *field.Path
	}
	groups := map[string]named{}
	for i, p := range c.Profiles {
		for j, g := range p.Groups {
			gp := root.Index(i).Child("groups").Index(j)
			if _, ok := groups[g.From]; !ok && g.From != "" {
				groups[g.From] = named{i, gp.Child("from")}
			}
		}
	}
	errs = append(errs, validateSelectorOverlaps(c.Profiles, root)...)
	for i, p := range c.Profiles {
		pp := root.Index(i)
		errs = append(errs, validateProfile(&p, pp, served)...)
		if p.Name != "" {
			if prev, ok := names[p.Name]; ok {
				errs = append(errs, field.Duplicate(pp.Child("name"), p.Name+" (also "+prev.String()+")"))
			} else {
				names[p.Name] = pp.Child("name")
			}
		}
		for j, g := range p.Groups {
			if g.To == "" {
				continue
			}
			gp := pp.Child("groups").Index(j).Child("to")
			if prev, ok := groups[g.To]; ok && prev.profile != i {
				errs = append(errs, field.Invalid(gp, g.To, "already a group of another profile ("+prev.path.String()+")"))
				continue
			}
			if _, ok := groups[g.To]; !ok {
				groups[g.To] = named{i, gp}
			}
		}
	}
	return errs
}

// ValidateProfile checks one profile on its own, without the cluster's
// groups or the other profiles: what agent/rewrite needs to build a
// rewriter from it.
func ValidateProfile(p *RewriteProfile, path *field.Path) field.ErrorList {
	return validateProfile(p, path, nil)
}

func validateProfile(p *RewriteProfile, path *field.Path, served ServedGroups) field.ErrorList {
	var errs field.ErrorList
	if p.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "a DNS label"))
	} else {
		for _, msg := range validation.IsDNS1123Label(p.Name) {
			errs = append(errs, field.Invalid(path.Child("name"), p.Name, msg))
		}
	}
	errs = append(errs, validateSelector(p.Selector, path.Child("selector"))...)
	errs = append(errs, validateGroups(p, path.Child("groups"), served)...)

	kp := path.Child("kindPrefix")
	switch {
	case p.KindPrefix == "":
		errs = append(errs, field.Required(kp, "a kind prefix such as Renamed: renamed kinds must not collide with the originals' in kubectl and RESTMappers"))
	case !kindPrefixRE.MatchString(p.KindPrefix):
		errs = append(errs, field.Invalid(kp, p.KindPrefix, "must be an upper-case letter followed by letters and digits"))
	}
	if p.ResourcePrefix != nil && *p.ResourcePrefix != "" && !resourcePrefixRE.MatchString(*p.ResourcePrefix) {
		errs = append(errs, field.Invalid(path.Child("resourcePrefix"), *p.ResourcePrefix, "must be a lower-case letter followed by lower-case letters and digits, or empty to keep resource names"))
	}
	seen := map[string]bool{}
	for i, c := range p.KeepCategories {
		cp := path.Child("keepCategories").Index(i)
		switch {
		case c == "":
			errs = append(errs, field.Required(cp, "a category name"))
		case seen[c]:
			errs = append(errs, field.Duplicate(cp, c))
		}
		seen[c] = true
	}
	errs = append(errs, validateKeyDomains(p.Labels, path.Child("labels"), true)...)
	errs = append(errs, validateKeyDomains(p.Annotations, path.Child("annotations"), true)...)
	errs = append(errs, validateKeyDomains(p.Finalizers, path.Child("finalizers"), false)...)
	return errs
}

func validateSelector(s CallerSelector, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(s.ServiceAccounts) == 0 && len(s.Namespaces) == 0 {
		return append(errs, field.Required(path, "serviceAccounts or namespaces: a profile never applies to every caller"))
	}
	seen := map[string]bool{}
	for i, sa := range s.ServiceAccounts {
		p := path.Child("serviceAccounts").Index(i)
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" {
			errs = append(errs, field.Invalid(p, sa, "must be namespace/name"))
			continue
		}
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p, sa, "namespace: "+msg))
		}
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(p, sa, "name: "+msg))
		}
		if seen[sa] {
			errs = append(errs, field.Duplicate(p, sa))
		}
		seen[sa] = true
	}
	seen = map[string]bool{}
	for i, ns := range s.Namespaces {
		p := path.Child("namespaces").Index(i)
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p, ns, msg))
		}
		if seen[ns] {
			errs = append(errs, field.Duplicate(p, ns))
		}
		seen[ns] = true
	}
	return errs
}

// validateSelectorOverlaps refuses a caller that two profiles select: a
// ServiceAccount or a namespace named twice, or a ServiceAccount of a
// namespace another profile selects whole. Which profile rewrites a caller
// must not depend on the order of the file.
func validateSelectorOverlaps(profiles []RewriteProfile, root *field.Path) field.ErrorList {
	var errs field.ErrorList
	namespaces := map[string]int{} // namespace → profile
	accounts := map[string]int{}   // namespace/name → profile
	for i, p := range profiles {
		for _, ns := range p.Selector.Namespaces {
			if _, ok := namespaces[ns]; !ok {
				namespaces[ns] = i
			}
		}
		for _, sa := range p.Selector.ServiceAccounts {
			if _, ok := accounts[sa]; !ok {
				accounts[sa] = i
			}
		}
	}
	for i, p := range profiles {
		sp := root.Index(i).Child("selector")
		for j, ns := range p.Selector.Namespaces {
			if other := namespaces[ns]; other != i {
				errs = append(errs, field.Invalid(sp.Child("namespaces").Index(j), ns, fmt.Sprintf("also selected by %s: a caller belongs to one profile", root.Index(other))))
			}
		}
		for j, sa := range p.Selector.ServiceAccounts {
			ns, _, _ := strings.Cut(sa, "/")
			if other, ok := namespaces[ns]; ok && other != i {
				errs = append(errs, field.Invalid(sp.Child("serviceAccounts").Index(j), sa, fmt.Sprintf("its namespace is selected by %s: a caller belongs to one profile", root.Index(other))))
			} else if other := accounts[sa]; other != i {
				errs = append(errs, field.Invalid(sp.Child("serviceAccounts").Index(j), sa, fmt.Sprintf("also selected by %s: a caller belongs to one profile", root.Index(other))))
			}
		}
	}
	return errs
}

func validateGroups(p *RewriteProfile, path *field.Path, served ServedGroups) field.ErrorList {
	var errs field.ErrorList
	if len(p.Groups) == 0 {
		return append(errs, field.Required(path, "at least one group to rename"))
	}
	// Every group named on either side, for the swap to be a
	// permutation: no group may appear twice.
	seen := map[string]*field.Path{}
	for i, g := range p.Groups {
		gp := path.Index(i)
		for _, end := range []struct {
			name, value string
		}{{"from", g.From}, {"to", g.To}} {
			fp := gp.Child(end.name)
			if end.value == "" {
				errs = append(errs, field.Required(fp, "an API group"))
				continue
			}
			if msgs := validation.IsDNS1123Subdomain(end.value); len(msgs) > 0 {
				for _, msg := range msgs {
					errs = append(errs, field.Invalid(fp, end.value, msg))
				}
				continue
			}
			if !strings.Contains(end.value, ".") {
				errs = append(errs, field.Invalid(fp, end.value, "not a group of custom resources (their groups contain a dot): built-in groups are not renamed"))
				continue
			}
			if d := reserved(end.value); d != "" {
				errs = append(errs, field.Invalid(fp, end.value, "groups under "+d+" belong to Kubernetes"))
				continue
			}
			if prev, ok := seen[end.value]; ok {
				if end.name == "from" && strings.HasSuffix(prev.String(), ".from") {
					errs = append(errs, field.Duplicate(fp, end.value+" (its kinds would be mapped twice; also "+prev.String()+")"))
				} else {
					errs = append(errs, field.Invalid(fp, end.value, "already named by "+prev.String()+": each group may be renamed once, and a target may not be another rule's original"))
				}
				continue
			}
			seen[end.value] = fp
		}
		if g.From != "" && g.From == g.To {
			// Reported above as a duplicate; nothing to add.
			continue
		}
		if served == nil || g.To == "" {
			continue
		}
		switch served.Serving(p.Name, g.To) {
		case ServedByCluster:
			errs = append(errs, field.Forbidden(gp.Child("to"), fmt.Sprintf("%s is served by the cluster itself (built in or aggregated), not by custom resources: renamed objects would collide with it", g.To)))
		case ServedDenied:
			errs = append(errs, field.Forbidden(gp.Child("to"), fmt.Sprintf("%s is already served and the profile's callers have no rights on it: it belongs to someone else", g.To)))
		}
	}
	return errs
}

func validateKeyDomains(rules []KeyDomainRename, path *field.Path, emptyFrom bool) field.ErrorList {
	var errs field.ErrorList
	type end struct {
		value string
		path  *field.Path
	}
	var ends []end
	unprefixed := false
	for i, r := range rules {
		rp := path.Index(i)
		for _, e := range []struct {
			name, value string
		}{{"from", r.From}, {"to", r.To}} {
			fp := rp.Child(e.name)
			if e.value == "" {
				switch {
				case e.name == "to":
					errs = append(errs, field.Required(fp, "a domain"))
				case !emptyFrom:
					errs = append(errs, field.Required(fp, "a domain: unprefixed finalizers belong to Kubernetes"))
				case unprefixed:
					errs = append(errs, field.Duplicate(fp, "(unprefixed keys)"))
				default:
					unprefixed = true
				}
				continue
			}
			if msgs := validation.IsDNS1123Subdomain(e.value); len(msgs) > 0 {
				for _, msg := range msgs {
					errs = append(errs, field.Invalid(fp, e.value, msg))
				}
				continue
			}
			if d := reserved(e.value); d != "" {
				errs = append(errs, field.Invalid(fp, e.value, "keys under "+d+" belong to Kubernetes and are never moved"))
				continue
			}
			clash := false
			for _, prev := range ends {
				if overlaps(prev.value, e.value) {
					errs = append(errs, field.Invalid(fp, e.value, "overlaps "+prev.path.String()+" ("+prev.value+"): a key would be moved by two rules"))
					clash = true
					break
				}
			}
			if !clash {
				ends = append(ends, end{e.value, fp})
			}
		}
	}
	return errs
}

// overlaps says whether a key domain of a is also one of b: equal, or one
// a subdomain of the other.
func overlaps(a, b string) bool {
	return a == b || strings.HasSuffix(a, "."+b) || strings.HasSuffix(b, "."+a)
}

// reserved returns the Kubernetes domain that d is or lies under, or "".
func reserved(d string) string {
	for _, r := range reservedDomains {
		if d == r || strings.HasSuffix(d, "."+r) {
			return r
		}
	}
	return ""
}
