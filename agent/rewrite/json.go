package rewrite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// Decode parses one JSON value as the functions of this package take it:
// objects as map[string]any, numbers as json.Number (so that they are
// written back digit for digit). Trailing data is an error.
func Decode(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// Encode writes v as canonical JSON: object keys sorted, no HTML escaping,
// no trailing newline. Decode followed by Encode is the canonical
// re-encoding under which the []byte functions round-trip exactly.
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func decodeObject(data []byte) (map[string]any, error) {
	v, err := Decode(data)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want a JSON object, got %T", v)
	}
	return m, nil
}

// ObjectJSON is Object over JSON bytes; the answer is canonical JSON.
func (r *Rewriter) ObjectJSON(data []byte) ([]byte, error) {
	m, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	return Encode(r.Object(m))
}

// WatchEventJSON is WatchEvent over one event's JSON bytes (one frame of
// a watch stream).
func (r *Rewriter) WatchEventJSON(data []byte) ([]byte, error) {
	m, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	return Encode(r.WatchEvent(m))
}

// PatchJSON is Patch over a merge patch's or strategic merge patch's JSON
// bytes.
func (r *Rewriter) PatchJSON(data []byte, target Target) ([]byte, error) {
	m, err := decodeObject(data)
	if err != nil {
		return nil, err
	}
	return Encode(r.Patch(m, target))
}

// ApplyPatchYAML rewrites a server-side apply patch
// (application/apply-patch+yaml): YAML or JSON in, JSON out (JSON is YAML,
// so the content type may stay). target is the applied object, for a
// patch that lacks apiVersion, kind or name.
func (r *Rewriter) ApplyPatchYAML(data []byte, target Target) ([]byte, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("apply patch: %w", err)
	}
	return r.PatchJSON(j, target)
}

// JSONPatchJSON is JSONPatch over an RFC 6902 patch's JSON bytes.
func (r *Rewriter) JSONPatchJSON(data []byte, target Target) ([]byte, error) {
	v, err := Decode(data)
	if err != nil {
		return nil, err
	}
	ops, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("a JSON patch is an array, got %T", v)
	}
	return Encode(r.JSONPatch(ops, target))
}

// decodeCanonicalString decodes a JSON string literal if it is in the
// canonical form Encode writes, so that re-encoding gives it back.
func decodeCanonicalString(enc string) (string, bool) {
	var s string
	if err := json.Unmarshal([]byte(enc), &s); err != nil {
		return "", false
	}
	if encodeString(s) != enc {
		return "", false
	}
	return s, true
}

func encodeString(s string) string {
	b, _ := Encode(s)
	return string(b)
}
