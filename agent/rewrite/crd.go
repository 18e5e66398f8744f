package rewrite

import "strings"

// crd rewrites a CustomResourceDefinition of a renamed group: its name
// (<plural>.<group>), spec.group, spec.names and status.acceptedNames
// (kind, listKind, plural, singular, shortNames, categories).
// spec.versions, the schemas and spec.conversion (its webhook's address
// included) are left alone. A patch that lacks spec.group takes the group
// from metadata.name, and one without either from the name in the
// request path (name).
func (r *Rewriter) crd(obj map[string]any, name string) {
	group := ""
	if _, g, ok := strings.Cut(name, "."); ok {
		group = g
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta != nil {
		if name, ok := meta["name"].(string); ok {
			if _, g, ok := strings.Cut(name, "."); ok {
				group = g
			}
			meta["name"] = r.CRDName(name)
		}
	}
	spec, _ := obj["spec"].(map[string]any)
	if spec != nil {
		if g, ok := spec["group"].(string); ok {
			group = g
			spec["group"] = r.Group(g)
		}
	}
	if !r.Renamed(group) {
		return
	}
	if spec != nil {
		r.crdNames(spec["names"])
	}
	if st, ok := obj["status"].(map[string]any); ok {
		r.crdNames(st["acceptedNames"])
	}
}

func (r *Rewriter) crdNames(v any) {
	n, ok := v.(map[string]any)
	if !ok {
		return
	}
	swapString(n, "kind", r.kinds.swap)
	swapString(n, "listKind", r.kinds.swap)
	swapString(n, "plural", r.resources.swap)
	swapString(n, "singular", r.resources.swap)
	swapStrings(n["shortNames"], r.resources.swap)
	swapStrings(n["categories"], r.categories.swap)
}

// CRDName swaps a CustomResourceDefinition's name, "<plural>.<group>", if
// its group is renamed.
func (r *Rewriter) CRDName(name string) string {
	plural, g, ok := strings.Cut(name, ".")
	if !ok || !r.Renamed(g) {
		return name
	}
	return r.resources.swap(plural) + "." + r.groups[g]
}
