package rewrite

// Discovery is rewritten so that kubectl and client-go's RESTMapper see
// the names the caller knows: legacy discovery (APIGroupList, APIGroup,
// APIResourceList) and aggregated discovery (APIGroupDiscoveryList of
// apidiscovery.k8s.io v2 and v2beta1, which share their shape).

// apiGroup rewrites an APIGroup: its name and every groupVersion.
func (r *Rewriter) apiGroup(g map[string]any) {
	swapString(g, "name", r.Group)
	for _, v := range maps(g["versions"]) {
		swapString(v, "groupVersion", r.APIVersion)
	}
	if pv, ok := g["preferredVersion"].(map[string]any); ok {
		swapString(pv, "groupVersion", r.APIVersion)
	}
}

// apiResourceList rewrites the resources of one group version.
func (r *Rewriter) apiResourceList(l map[string]any) {
	gv, _ := l["groupVersion"].(string)
	group := groupOf(gv)
	swapString(l, "groupVersion", r.APIVersion)
	for _, res := range maps(l["resources"]) {
		r.apiResource(res, group)
	}
}

// apiResource rewrites one APIResource of group. Its names belong to
// group; its kind belongs to its own group field where set (a scale
// subresource's kind is autoscaling's Scale).
func (r *Rewriter) apiResource(res map[string]any, group string) {
	kindGroup := group
	if g, ok := res["group"].(string); ok {
		kindGroup = g
		res["group"] = r.Group(g)
	}
	if r.Renamed(kindGroup) {
		swapString(res, "kind", r.kinds.swap)
	}
	if !r.Renamed(group) {
		return
	}
	swapString(res, "name", r.resourceName)
	swapString(res, "singularName", r.resources.swap)
	swapStrings(res["shortNames"], r.resources.swap)
	swapStrings(res["categories"], r.categories.swap)
}

// apiGroupDiscovery rewrites one group of aggregated discovery: its name
// (metadata.name) and each version's resources.
func (r *Rewriter) apiGroupDiscovery(g map[string]any) {
	group := ""
	if m, ok := g["metadata"].(map[string]any); ok {
		group, _ = m["name"].(string)
		swapString(m, "name", r.Group)
	}
	for _, v := range maps(g["versions"]) {
		for _, res := range maps(v["resources"]) {
			r.resourceDiscovery(res, group)
		}
	}
}

// resourceDiscovery rewrites an APIResourceDiscovery of group.
func (r *Rewriter) resourceDiscovery(res map[string]any, group string) {
	r.groupVersionKind(res["responseKind"], group)
	for _, sub := range maps(res["subresources"]) {
		r.groupVersionKind(sub["responseKind"], group)
		for _, t := range maps(sub["acceptedTypes"]) {
			r.groupVersionKind(t, group)
		}
	}
	if !r.Renamed(group) {
		return
	}
	swapString(res, "resource", r.resources.swap)
	swapString(res, "singularResource", r.resources.swap)
	swapStrings(res["shortNames"], r.resources.swap)
	swapStrings(res["categories"], r.categories.swap)
}

// groupVersionKind rewrites a {group, version, kind} object; a missing
// group means group.
func (r *Rewriter) groupVersionKind(v any, group string) {
	gvk, ok := v.(map[string]any)
	if !ok {
		return
	}
	if g, ok := gvk["group"].(string); ok {
		group = g
		gvk["group"] = r.Group(g)
	}
	if r.Renamed(group) {
		swapString(gvk, "kind", r.kinds.swap)
	}
}

// groupVersionResource rewrites a {group, version, resource} object.
func (r *Rewriter) groupVersionResource(v any) {
	gvr, ok := v.(map[string]any)
	if !ok {
		return
	}
	g, _ := gvr["group"].(string)
	if !r.Renamed(g) {
		return
	}
	gvr["group"] = r.groups[g]
	swapString(gvr, "resource", r.resources.swap)
}
