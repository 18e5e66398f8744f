package rewrite

import (
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
)

// gen builds JSON values of the package's shapes from a fuzzer's bytes.
// With originalOnly, original group names and key domains appear only
// where they are to be renamed (for the leftover check); otherwise names
// come from both sides of the rename and from the escape chains.
type gen struct {
	data         []byte
	i            int
	originalOnly bool
}

// Vocabularies: original names, and the extra names of either side.
var (
	origGroups      = []string{"example.com", "kubevirt.io", "apps", "", "other.io"}
	moreGroups      = []string{"renamed.example.io", "x.virtualization.example.io", "sub.example.com", "example.com.evil", "*"}
	origKinds       = []string{"Widget", "VirtualMachine", "Pod", "Thing"}
	moreKinds       = []string{"RenamedWidget", "RenamedRenamedWidget", "Renamed", "widget", "", "*", "Renamedwidget", "RenamedRenamedRenamedX"}
	origResources   = []string{"widgets", "virtualmachines", "widgets/status", "*", "*/scale", "pods", "things"}
	moreResources   = []string{"renamedwidgets", "renamed", "renamedrenamedwidgets", "namespaces", "watch", "renamednamespaces", "renamedwatch", "Widgets", "", "renamedwidgets/status"}
	origKeys        = []string{"example.com/a", "vm.example.com/b", "app", "app.kubernetes.io/name", "other.io/x", "$patch", "tier", "metadata", "labels"}
	moreKeys        = []string{"renamed.example.io/a", "vm.renamed.example.io/b", "unprefixed.renamed.example.net/app", "unprefixed.renamed.example.net/a/b", "unprefixed.renamed.example.net/$x", "unprefixed.renamed.example.net/", "", "/x", "example.com/", "notexample.com/x", "example.com.evil/x", "kubevirt.io", "a~b/c"}
	origFinalizers  = []string{"example.com/cleanup", "x.example.com/f", "foregroundDeletion", "orphan", "other.io/f"}
	moreFinalizers  = []string{"renamed.example.io/cleanup", "", "x.renamed.example.io/f", "example.com", "renamed.example.io/"}
	origCategories  = []string{"all", "kubevirt", "operators"}
	moreCategories  = []string{"renamedall", "renamedkubevirt", "renamedrenamedall", "", "*"}
	neutralStrings  = []string{"x", "a b", "v1", "1", "", "<&>", "ü"}
	versions        = []string{"v1", "v2", "v1beta1"}
	watchEventTypes = []string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"}
)

func (g *gen) next() int {
	if g.i >= len(g.data) {
		return 0
	}
	b := g.data[g.i]
	g.i++
	return int(b)
}

func (g *gen) n(max int) int { return g.next() % max }

func (g *gen) pick(orig, more []string) string {
	if g.originalOnly {
		return orig[g.n(len(orig))]
	}
	all := len(orig) + len(more)
	i := g.n(all)
	if i < len(orig) {
		return orig[i]
	}
	return more[i-len(orig)]
}

func (g *gen) group() string    { return g.pick(origGroups, moreGroups) }
func (g *gen) kind() string     { return g.pick(origKinds, moreKinds) }
func (g *gen) resource() string { return g.pick(origResources, moreResources) }
func (g *gen) key() string      { return g.pick(origKeys, moreKeys) }
func (g *gen) neutral() string  { return neutralStrings[g.n(len(neutralStrings))] }

func (g *gen) apiVersion() string {
	grp := g.group()
	v := versions[g.n(len(versions))]
	if grp == "" {
		return v
	}
	return grp + "/" + v
}

func strs(fn func() string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = fn()
	}
	return out
}

func (g *gen) keyMap() map[string]any {
	m := map[string]any{}
	for range g.n(4) {
		if g.n(5) == 0 {
			m[g.key()] = nil
		} else {
			m[g.key()] = g.neutral()
		}
	}
	return m
}

func (g *gen) ownerRef() map[string]any {
	ref := map[string]any{"apiVersion": g.apiVersion(), "kind": g.kind(), "name": g.neutral(), "uid": strconv.Itoa(g.n(100))}
	if g.n(3) == 0 {
		delete(ref, "kind")
	}
	return ref
}

func (g *gen) finalizer() string { return g.pick(origFinalizers, moreFinalizers) }

func (g *gen) fieldsV1() map[string]any {
	labels := map[string]any{".": map[string]any{}}
	for range g.n(3) {
		labels["f:"+g.key()] = map[string]any{}
	}
	fin := map[string]any{}
	for range g.n(3) {
		fin["v:"+encodeString(g.finalizer())] = map[string]any{}
	}
	if !g.originalOnly && g.n(3) == 0 {
		fin[`v:"\u0065xample.com/x"`] = map[string]any{}
	}
	return map[string]any{"f:metadata": map[string]any{"f:labels": labels, "f:annotations": map[string]any{"f:" + g.key(): map[string]any{}}, "f:finalizers": fin},
		"f:spec": map[string]any{"f:selector": map[string]any{"f:matchLabels": map[string]any{"f:" + g.key(): map[string]any{}}}}}
}

func (g *gen) metadata() map[string]any {
	m := map[string]any{"name": g.neutral()}
	if g.n(2) == 0 {
		m["labels"] = g.keyMap()
	}
	if g.n(2) == 0 {
		m["annotations"] = g.keyMap()
	}
	if g.n(2) == 0 {
		m["finalizers"] = strs(g.finalizer, g.n(3))
	}
	if g.n(3) == 0 {
		var refs []any
		for range g.n(3) {
			refs = append(refs, g.ownerRef())
		}
		m["ownerReferences"] = refs
	}
	if g.n(4) == 0 {
		m["managedFields"] = []any{map[string]any{"manager": "m", "apiVersion": g.apiVersion(), "fieldsType": "FieldsV1", "fieldsV1": g.fieldsV1()}}
	}
	if g.n(5) == 0 {
		m["$setElementOrder/finalizers"] = strs(g.finalizer, g.n(3))
		m["$deleteFromPrimitiveList/finalizers"] = strs(g.finalizer, g.n(2))
	}
	return m
}

func (g *gen) selector() map[string]any {
	return map[string]any{"matchLabels": g.keyMap(), "matchExpressions": []any{map[string]any{"key": g.key(), "operator": "Exists"}}}
}

func (g *gen) spec() map[string]any {
	s := map[string]any{"replicas": json.Number(strconv.Itoa(g.n(10))), "note": g.neutral()}
	if g.n(2) == 0 {
		s["selector"] = g.selector()
	}
	if g.n(2) == 0 {
		s["template"] = map[string]any{"metadata": g.metadata()}
	}
	if g.n(4) == 0 {
		s["scaleTargetRef"] = g.ownerRef()
	}
	return s
}

// object returns one object of a random kind.
func (g *gen) object(depth int) map[string]any {
	switch g.n(20) {
	case 0:
		if depth > 0 {
			break
		}
		items := []any{}
		kind := g.kind()
		for range g.n(3) {
			it := g.object(depth + 1)
			if g.n(2) == 0 {
				// An item of the list's own kind, which leaves out
				// apiVersion and kind as built-in lists' items do.
				it = g.customResource()
				delete(it, "apiVersion")
				delete(it, "kind")
			}
			items = append(items, it)
		}
		return map[string]any{"apiVersion": g.apiVersion(), "kind": kind + "List", "metadata": map[string]any{"resourceVersion": "1"}, "items": items}
	case 1:
		if depth > 0 {
			break
		}
		return map[string]any{"apiVersion": "meta.k8s.io/v1", "kind": "Table", "columnDefinitions": []any{map[string]any{"name": "Name"}},
			"rows": []any{map[string]any{"cells": []any{"x"}, "object": g.object(depth + 1)}}}
	case 2:
		return g.status()
	case 3:
		names := map[string]any{"plural": g.resource(), "singular": g.resource(), "kind": g.kind(), "listKind": g.kind() + "List",
			"shortNames": strs(g.resource, g.n(3)), "categories": strs(func() string { return g.pick(origCategories, moreCategories) }, g.n(3))}
		grp := g.group()
		crd := map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": "widgets." + grp}, "spec": map[string]any{"group": grp, "names": names},
			"status": map[string]any{"acceptedNames": map[string]any{"kind": g.kind(), "plural": g.resource()}}}
		if g.n(4) == 0 {
			crd["metadata"].(map[string]any)["name"] = g.resource() + "." + g.group()
		}
		return crd
	case 4:
		kind := []string{"Role", "ClusterRole"}[g.n(2)]
		role := map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": g.metadata(), "rules": g.rules()}
		if kind == "ClusterRole" && g.n(2) == 0 {
			role["aggregationRule"] = map[string]any{"clusterRoleSelectors": []any{g.selector()}}
		}
		return role
	case 5:
		return map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}[g.n(2)],
			"webhooks": []any{map[string]any{"name": "w", "rules": g.rules(), "objectSelector": g.selector(), "namespaceSelector": g.selector()}}}
	case 6:
		return map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
			"spec": map[string]any{"matchConstraints": map[string]any{"resourceRules": g.rules(), "excludeResourceRules": g.rules()}}}
	case 7:
		ra := map[string]any{"group": g.group(), "resource": g.resource(), "verb": "get",
			"labelSelector": map[string]any{"rawSelector": g.key() + "=x", "requirements": []any{map[string]any{"key": g.key(), "operator": "In"}}}}
		return map[string]any{"apiVersion": "authorization.k8s.io/v1", "kind": []string{"SubjectAccessReview", "SelfSubjectAccessReview", "LocalSubjectAccessReview"}[g.n(3)],
			"spec": map[string]any{"resourceAttributes": ra}}
	case 8:
		return map[string]any{"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "status": map[string]any{"resourceRules": g.rules()}}
	case 9:
		return map[string]any{"apiVersion": "v1", "kind": "APIGroupList", "groups": []any{g.apiGroup(), g.apiGroup()}}
	case 10:
		grp := g.apiVersion()
		var res []any
		for range g.n(4) {
			r := map[string]any{"name": g.resource(), "singularName": g.resource(), "kind": g.kind(), "shortNames": strs(g.resource, g.n(2)),
				"categories": strs(func() string { return g.pick(origCategories, moreCategories) }, g.n(2))}
			if g.n(3) == 0 {
				r["group"] = g.group()
			}
			res = append(res, r)
		}
		return map[string]any{"apiVersion": "v1", "kind": "APIResourceList", "groupVersion": grp, "resources": res}
	case 11:
		return map[string]any{"apiVersion": "apidiscovery.k8s.io/" + []string{"v2", "v2beta1"}[g.n(2)], "kind": "APIGroupDiscoveryList",
			"items": []any{g.groupDiscovery(), g.groupDiscovery()}}
	case 12:
		return g.admissionReview()
	case 13:
		return map[string]any{"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
			"request":  map[string]any{"desiredAPIVersion": g.apiVersion(), "objects": []any{g.customResource()}},
			"response": map[string]any{"convertedObjects": []any{g.customResource()}, "result": g.status()}}
	case 14:
		return map[string]any{"apiVersion": "v1", "kind": "Event", "involvedObject": g.ownerRef(), "related": g.ownerRef(), "metadata": g.metadata()}
	case 15:
		return map[string]any{"apiVersion": "v1", "kind": []string{"Service", "ReplicationController"}[g.n(2)], "spec": map[string]any{"selector": g.keyMap()}}
	case 16:
		return map[string]any{"apiVersion": "batch/v1", "kind": "CronJob", "spec": map[string]any{"jobTemplate": map[string]any{"metadata": g.metadata(), "spec": g.spec()}}}
	case 17:
		return map[string]any{"apiVersion": "v1", "kind": "APIGroup", "name": g.group(), "versions": []any{map[string]any{"groupVersion": g.apiVersion()}}}
	}
	return g.customResource()
}

func (g *gen) customResource() map[string]any {
	return map[string]any{"apiVersion": g.apiVersion(), "kind": g.kind(), "metadata": g.metadata(), "spec": g.spec()}
}

func (g *gen) rules() []any {
	var out []any
	for range 1 + g.n(2) {
		out = append(out, map[string]any{"apiGroups": strs(g.group, 1+g.n(2)), "resources": strs(g.resource, g.n(3)), "verbs": []any{"get"}, "resourceNames": []any{g.neutral()}})
	}
	return out
}

func (g *gen) apiGroup() map[string]any {
	gv := g.apiVersion()
	return map[string]any{"name": g.group(), "versions": []any{map[string]any{"groupVersion": gv, "version": "v1"}}, "preferredVersion": map[string]any{"groupVersion": gv}}
}

func (g *gen) gvk() map[string]any {
	m := map[string]any{"group": g.group(), "version": "v1", "kind": g.kind()}
	if g.n(4) == 0 {
		delete(m, "group")
	}
	return m
}

func (g *gen) groupDiscovery() map[string]any {
	res := map[string]any{"resource": g.resource(), "singularResource": g.resource(), "responseKind": g.gvk(), "shortNames": strs(g.resource, g.n(2)),
		"categories":   strs(func() string { return g.pick(origCategories, moreCategories) }, g.n(2)),
		"subresources": []any{map[string]any{"subresource": "status", "responseKind": g.gvk(), "acceptedTypes": []any{g.gvk()}}}}
	return map[string]any{"metadata": map[string]any{"name": g.group()}, "versions": []any{map[string]any{"version": "v1", "resources": []any{res}}}}
}

func (g *gen) message() string {
	switch g.n(4) {
	case 0:
		// kube-apiserver names a resource without its subresource.
		res, _, _ := strings.Cut(g.resource(), "/")
		return res + "." + g.group() + ` "x" not found`
	case 1:
		return g.kind() + "." + g.group() + ` "x" is invalid: spec: Required value`
	case 2:
		return g.apiVersion() + " " + g.kind() + " is deprecated."
	}
	return "the server is on fire"
}

func (g *gen) status() map[string]any {
	kind := g.kind()
	if g.n(2) == 0 {
		kind = g.resource()
	}
	return map[string]any{"apiVersion": "v1", "kind": "Status", "message": g.message(), "code": json.Number("404"),
		"details": map[string]any{"group": g.group(), "kind": kind, "causes": []any{map[string]any{"message": g.message()}}}}
}

func (g *gen) admissionReview() map[string]any {
	patch, _ := Encode(g.jsonPatch())
	return map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{"kind": g.gvk(), "requestKind": g.gvk(),
			"resource": map[string]any{"group": g.group(), "version": "v1", "resource": g.resource()}, "subResource": "status",
			"object": g.customResource(), "oldObject": g.customResource()},
		"response": map[string]any{"patch": base64.StdEncoding.EncodeToString(patch), "warnings": []any{g.message()}, "status": g.status()}}
}

// jsonPatch returns an RFC 6902 patch of the operations the package
// rewrites, and some it leaves alone.
func (g *gen) jsonPatch() []any {
	var ops []any
	for range 1 + g.n(4) {
		op := map[string]any{"op": []string{"add", "replace", "remove", "test", "move", "copy"}[g.n(6)]}
		switch g.n(11) {
		case 0:
			op["path"] = joinPointer([]string{"metadata", "labels", g.key()})
			op["value"] = g.neutral()
		case 1:
			op["path"] = joinPointer([]string{"metadata", "annotations", g.key()})
			op["from"] = joinPointer([]string{"metadata", "annotations", g.key()})
		case 2:
			op["path"] = "/metadata/labels"
			op["value"] = g.keyMap()
		case 3:
			op["path"] = "/metadata/finalizers/-"
			op["value"] = g.finalizer()
		case 4:
			op["path"] = "/metadata/ownerReferences"
			op["value"] = []any{g.ownerRef()}
		case 5:
			op["path"] = "/metadata/ownerReferences/0/apiVersion"
			op["value"] = g.apiVersion()
		case 6:
			op["path"] = "/apiVersion"
			op["value"] = g.apiVersion()
		case 7:
			op["path"] = ""
			op["value"] = g.customResource()
		case 8:
			op["path"] = "/metadata"
			op["value"] = g.metadata()
		case 9:
			op["path"] = joinPointer([]string{"spec", "selector", "matchLabels", g.key()})
			op["value"] = g.neutral()
		default:
			op["path"] = "/spec/template"
			op["value"] = map[string]any{"metadata": g.metadata()}
		}
		ops = append(ops, op)
	}
	return ops
}

// kindPatch returns JSON patch operations on kind-specific places: the
// target's own with original names only, any otherwise.
func (g *gen) kindPatch(target Target) []any {
	var ops []any
	for range 1 + g.n(3) {
		which := g.n(8)
		if g.originalOnly {
			switch target.Kind {
			case "ClusterRole":
				which = g.n(2)
			case "CustomResourceDefinition":
				which = 2 + g.n(2)
			case "Widget":
				which = []int{4, 7}[g.n(2)]
			case "ValidatingWebhookConfiguration":
				which = 5
			case "Service":
				which = 6
			default:
				return nil
			}
		}
		op := map[string]any{"op": "add"}
		switch which {
		case 0:
			op["path"] = "/rules/" + []string{"0", "-", "1"}[g.n(3)]
			op["value"] = g.rules()[0]
		case 1:
			op["path"] = "/rules"
			op["value"] = g.rules()
		case 2:
			op["path"] = "/spec/names"
			op["value"] = map[string]any{"kind": g.kind(), "plural": g.resource(), "shortNames": strs(g.resource, g.n(3))}
		case 3:
			op["path"] = "/spec/names/kind"
			op["value"] = g.kind()
		case 4:
			op["path"] = "/kind"
			op["value"] = g.kind()
		case 5:
			op["path"] = "/webhooks/0/rules"
			op["value"] = g.rules()
		case 6:
			op["path"] = "/spec/selector"
			op["value"] = g.keyMap()
		default:
			op["path"] = "/spec/selector"
			op["value"] = g.selector()
		}
		ops = append(ops, op)
	}
	return ops
}

// input returns a value, the shape of function it is for and, for a
// patch, its target.
func (g *gen) input() (int, Target, any) {
	switch g.n(9) {
	case 0:
		return shapeWatchEvent, Target{}, map[string]any{"type": watchEventTypes[g.n(len(watchEventTypes))], "object": g.object(0)}
	case 1:
		return shapePatch, Target{Group: "example.com", Kind: "Widget"}, map[string]any{"metadata": g.metadata(), "spec": g.spec()}
	case 2:
		return shapeJSONPatch, fuzzTargets[g.n(len(fuzzTargets))], g.jsonPatch()
	case 3:
		target := fuzzTargets[g.n(len(fuzzTargets))]
		return shapeJSONPatch, target, append(g.jsonPatch(), g.kindPatch(target)...)
	}
	return shapeObject, Target{}, g.object(0)
}
