package rewrite

import (
	"net/url"
	"strings"
)

// RequestPath renames or restores a request's path and query. The path
// is a URL path as kube-apiserver reads it (/apis/<group>/<version>/
// [watch/][namespaces/<ns>/]<resource>[/<name>[/<subresource>]], /api/v1/...);
// a renamed group and its resource are swapped, names and subresources are
// kept, and a CustomResourceDefinition's name in the path is swapped as
// CRDName does. In the query, labelSelector keys are moved (LabelSelector)
// and, for CustomResourceDefinitions, a fieldSelector on metadata.name is
// swapped. renamed says whether the path names a renamed group, which
// tells the caller that bodies and answers of this request carry renamed
// names. query is not modified; when nothing in it changes, it is
// returned as it is.
func (r *Rewriter) RequestPath(path string, query url.Values) (string, url.Values, bool) {
	rest, ok := strings.CutPrefix(path, "/apis/")
	if !ok {
		return path, r.query(query, false), false
	}
	// parts are the segments after /apis/, indexed as kube-apiserver's
	// RequestInfo indexes them after the prefix.
	parts := append([]string{"apis"}, strings.Split(rest, "/")...)
	renamed, crds := false, false
	g := parts[1]
	switch {
	case r.Renamed(g):
		renamed = true
		parts[1] = r.groups[g]
		if i := resourceIndex(parts); i > 0 {
			parts[i] = r.pathResource(parts[i])
		}
	case g == "apiextensions.k8s.io":
		if i := resourceIndex(parts); i > 0 && parts[i] == "customresourcedefinitions" {
			crds = true
			if i+1 < len(parts) {
				parts[i+1] = r.CRDName(parts[i+1])
			}
		}
	}
	newPath := path
	if renamed || crds {
		newPath = "/" + strings.Join(parts, "/")
	}
	return newPath, r.query(query, crds), renamed
}

// pathResource swaps a resource in a path, except where the swap would
// make or unmake the words that give a path its structure ("namespaces",
// "watch"): those stay, so that both sides read the path alike.
func (r *Rewriter) pathResource(res string) string {
	s := r.resources.swap(res)
	for _, w := range []string{"namespaces", "watch"} {
		if res == w || s == w {
			return res
		}
	}
	return s
}

// resourceIndex returns the index of the resource in the parts of an
// /apis/<group>/<version>/... path, or 0 when there is none. It reads the
// path as kube-apiserver's RequestInfo does.
func resourceIndex(parts []string) int {
	i := 3
	if i < len(parts) && parts[i] == "watch" {
		i++
	}
	if i+2 < len(parts) && parts[i] == "namespaces" {
		i += 2
	}
	if i >= len(parts) {
		return 0
	}
	return i
}

// query rewrites labelSelector and, for CustomResourceDefinitions,
// fieldSelector.
func (r *Rewriter) query(q url.Values, crds bool) url.Values {
	var out url.Values
	set := func(k string, v []string) {
		if out == nil {
			out = url.Values{}
			for k, v := range q {
				out[k] = append([]string(nil), v...)
			}
		}
		out[k] = v
	}
	if ls, ok := q["labelSelector"]; ok {
		nv, changed := mapStrings(ls, r.LabelSelector)
		if changed {
			set("labelSelector", nv)
		}
	}
	if fs, ok := q["fieldSelector"]; ok && crds {
		nv, changed := mapStrings(fs, r.crdFieldSelector)
		if changed {
			set("fieldSelector", nv)
		}
	}
	if out == nil {
		return q
	}
	return out
}

func mapStrings(in []string, fn func(string) string) ([]string, bool) {
	out := make([]string, len(in))
	changed := false
	for i, s := range in {
		out[i] = fn(s)
		changed = changed || out[i] != s
	}
	return out, changed
}

// crdFieldSelector swaps the CRD names of metadata.name requirements.
func (r *Rewriter) crdFieldSelector(sel string) string {
	reqs := strings.Split(sel, ",")
	for i, req := range reqs {
		for _, op := range []string{"!=", "==", "="} {
			k, v, ok := strings.Cut(req, op)
			if !ok {
				continue
			}
			if strings.TrimSpace(k) == "metadata.name" {
				reqs[i] = k + op + r.CRDName(v)
			}
			break
		}
	}
	return strings.Join(reqs, ",")
}

// LabelSelector moves the keys of a label selector in its string form
// ("a=b,!c,d in (e,f)"), leaving everything else, spaces included, as it
// is.
func (r *Rewriter) LabelSelector(sel string) string {
	if r.labels.empty() {
		return sel
	}
	var b strings.Builder
	depth := 0
	start := true // at the start of a requirement
	for i := 0; i < len(sel); {
		c := sel[i]
		switch {
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			start = true
			b.WriteByte(c)
			i++
			continue
		}
		if start && (c == ' ' || c == '!') {
			b.WriteByte(c)
			i++
			continue
		}
		if start && isKeyChar(c) {
			j := i
			for j < len(sel) && isKeyChar(sel[j]) {
				j++
			}
			b.WriteString(r.labels.move(sel[i:j]))
			i = j
			start = false
			continue
		}
		start = false
		b.WriteByte(c)
		i++
	}
	return b.String()
}

func isKeyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_' || c == '/'
}
