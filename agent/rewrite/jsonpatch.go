package rewrite

import (
	"strings"
)

// JSONPatch rewrites an RFC 6902 JSON patch (its operations, decoded) in
// place. A patch does not say what it patches, so it is rewritten where
// its paths say enough:
//
//   - path and from pointers through a label key (.../metadata/labels/<key>,
//     .../matchLabels/<key>) or an annotation key
//     (.../metadata/annotations/<key>), ~1 and ~0 escaped;
//   - values put at the object's root (a whole object), at a metadata
//     (.../metadata), at its labels, annotations, finalizers (the list or
//     one element) or ownerReferences (the list, one element, or an
//     element's apiVersion), at spec.selector or spec.template, and at
//     /apiVersion.
//
// A value at /kind or deeper in a kind-specific place (a CRD's names, a
// Role's rules) is left alone: its group is not known from the patch.
func (r *Rewriter) JSONPatch(ops []any) []any {
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
			op["value"] = r.patchValue(shape, v)
		}
	}
	return ops
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
