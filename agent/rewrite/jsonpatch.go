package rewrite

import (
	"slices"
	"strings"
)

// JSONPatch rewrites an RFC 6902 JSON patch (its operations, decoded) in
// place. target is the patched object (from the request path); a patch
// does not say what it patches itself.
//
//   - path and from pointers through a label key (.../metadata/labels/<key>,
//     .../matchLabels/<key>) or an annotation key
//     (.../metadata/annotations/<key>) are rewritten, ~1 and ~0 escaped;
//   - a value is rewritten as Object rewrites the place the path names in
//     an object of target's kind: an object at the root, a metadata, its
//     labels or finalizers, a Role's rules, a CRD's names or group, a kind
//     at /kind, one element of a list ("/rules/0", "/rules/-");
//   - without a target kind, values are rewritten at the places any
//     object has: the root, a metadata, its labels, annotations,
//     finalizers (the list or one element) or ownerReferences (the list,
//     one element, or an element's apiVersion), spec.selector,
//     spec.template and /apiVersion.
func (r *Rewriter) JSONPatch(ops []any, target Target) []any {
	for _, o := range ops {
		op, ok := o.(map[string]any)
		if !ok {
			continue
		}
		var shape []string
		if p, ok := op["path"].(string); ok {
			op["path"], shape = r.pointer(p)
		}
		if f, ok := op["from"].(string); ok {
			op["from"], _ = r.pointer(f)
		}
		if v, ok := op["value"]; ok && shape != nil {
			if target.Kind != "" && len(shape) > 0 && !slices.Contains(shape, "") {
				op["value"] = r.valueIn(target, shape, v)
			} else {
				op["value"] = r.patchValue(shape, v)
			}
		}
	}
	return ops
}

// valueIn rewrites v as the value at path in an object of target's
// kind: it builds that object, with v in its place, rewrites it and takes
// v's rewrite back out. A path whose place the rewrite moves (a managed
// field's key) leaves v as it is.
func (r *Rewriter) valueIn(target Target, path []string, v any) any {
	apiVersion := "v1"
	if target.Group != "" {
		apiVersion = target.Group + "/v1"
	}
	obj := map[string]any{"apiVersion": apiVersion, "kind": target.Kind}
	if target.Name != "" && path[0] != "metadata" {
		obj["metadata"] = map[string]any{"name": target.Name}
	}
	// Build the containers from the leaf up: an index ("0", "-") is a
	// one-element list.
	leaf := v
	for i := len(path) - 1; i >= 1; i-- {
		if isIndex(path[i]) {
			leaf = []any{leaf}
		} else {
			leaf = map[string]any{path[i]: leaf}
		}
	}
	if isIndex(path[0]) {
		return v
	}
	obj[path[0]] = leaf
	r.object(obj, Target{})
	var cur any = obj
	for _, t := range path {
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[t]
			if !ok {
				return v
			}
			cur = next
		case []any:
			if len(c) != 1 {
				return v
			}
			cur = c[0]
		default:
			return v
		}
	}
	return cur
}

// isIndex says whether a JSON pointer token indexes a list.
func isIndex(t string) bool {
	if t == "-" {
		return true
	}
	if t == "" || len(t) > 1 && t[0] == '0' {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return false
		}
	}
	return true
}

// pointer rewrites the label and annotation keys of a JSON pointer. It
// also returns the pointer's shape: its tokens with the keys blanked, the
// same on both sides of a rename, or nil for what is not a pointer. Only
// pointers in canonical form (escaped as joinPointer does) are rewritten,
// so that restoring gives back the same text.
func (r *Rewriter) pointer(p string) (string, []string) {
	tokens := splitPointer(p)
	if tokens == nil {
		return p, nil
	}
	shape := make([]string, len(tokens))
	copy(shape, tokens)
	changed := false
	for i := 1; i < len(tokens); i++ {
		prev := shape[i-1]
		prev2 := ""
		if i >= 2 {
			prev2 = shape[i-2]
		}
		var km *keyMapper
		switch {
		case prev == "matchLabels",
			prev == "labels" && prev2 == "metadata":
			km = &r.labels
		case prev == "annotations" && prev2 == "metadata":
			km = &r.annotations
		default:
			continue
		}
		// A key is no structure: blank it in the shape, so that the
		// next token is never read as following "labels" or "metadata".
		shape[i] = ""
		if k := km.move(tokens[i]); k != tokens[i] {
			tokens[i] = k
			changed = true
		}
	}
	if !changed || joinPointer(splitPointer(p)) != p {
		return p, shape
	}
	return joinPointer(tokens), shape
}

// patchValue rewrites the value an operation puts at the place the
// pointer's shape (see pointer) names.
func (r *Rewriter) patchValue(tokens []string, v any) any {
	n := len(tokens)
	last := func(k int) string { // the k-th token from the end, or ""
		if n-k < 0 {
			return ""
		}
		return tokens[n-k]
	}
	switch {
	case n == 0:
		if m, ok := v.(map[string]any); ok {
			r.object(m, Target{})
		}
	case last(1) == "metadata":
		if m, ok := v.(map[string]any); ok {
			r.metadata(m)
		}
	case last(1) == "labels" && last(2) == "metadata", last(1) == "matchLabels":
		if m, ok := v.(map[string]any); ok {
			return moveKeys(m, r.labels)
		}
	case last(1) == "annotations" && last(2) == "metadata":
		if m, ok := v.(map[string]any); ok {
			return moveKeys(m, r.annotations)
		}
	case last(1) == "finalizers" && last(2) == "metadata":
		r.finalizerList(v)
	case last(2) == "finalizers" && last(3) == "metadata":
		if s, ok := v.(string); ok {
			return r.finalizers.move(s)
		}
	case last(1) == "ownerReferences" && last(2) == "metadata":
		for _, ref := range maps(v) {
			r.typeReference(ref)
		}
	case last(2) == "ownerReferences" && last(3) == "metadata":
		if m, ok := v.(map[string]any); ok {
			r.typeReference(m)
		}
	case last(1) == "apiVersion" && (n == 1 || last(3) == "ownerReferences"):
		if s, ok := v.(string); ok {
			return r.APIVersion(s)
		}
	case n == 2 && tokens[0] == "spec" && tokens[1] == "selector":
		if m, ok := v.(map[string]any); ok {
			r.labelSelector(m)
		}
	case n == 2 && tokens[0] == "spec" && tokens[1] == "template":
		if m, ok := v.(map[string]any); ok {
			if meta, ok := m["metadata"].(map[string]any); ok {
				r.metadata(meta)
			}
		}
	}
	return v
}

// splitPointer splits a JSON pointer into its unescaped tokens; "" is the
// root (no tokens, not nil). A pointer that does not start with "/" gives
// nil.
func splitPointer(p string) []string {
	if p == "" {
		return []string{}
	}
	if !strings.HasPrefix(p, "/") {
		return nil
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		if strings.Contains(t, "~") {
			tokens[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(t)
		}
	}
	return tokens
}

// joinPointer is splitPointer's inverse.
func joinPointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}
