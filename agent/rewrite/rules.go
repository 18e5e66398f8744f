package rewrite

// rules rewrites RBAC PolicyRules (Roles, ClusterRoles,
// SelfSubjectRulesReview) and admission RuleWithOperations alike: each
// apiGroup is swapped, and when a rule names a renamed group its resources
// are swapped too (widgets/status keeps its subresource; "*" and
// "*/scale" stay). A rule is a cross product of groups and resources, so
// a rule that mixes a renamed group with others renames the others'
// resources as well: write such rules apart. resourceNames and
// nonResourceURLs are left alone.
func (r *Rewriter) rules(v any) {
	for _, rule := range maps(v) {
		r.rule(rule)
	}
}

func (r *Rewriter) rule(rule map[string]any) {
	renamed := false
	if groups, ok := rule["apiGroups"].([]any); ok {
		for i, g := range groups {
			if s, ok := g.(string); ok && r.Renamed(s) {
				renamed = true
				groups[i] = r.groups[s]
			}
		}
	}
	if renamed {
		swapStrings(rule["resources"], r.resourceName)
	}
}

// admissionRegistration rewrites webhook configurations' rules and
// selectors, and admission policies' and their bindings' resource rules.
func (r *Rewriter) admissionRegistration(obj map[string]any, kind string) {
	switch kind {
	case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
		for _, wh := range maps(obj["webhooks"]) {
			r.rules(wh["rules"])
			for _, sel := range []string{"namespaceSelector", "objectSelector"} {
				if s, ok := wh[sel].(map[string]any); ok {
					r.labelSelector(s)
				}
			}
		}
	case "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy",
		"ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding":
		spec, ok := obj["spec"].(map[string]any)
		if !ok {
			return
		}
		mc, ok := spec["matchConstraints"].(map[string]any)
		if !ok {
			mc, ok = spec["matchResources"].(map[string]any)
		}
		if !ok {
			return
		}
		r.rules(mc["resourceRules"])
		r.rules(mc["excludeResourceRules"])
		for _, sel := range []string{"namespaceSelector", "objectSelector"} {
			if s, ok := mc[sel].(map[string]any); ok {
				r.labelSelector(s)
			}
		}
	}
}

// accessReview rewrites SubjectAccessReview, LocalSubjectAccessReview and
// SelfSubjectAccessReview (spec.resourceAttributes: group, resource, the
// label selector's keys) and SelfSubjectRulesReview (status.resourceRules).
func (r *Rewriter) accessReview(obj map[string]any, kind string) {
	switch kind {
	case "SubjectAccessReview", "LocalSubjectAccessReview", "SelfSubjectAccessReview":
		spec, ok := obj["spec"].(map[string]any)
		if !ok {
			return
		}
		ra, ok := spec["resourceAttributes"].(map[string]any)
		if !ok {
			return
		}
		if g, ok := ra["group"].(string); ok && r.Renamed(g) {
			ra["group"] = r.groups[g]
			swapString(ra, "resource", r.resources.swap)
		}
		if ls, ok := ra["labelSelector"].(map[string]any); ok {
			swapString(ls, "rawSelector", r.LabelSelector)
			for _, req := range maps(ls["requirements"]) {
				swapString(req, "key", r.labels.move)
			}
		}
	case "SelfSubjectRulesReview":
		if st, ok := obj["status"].(map[string]any); ok {
			r.rules(st["resourceRules"])
		}
	}
}
