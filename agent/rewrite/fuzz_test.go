package rewrite

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The fuzz tests check the package's promise: restore(rename(x)) == x,
// exactly, for every input; and that renaming an object written with
// original names leaves no original group or key domain behind.

// Shapes of input the fuzz tests feed to the rewriter.
const (
	shapeObject = iota
	shapeWatchEvent
	shapePatch
	shapeJSONPatch
	numShapes
)

// roundTrip rewrites data (canonical JSON of the given shape) twice and
// reports the first rewrite, or an error when the second does not give
// data back.
func roundTrip(r *Rewriter, shape int, target Target, data []byte) ([]byte, error) {
	var fn func([]byte) ([]byte, error)
	switch shape {
	case shapeObject:
		fn = r.ObjectJSON
	case shapeWatchEvent:
		fn = r.WatchEventJSON
	case shapePatch:
		fn = func(b []byte) ([]byte, error) { return r.PatchJSON(b, target) }
	case shapeJSONPatch:
		fn = func(b []byte) ([]byte, error) { return r.JSONPatchJSON(b, target) }
	}
	return swapTwice(fn, data)
}

// swapTwice rewrites data (canonical JSON) with fn twice and reports the
// first rewrite, or an error when the second does not give data back.
func swapTwice(fn func([]byte) ([]byte, error), data []byte) ([]byte, error) {
	renamed, err := fn(data)
	if err != nil {
		return nil, err
	}
	restored, err := fn(renamed)
	if err != nil {
		return nil, fmt.Errorf("restore of %s: %w", renamed, err)
	}
	if !bytes.Equal(restored, data) {
		return nil, fmt.Errorf("round trip differs:\n in       %s\n renamed  %s\n restored %s", data, renamed, restored)
	}
	return renamed, nil
}

// canonicalJSON decodes data and encodes it again canonically; ok is
// false when data is not JSON.
func canonicalJSON(t *testing.T, data []byte) (v any, canonical []byte, ok bool) {
	t.Helper()
	v, err := Decode(data)
	if err != nil {
		return nil, nil, false
	}
	if canonical, err = Encode(v); err != nil {
		t.Fatal(err)
	}
	return v, canonical, true
}

// checkDecoded checks the round trip on the decoded form: deep equality
// of maps, which neither key order nor re-encoding can hide behind.
func checkDecoded(t *testing.T, r *Rewriter, shape int, target Target, data []byte) {
	t.Helper()
	v, err := Decode(data)
	if err != nil {
		return
	}
	want, _ := Decode(data)
	var got any
	switch x := v.(type) {
	case map[string]any:
		switch shape {
		case shapeWatchEvent:
			got = r.WatchEvent(r.WatchEvent(x))
		case shapePatch:
			got = r.Patch(r.Patch(x, target), target)
		default:
			got = r.Object(r.Object(x))
		}
	case []any:
		got = r.JSONPatch(r.JSONPatch(x, target), target)
	default:
		return
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("decoded round trip (-in +restored):\n%s", d)
	}
}

// fuzzTargets are the patched objects the fuzz tests' patches are for.
var fuzzTargets = []Target{
	{},
	{Group: "example.com", Kind: "Widget"},
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition", Name: "widgets.example.com"},
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"},
	{Kind: "Service"},
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingWebhookConfiguration"},
}

// seeds are the unit tests' fixtures, both sides, with their shapes.
func seeds() []struct {
	shape int
	data  string
} {
	var s []struct {
		shape int
		data  string
	}
	add := func(shape int, in ...string) {
		for _, x := range in {
			s = append(s, struct {
				shape int
				data  string
			}{shape, x})
		}
	}
	for _, c := range objectCases {
		add(shapeObject, c.in, c.want)
	}
	for _, c := range watchCases {
		add(shapeWatchEvent, c.in, c.want)
	}
	for _, c := range patchCases {
		if c.target.Name == "" {
			add(shapePatch, c.in, c.want)
		}
	}
	for _, c := range jsonPatchCases {
		add(shapeJSONPatch, c.in, c.want)
	}
	return s
}

// FuzzRoundTrip feeds JSON (mutated from the fixtures) to each []byte
// function twice: the second call must give back the canonical input,
// byte for byte, and the decoded functions must give back the input,
// deep-equal.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range seeds() {
		f.Add(uint8(s.shape+numShapes), []byte(s.data))
	}
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, shape uint8, data []byte) {
		s := int(shape) % numShapes
		v, canonical, ok := canonicalJSON(t, data)
		if !ok {
			return
		}
		target := fuzzTargets[int(shape)/numShapes%len(fuzzTargets)]
		if _, err := roundTrip(r, s, target, canonical); err != nil && !isShapeError(s, v) {
			t.Fatal(err)
		}
		checkDecoded(t, r, s, target, data)
	})
}

// isShapeError says whether v is not of the shape s takes, so that the
// []byte function refuses it.
func isShapeError(s int, v any) bool {
	_, isArray := v.([]any)
	_, isObject := v.(map[string]any)
	if s == shapeJSONPatch {
		return !isArray
	}
	return !isObject
}

// FuzzRoundTripGenerated builds objects, patches and events of every
// shape the package knows from the fuzzer's bytes, with names drawn from
// both sides of the rename and from the escape chains, and checks the
// round trip. Objects written with original names only are also checked
// for leftovers: no original group or key domain may remain.
func FuzzRoundTripGenerated(f *testing.F) {
	f.Add([]byte{0}, false)
	f.Add([]byte("kube-apicache rewrite"), true)
	f.Add(bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233}, 8), false)
	f.Add(bytes.Repeat([]byte{255, 0, 7}, 30), true)
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, data []byte, originalOnly bool) {
		g := &gen{data: data, originalOnly: originalOnly}
		shape, target, v := g.input()
		canonical, err := Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		renamed, err := roundTrip(r, shape, target, canonical)
		if err != nil {
			t.Fatal(err)
		}
		checkDecoded(t, r, shape, target, canonical)
		if originalOnly {
			if leftover := originalLeftover(renamed); leftover != "" {
				t.Fatalf("renamed %s\nstill names %s", renamed, leftover)
			}
		}
	})
}

// originalLeftover returns an original group or key domain that the
// renamed JSON still names, or "". The generator writes original names
// only where they are to be renamed, so none may remain.
func originalLeftover(renamed []byte) string {
	v, err := Decode(renamed)
	if err != nil {
		return "(undecodable) " + err.Error()
	}
	var found string
	var walk func(any)
	check := func(s string) {
		if found != "" {
			return
		}
		if b, err := base64.StdEncoding.DecodeString(s); err == nil && len(s) > 8 {
			s = string(b)
		}
		for _, o := range []string{"example.com", "kubevirt.io"} {
			if strings.Contains(s, o) {
				found = fmt.Sprintf("%q in %q", o, s)
			}
		}
	}
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				check(k)
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case string:
			check(x)
		}
	}
	walk(v)
	return found
}

// FuzzText: messages and warnings round-trip.
func FuzzText(f *testing.F) {
	for _, s := range []string{
		`widgets.example.com "x" not found`,
		`Widget.example.com "x" is invalid: spec: Required value`,
		"example.com/v1 Widget is deprecated; use kubevirt.io/v1 VirtualMachine.",
		`cannot list resource "widgets" in API group "example.com" at the cluster scope`,
		"*.example.com, renamedwidgets.renamed.example.io and RenamedRenamedX.x.virtualization.example.io",
	} {
		f.Add(s)
	}
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, s string) {
		if got := r.Text(r.Text(s)); got != s {
			t.Fatalf("Text(Text(%q)) = %q (via %q)", s, got, r.Text(s))
		}
	})
}

// FuzzRequestPath: paths and selectors round-trip.
func FuzzRequestPath(f *testing.F) {
	for _, s := range [][2]string{
		{"/apis/example.com/v1/namespaces/ns/widgets/w/status", "labelSelector=example.com%2Fa%3Db%2C%21c"},
		{"/apis/kubevirt.io/v1/watch/virtualmachines", "labelSelector=x+in+%28a%2Cb%29%2Cy"},
		{"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com", "fieldSelector=metadata.name%21%3Dwidgets.example.com"},
		{"/apis/example.com/v1/renamednamespaces/x/y", ""},
		{"apis/example.com/v1/widgets", ""},
		{"//apis/example.com/v1/widgets//", ""},
	} {
		f.Add(s[0], s[1])
	}
	r := testRewriter(f)
	f.Fuzz(func(t *testing.T, path, rawQuery string) {
		q, err := url.ParseQuery(rawQuery)
		if err != nil {
			return
		}
		p1, q1, renamed1 := r.RequestPath(path, q)
		p2, q2, renamed2 := r.RequestPath(p1, q1)
		if p2 != path {
			t.Fatalf("path %q → %q → %q", path, p1, p2)
		}
		if d := cmp.Diff(q, q2); d != "" {
			t.Fatalf("query %q (-in +restored):\n%s", rawQuery, d)
		}
		if renamed1 != renamed2 {
			t.Fatalf("path %q: renamed %v, then %v", path, renamed1, renamed2)
		}
	})
}
