package rewrite

import (
	"mime"
	"strings"
)

// The rewriter works on JSON only. For a selected caller's request to a
// renamed group, protobuf and CBOR are not rewritten: the request's
// Accept header is narrowed to JSON (AcceptJSON), and bodies that are not
// JSON are refused (BodyOf).

// AcceptJSON narrows an Accept header to the JSON media ranges the
// rewriter can answer with: application/json (with its parameters:
// as=Table, stream=watch), application/yaml, application/*, */*. Protobuf
// and CBOR ranges are dropped. An empty header becomes application/json.
// ok is false when nothing acceptable remains: the caller accepts only
// encodings the rewriter cannot rewrite, and the answer is 406 Not
// Acceptable.
func AcceptJSON(accept string) (narrowed string, ok bool) {
	if strings.TrimSpace(accept) == "" {
		return "application/json", true
	}
	var keep []string
	for _, r := range strings.Split(accept, ",") {
		r = strings.TrimSpace(r)
		mt, params, err := mime.ParseMediaType(r)
		if err != nil {
			continue
		}
		if q, ok := params["q"]; ok && strings.Trim(q, "0.") == "" {
			continue // q=0: not acceptable
		}
		switch mt {
		case "application/json", "application/yaml", "application/*", "*/*":
			keep = append(keep, r)
		}
	}
	if len(keep) == 0 {
		return "", false
	}
	return strings.Join(keep, ", "), true
}

// Body is the kind of a request body, by its Content-Type.
type Body int

const (
	// BodyUnsupported: not JSON (protobuf, CBOR, apply-patch+cbor): the
	// answer is 415 Unsupported Media Type.
	BodyUnsupported Body = iota
	// BodyObject: application/json, an object (Object, ObjectJSON).
	BodyObject
	// BodyMergePatch: a JSON merge patch or a strategic merge patch
	// (Patch, PatchJSON).
	BodyMergePatch
	// BodyJSONPatch: an RFC 6902 JSON patch (JSONPatch, JSONPatchJSON).
	BodyJSONPatch
	// BodyApplyPatch: a server-side apply patch in YAML or JSON
	// (ApplyPatchYAML).
	BodyApplyPatch
)

// BodyOf tells what a request body of the given Content-Type is, for the
// rewriter.
func BodyOf(contentType string) Body {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return BodyUnsupported
	}
	switch mt {
	case "application/json":
		return BodyObject
	case "application/merge-patch+json", "application/strategic-merge-patch+json":
		return BodyMergePatch
	case "application/json-patch+json":
		return BodyJSONPatch
	case "application/apply-patch+yaml":
		return BodyApplyPatch
	}
	return BodyUnsupported
}
