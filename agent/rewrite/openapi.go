package rewrite

import (
	"slices"
	"strings"
)

// OpenAPI v3 documents, as kube-apiserver serves them under /openapi/v3:
// an index of one document per group version, then each group version's
// document. The index and the documents of renamed groups are rewritten,
// so that kubectl explain and other schema-driven clients find a renamed
// group's kinds under their original names. Descriptions, operation IDs
// and tags are free text and left alone. OpenAPI v2, one document of the
// whole cluster, is not rewritten.

// openAPIV3Root is the path of the index of OpenAPI v3 documents.
const openAPIV3Root = "/openapi/v3"

// openAPIV3SchemaRef starts a reference to a schema of the document.
const openAPIV3SchemaRef = "#/components/schemas/"

// OpenAPIV3 is what an OpenAPI v3 request asks for.
type OpenAPIV3 int

const (
	// OpenAPIV3None: not an OpenAPI v3 request, or a document of a group
	// the profile does not rename, which carries none of its names.
	OpenAPIV3None OpenAPIV3 = iota
	// OpenAPIV3Index: the index (/openapi/v3).
	OpenAPIV3Index
	// OpenAPIV3Document: the document of a renamed group's version
	// (/openapi/v3/apis/<group>/<version>).
	OpenAPIV3Document
)

// OpenAPIV3Path renames or restores the path of an OpenAPI v3 request, as
// RequestPath does for API paths: a renamed group's document is asked for
// under the group's other name. It says what the request asks for; its
// answer is to be rewritten with OpenAPIV3IndexJSON or
// OpenAPIV3DocumentJSON accordingly, and not at all for OpenAPIV3None.
func (r *Rewriter) OpenAPIV3Path(path string) (string, OpenAPIV3) {
	if path == openAPIV3Root || path == openAPIV3Root+"/" {
		return path, OpenAPIV3Index
	}
	rest, ok := strings.CutPrefix(path, openAPIV3Root+"/apis/")
	if !ok {
		return path, OpenAPIV3None
	}
	group, version, ok := strings.Cut(rest, "/")
	if !ok || version == "" || strings.Contains(version, "/") || !r.Renamed(group) {
		return path, OpenAPIV3None
	}
	return openAPIV3Root + "/apis/" + r.groups[group] + "/" + version, OpenAPIV3Document
}

// OpenAPIV3Location swaps the group of a document's server-relative URL
// (an index entry's serverRelativeURL, a redirect's Location), keeping
// its query (the document's hash).
func (r *Rewriter) OpenAPIV3Location(u string) string {
	path, query, hasQuery := strings.Cut(u, "?")
	renamed, what := r.OpenAPIV3Path(path)
	if what != OpenAPIV3Document {
		return u
	}
	if hasQuery {
		return renamed + "?" + query
	}
	return renamed
}

// OpenAPIV3Index rewrites the index of OpenAPI v3 documents
// ({"paths": {"apis/<group>/<version>": {"serverRelativeURL": ...}}}),
// decoded, in place, and returns it: a renamed group's entry is listed
// under the group's other name, and points at its document there.
func (r *Rewriter) OpenAPIV3Index(doc map[string]any) map[string]any {
	paths, ok := doc["paths"].(map[string]any)
	if !ok {
		return doc
	}
	paths = mapKeys(paths, func(k string) string {
		renamed, what := r.OpenAPIV3Path(openAPIV3Root + "/" + k)
		if what != OpenAPIV3Document {
			return k
		}
		return strings.TrimPrefix(renamed, openAPIV3Root+"/")
	})
	for _, v := range paths {
		if entry, ok := v.(map[string]any); ok {
			swapString(entry, "serverRelativeURL", r.OpenAPIV3Location)
		}
	}
	doc["paths"] = paths
	return doc
}

// OpenAPIV3IndexJSON is OpenAPIV3Index over JSON bytes; the answer is
// canonical JSON.
func (r *Rewriter) OpenAPIV3IndexJSON(data []byte) ([]byte, error) {
	doc, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	return Encode(r.OpenAPIV3Index(doc))
}

// OpenAPIV3DocumentJSON rewrites the OpenAPI v3 document of a renamed
// group's version: the API paths (as RequestPath renames them), the
// group-version-kind extensions of operations and schemas, and the names
// of the schemas of the group's kinds with every reference to them. A
// schema is renamed only when its name is the one kube-apiserver gives a
// kind (reversed group, version, kind: com.example.v1.Widget), so that
// swapping twice gives back the document. The answer is canonical JSON.
func (r *Rewriter) OpenAPIV3DocumentJSON(data []byte) ([]byte, error) {
	doc, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	// names: the kinds' schemas renamed; modes: how each schema's
	// group-version-kind extensions are rewritten.
	names, modes := map[string]string{}, map[string]gvkMode{}
	if components, ok := doc["components"].(map[string]any); ok {
		if schemas, ok := components["schemas"].(map[string]any); ok {
			for name, s := range schemas {
				to, mode := r.schemaMode(name, s)
				modes[name] = mode
				if mode == gvkKind {
					names[name] = to
				}
			}
			// A name taken by a schema that stays keeps its schema: no
			// schema is dropped for another, and the kind's schema is
			// left as it is (kube-apiserver's documents name no schema
			// so).
			for dropped := true; dropped; {
				dropped = false
				for from, to := range names {
					if _, taken := schemas[to]; taken && names[to] == "" {
						delete(names, from)
						modes[from] = gvkKeep
						dropped = true
					}
				}
			}
			// References follow a rename both ways: one to the other
			// side's name of a kind is one to its name after the swap.
			refs := map[string]string{}
			for from, to := range names {
				refs[from] = to
				if _, ok := names[to]; !ok {
					refs[to] = from
				}
			}
			names = refs
			for name, s := range schemas {
				r.openAPIV3Walk(s, names, modes[name])
			}
			if len(names) > 0 {
				components["schemas"] = mapKeys(schemas, func(k string) string {
					if to, ok := names[k]; ok {
						return to
					}
					return k
				})
			}
		}
		for k, c := range components {
			if k != "schemas" {
				r.openAPIV3Walk(c, names, gvkGroup)
			}
		}
	}
	if paths, ok := doc["paths"].(map[string]any); ok {
		r.openAPIV3Walk(paths, names, gvkKind)
		doc["paths"] = mapKeys(paths, func(k string) string {
			p, _, _ := r.RequestPath(k, nil)
			return p
		})
	}
	return Encode(doc)
}

// gvkMode is how the group-version-kind extensions of a part of a
// document are rewritten.
type gvkMode int

const (
	// gvkGroup swaps the group only: the schemas of other kinds
	// (DeleteOptions, WatchEvent) list the groups that use them, under
	// their own kind.
	gvkGroup gvkMode = iota
	// gvkKind swaps the group and the kind: the extensions of the
	// operations on a renamed group's resources and of its kinds'
	// schemas name kinds of the group.
	gvkKind
	// gvkKeep leaves them: a schema whose name says it is the other
	// side's kind, or whose name is taken on the other side.
	gvkKeep
)

// openAPIV3Walk rewrites, anywhere in v, the group-version-kind
// extensions as mode says and the references to the renamed schemas.
func (r *Rewriter) openAPIV3Walk(v any, names map[string]string, mode gvkMode) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			switch k {
			case "x-kubernetes-group-version-kind":
				gvks, ok := e.([]any)
				if !ok {
					gvks = []any{e}
				}
				for _, gvk := range gvks {
					switch m, _ := gvk.(map[string]any); {
					case m == nil || mode == gvkKeep:
					case mode == gvkKind:
						r.groupVersionKind(m, "")
					default:
						swapString(m, "group", r.Group)
					}
				}
				continue
			case "$ref":
				if ref, ok := e.(string); ok {
					if name, ok := strings.CutPrefix(ref, openAPIV3SchemaRef); ok {
						if to, ok := names[name]; ok {
							v[k] = openAPIV3SchemaRef + to
						}
					}
					continue
				}
			}
			r.openAPIV3Walk(e, names, mode)
		}
	case []any:
		for _, e := range v {
			r.openAPIV3Walk(e, names, mode)
		}
	}
}

// schemaMode says how schema s, called name, is rewritten, and for a
// kind's schema its name on the other side of the swap. A kind's schema
// is one whose first group-version-kind names a renamed group and whose
// name is the one kube-apiserver gives that kind; versions and kinds with
// dots are not read as such, so that no two kinds share a name. A schema
// named as its kind's counterpart on the other side is left as it is, so
// that the decision is the same before and after a swap.
func (r *Rewriter) schemaMode(name string, s any) (string, gvkMode) {
	schema, _ := s.(map[string]any)
	gvks, _ := schema["x-kubernetes-group-version-kind"].([]any)
	if len(gvks) == 0 {
		return "", gvkGroup
	}
	gvk, _ := gvks[0].(map[string]any)
	group, _ := gvk["group"].(string)
	version, _ := gvk["version"].(string)
	kind, _ := gvk["kind"].(string)
	if !r.Renamed(group) || version == "" || kind == "" || strings.Contains(version, ".") || strings.Contains(kind, ".") {
		return "", gvkGroup
	}
	g, k := r.Kind(group, kind)
	switch name {
	case schemaNameOf(group, version, kind):
		return schemaNameOf(g, version, k), gvkKind
	case schemaNameOf(g, version, kind):
		return "", gvkKeep
	}
	return "", gvkGroup
}

// schemaNameOf is the name kube-apiserver gives the schema of a kind of a
// custom resource: the group's labels reversed, the version and the kind
// (widgets.example.com/v1 Widget: com.example.v1.Widget).
func schemaNameOf(group, version, kind string) string {
	labels := strings.Split(group, ".")
	slices.Reverse(labels)
	return strings.Join(labels, ".") + "." + version + "." + kind
}

// mapKeys returns m with each key k under fn(k). Two keys that fn sends to
// one keep the first in sorted order, so that the result does not depend
// on the map's order; a swap never sends two keys to one.
func mapKeys(m map[string]any, fn func(string) string) map[string]any {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]any, len(m))
	for _, k := range keys {
		to := fn(k)
		if _, taken := out[to]; !taken {
			out[to] = m[k]
		}
	}
	return out
}
