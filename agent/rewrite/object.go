package rewrite

import "strings"

// Object renames an original object, or restores a renamed one, in place,
// and returns it: obj is JSON decoded into map[string]any (json.Number
// numbers, as Decode gives). Any kind is accepted: its apiVersion and kind
// say which of the shapes below apply, and every object gets its metadata
// rewritten:
//
//   - apiVersion and kind of a renamed group's objects, and every
//     reference to such a kind: ownerReferences, an Event's
//     involvedObject, regarding and related, spec.scaleTargetRef;
//   - label, annotation and finalizer keys of metadata, of the pod
//     template (spec.template.metadata) and of label selectors
//     (spec.selector), and managedFields (apiVersion, the keys of
//     f:labels, f:annotations, f:matchLabels and the v: values of
//     f:finalizers);
//   - lists (items, whose apiVersion and kind may be implied by the list's),
//     Tables (rows[].object), Status (details, messages), watch events;
//   - CustomResourceDefinitions, Roles and ClusterRoles, webhook
//     configurations and admission policies, access reviews, legacy and
//     aggregated discovery, AdmissionReview and ConversionReview.
//
// Objects of other groups keep their apiVersion and kind.
func (r *Rewriter) Object(obj map[string]any) map[string]any {
	r.object(obj, Target{})
	return obj
}

// Target is the object a patch patches, as the request path names it on
// the patch's side: what a patch that does not say it itself is about.
type Target struct {
	// Group and Kind are the patched object's.
	Group, Kind string
	// Name is the patched object's name: a CustomResourceDefinition's
	// name tells its group.
	Name string
}

// Patch renames or restores a JSON merge patch or a strategic merge patch
// (a partial object, with $patch, $setElementOrder, $deleteFromPrimitiveList
// and $retainKeys directives) in place. target is used where the patch
// carries no apiVersion, kind or name itself.
func (r *Rewriter) Patch(patch map[string]any, target Target) map[string]any {
	r.object(patch, target)
	return patch
}

// WatchEvent rewrites one watch event ({type, object}) in place: ADDED,
// MODIFIED, DELETED and BOOKMARK carry an object of the watched kind,
// ERROR a Status.
func (r *Rewriter) WatchEvent(ev map[string]any) map[string]any {
	if obj, ok := ev["object"].(map[string]any); ok {
		r.object(obj, Target{})
	}
	return ev
}

// object rewrites obj, whose group, kind and name are implied by hint
// where it does not name them itself (list items, patches).
func (r *Rewriter) object(obj map[string]any, hint Target) {
	group, kind := hint.Group, hint.Kind
	apiVersion, hasAPIVersion := obj["apiVersion"].(string)
	if hasAPIVersion {
		group = groupOf(apiVersion)
	}
	if k, ok := obj["kind"].(string); ok {
		kind = k
	}
	if m, ok := obj["metadata"].(map[string]any); ok {
		r.metadata(m)
	}
	r.spec(obj, group, kind)
	if items, ok := obj["items"].([]any); ok && strings.HasSuffix(kind, "List") {
		itemKind := strings.TrimSuffix(kind, "List")
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				r.object(m, Target{Group: group, Kind: itemKind})
			}
		}
	}
	r.byKind(obj, group, kind, hint.Name)
	if hasAPIVersion && r.Renamed(group) {
		obj["apiVersion"] = r.APIVersion(apiVersion)
		if k, ok := obj["kind"].(string); ok {
			obj["kind"] = r.kinds.swap(k)
		}
	}
}

// byKind rewrites the fields particular to a kind.
func (r *Rewriter) byKind(obj map[string]any, group, kind, name string) {
	switch group {
	case "":
		switch kind {
		case "Status":
			r.status(obj)
		case "Event":
			r.reference(obj, "involvedObject")
			r.reference(obj, "related")
		case "APIGroupList":
			for _, g := range maps(obj["groups"]) {
				r.apiGroup(g)
			}
		case "APIGroup":
			r.apiGroup(obj)
		case "APIResourceList":
			r.apiResourceList(obj)
		case "WatchEvent":
			r.WatchEvent(obj)
		}
	case "meta.k8s.io":
		switch kind {
		case "Table":
			for _, row := range maps(obj["rows"]) {
				if o, ok := row["object"].(map[string]any); ok {
					r.object(o, Target{})
				}
			}
		case "Status":
			r.status(obj)
		case "WatchEvent":
			r.WatchEvent(obj)
		}
	case "events.k8s.io":
		if kind == "Event" {
			r.reference(obj, "regarding")
			r.reference(obj, "related")
		}
	case "rbac.authorization.k8s.io":
		if kind == "Role" || kind == "ClusterRole" {
			r.rules(obj["rules"])
		}
		if kind == "ClusterRole" {
			if ar, ok := obj["aggregationRule"].(map[string]any); ok {
				for _, s := range maps(ar["clusterRoleSelectors"]) {
					r.labelSelector(s)
				}
			}
		}
	case "admissionregistration.k8s.io":
		r.admissionRegistration(obj, kind)
	case "apiextensions.k8s.io":
		switch kind {
		case "CustomResourceDefinition":
			r.crd(obj, name)
		case "ConversionReview":
			r.conversionReview(obj)
		}
	case "authorization.k8s.io":
		r.accessReview(obj, kind)
	case "apidiscovery.k8s.io":
		if kind == "APIGroupDiscovery" {
			r.apiGroupDiscovery(obj)
		}
	case "admission.k8s.io":
		if kind == "AdmissionReview" {
			r.admissionReview(obj)
		}
	}
}

// metadata rewrites an ObjectMeta (or a part of one, in a patch).
func (r *Rewriter) metadata(m map[string]any) {
	if l, ok := m["labels"].(map[string]any); ok {
		m["labels"] = moveKeys(l, r.labels)
	}
	if a, ok := m["annotations"].(map[string]any); ok {
		m["annotations"] = moveKeys(a, r.annotations)
	}
	r.finalizerList(m["finalizers"])
	// Strategic merge patch directives on the finalizers list.
	r.finalizerList(m["$setElementOrder/finalizers"])
	r.finalizerList(m["$deleteFromPrimitiveList/finalizers"])
	for _, ref := range maps(m["ownerReferences"]) {
		r.typeReference(ref)
	}
	for _, mf := range maps(m["managedFields"]) {
		if av, ok := mf["apiVersion"].(string); ok {
			mf["apiVersion"] = r.APIVersion(av)
		}
		if f, ok := mf["fieldsV1"].(map[string]any); ok {
			r.fieldsV1(f)
		}
	}
}

func (r *Rewriter) finalizerList(v any) {
	if l, ok := v.([]any); ok {
		for i, f := range l {
			if s, ok := f.(string); ok {
				l[i] = r.finalizers.move(s)
			}
		}
	}
}

// spec rewrites the label keys that a workload's spec holds: its pod
// template's metadata, its selector, and a CronJob's job template.
func (r *Rewriter) spec(obj map[string]any, group, kind string) {
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		return
	}
	if t, ok := spec["template"].(map[string]any); ok {
		if m, ok := t["metadata"].(map[string]any); ok {
			r.metadata(m)
		}
	}
	if jt, ok := spec["jobTemplate"].(map[string]any); ok {
		if m, ok := jt["metadata"].(map[string]any); ok {
			r.metadata(m)
		}
		r.spec(jt, "batch", "Job")
	}
	if sel, ok := spec["selector"].(map[string]any); ok {
		if group == "" && (kind == "Service" || kind == "ReplicationController") {
			spec["selector"] = moveKeys(sel, r.labels)
		} else {
			r.labelSelector(sel)
		}
	}
	r.reference(spec, "scaleTargetRef")
}

// labelSelector rewrites a metav1.LabelSelector's keys.
func (r *Rewriter) labelSelector(sel map[string]any) {
	if ml, ok := sel["matchLabels"].(map[string]any); ok {
		sel["matchLabels"] = moveKeys(ml, r.labels)
	}
	for _, e := range maps(sel["matchExpressions"]) {
		if k, ok := e["key"].(string); ok {
			e["key"] = r.labels.move(k)
		}
	}
}

// reference rewrites the object reference obj[field] ({apiVersion, kind}).
func (r *Rewriter) reference(obj map[string]any, field string) {
	if ref, ok := obj[field].(map[string]any); ok {
		r.typeReference(ref)
	}
}

// typeReference rewrites apiVersion and kind of an ownerReference or an
// object reference.
func (r *Rewriter) typeReference(ref map[string]any) {
	av, ok := ref["apiVersion"].(string)
	if !ok || !r.Renamed(groupOf(av)) {
		return
	}
	ref["apiVersion"] = r.APIVersion(av)
	if k, ok := ref["kind"].(string); ok {
		ref["kind"] = r.kinds.swap(k)
	}
}

// fieldsV1 rewrites the keys of a managedFields entry's field set that
// name labels, annotations and finalizers, wherever they are.
func (r *Rewriter) fieldsV1(f map[string]any) {
	for k, v := range f {
		child, ok := v.(map[string]any)
		if !ok {
			continue
		}
		switch k {
		case "f:labels", "f:matchLabels":
			f[k] = moveFieldKeys(child, r.labels)
		case "f:annotations":
			f[k] = moveFieldKeys(child, r.annotations)
		case "f:finalizers":
			f[k] = moveSetValues(child, r.finalizers)
		default:
			r.fieldsV1(child)
		}
	}
}

// moveKeys returns m with its keys moved by km. It returns m itself when
// no key moves.
func moveKeys(m map[string]any, km keyMapper) map[string]any {
	if km.empty() {
		return m
	}
	var out map[string]any
	for k := range m {
		if km.move(k) != k {
			out = make(map[string]any, len(m))
			break
		}
	}
	if out == nil {
		return m
	}
	for k, v := range m {
		out[km.move(k)] = v
	}
	return out
}

// moveFieldKeys moves the "f:<key>" keys of a field set.
func moveFieldKeys(m map[string]any, km keyMapper) map[string]any {
	if km.empty() {
		return m
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if key, ok := strings.CutPrefix(k, "f:"); ok {
			k = "f:" + km.move(key)
		}
		out[k] = v
	}
	return out
}

// moveSetValues moves the `v:"<value>"` keys of a field set, where the
// value is encoded as canonical JSON; other encodings are left alone.
func moveSetValues(m map[string]any, km keyMapper) map[string]any {
	if km.empty() {
		return m
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if enc, ok := strings.CutPrefix(k, "v:"); ok {
			if s, ok := decodeCanonicalString(enc); ok {
				k = "v:" + encodeString(km.move(s))
			}
		}
		out[k] = v
	}
	return out
}

// maps returns the objects of a JSON array (v as []any), skipping other
// elements.
func maps(v any) []map[string]any {
	l, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]map[string]any, 0, len(l))
	for _, e := range l {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// swapStrings applies fn to each string of a JSON array.
func swapStrings(v any, fn func(string) string) {
	if l, ok := v.([]any); ok {
		for i, e := range l {
			if s, ok := e.(string); ok {
				l[i] = fn(s)
			}
		}
	}
}

// swapString applies fn to obj[field] if it is a string.
func swapString(obj map[string]any, field string, fn func(string) string) {
	if s, ok := obj[field].(string); ok {
		obj[field] = fn(s)
	}
}
