package rewrite

import "testing"

// patchCases are merge patches and strategic merge patches, without
// apiVersion and kind: the patched kind comes from the request.
var patchCases = []struct {
	name   string
	target Target
	in     string
	want   string
}{
	{
		name:   "merge patch of labels, with a deletion",
		target: Target{Kind: "ConfigMap"}, in: `{"metadata":{"labels":{"example.com/a":"b","example.com/gone":null}}}`,
		want: `{"metadata":{"labels":{"renamed.example.io/a":"b","renamed.example.io/gone":null}}}`,
	},
	{
		name:   "strategic merge patch directives",
		target: Target{Kind: "Pod"},
		in: `{"metadata":{"$setElementOrder/finalizers":["example.com/a","other.io/b"],"$deleteFromPrimitiveList/finalizers":["example.com/c"],
			"labels":{"$patch":"replace","example.com/x":"y"},
			"ownerReferences":[{"$patch":"delete","uid":"1"},{"apiVersion":"example.com/v1","kind":"Widget","uid":"2"}],"$setElementOrder/ownerReferences":[{"uid":"2"}]},
			"spec":{"$retainKeys":["type"],"type":"x"}}`,
		want: `{"metadata":{"$setElementOrder/finalizers":["renamed.example.io/a","other.io/b"],"$deleteFromPrimitiveList/finalizers":["renamed.example.io/c"],
			"labels":{"$patch":"replace","renamed.example.io/x":"y"},
			"ownerReferences":[{"$patch":"delete","uid":"1"},{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","uid":"2"}],"$setElementOrder/ownerReferences":[{"uid":"2"}]},
			"spec":{"$retainKeys":["type"],"type":"x"}}`,
	},
	{
		// The kind from the request path says this is a ClusterRole.
		name:   "patch of a cluster role's rules",
		target: Target{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"},
		in:     `{"rules":[{"apiGroups":["example.com"],"resources":["widgets"],"verbs":["get"]}]}`,
		want:   `{"rules":[{"apiGroups":["renamed.example.io"],"resources":["renamedwidgets"],"verbs":["get"]}]}`,
	},
	{
		name:   "patch of a CRD's names",
		target: Target{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"},
		in:     `{"metadata":{"name":"widgets.example.com"},"spec":{"names":{"shortNames":["wd","w"]}}}`,
		want:   `{"metadata":{"name":"renamedwidgets.renamed.example.io"},"spec":{"names":{"shortNames":["renamedwd","renamedw"]}}}`,
	},
	{
		// The CRD's group is only in the request path's name (either
		// side's name leads to the same decision).
		name:   "patch of a CRD's names, the CRD named by the path",
		target: Target{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition", Name: "widgets.example.com"},
		in:     `{"spec":{"names":{"categories":["all","example"]}}}`,
		want:   `{"spec":{"names":{"categories":["all","renamedexample"]}}}`,
	},
	{
		name:   "patch of a custom resource's status",
		target: Target{Group: "example.com", Kind: "Widget"},
		in:     `{"status":{"phase":"Ready"},"metadata":{"annotations":{"example.com/seen":"1"}}}`,
		want:   `{"status":{"phase":"Ready"},"metadata":{"annotations":{"renamed.example.io/seen":"1"}}}`,
	},
}

// TestPatch: merge and strategic merge patches, both ways.
func TestPatch(t *testing.T) {
	r := testRewriter(t)
	for _, c := range patchCases {
		t.Run(c.name, func(t *testing.T) {
			checkSwap(t, c.in, c.want, func(b []byte) ([]byte, error) { return r.PatchJSON(b, c.target) })
		})
	}
}

// TestApplyPatchYAML: a server-side apply patch in YAML, with
// managedFields-free metadata, becomes renamed JSON.
func TestApplyPatchYAML(t *testing.T) {
	r := testRewriter(t)
	in := `apiVersion: example.com/v1
kind: Widget
metadata:
  name: w
  labels:
    example.com/role: a
  finalizers: [example.com/cleanup]
spec:
  size: 3
`
	got, err := r.ApplyPatchYAML([]byte(in), Target{Group: "example.com", Kind: "Widget", Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget","metadata":{"finalizers":["renamed.example.io/cleanup"],"labels":{"renamed.example.io/role":"a"},"name":"w"},"spec":{"size":3}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, err := r.ApplyPatchYAML([]byte("a: [b"), Target{}); err == nil {
		t.Error("a broken YAML patch gave no error")
	}
}

// jsonPatchCases are RFC 6902 patches, with or without their target.
var jsonPatchCases = []struct {
	name     string
	target   Target
	in, want string
}{
	{
		name: "label and annotation keys in paths, escaped",
		in:   `[{"op":"add","path":"/metadata/labels/example.com~1a","value":"b"},{"op":"remove","path":"/metadata/annotations/example.com~1n"},{"op":"move","from":"/metadata/labels/example.com~1old","path":"/metadata/labels/example.com~1new"},{"op":"test","path":"/spec/selector/matchLabels/app","value":"x"}]`,
		want: `[{"op":"add","path":"/metadata/labels/renamed.example.io~1a","value":"b"},{"op":"remove","path":"/metadata/annotations/renamed.example.io~1n"},{"op":"move","from":"/metadata/labels/renamed.example.io~1old","path":"/metadata/labels/renamed.example.io~1new"},{"op":"test","path":"/spec/selector/matchLabels/unprefixed.renamed.example.net~1app","value":"x"}]`,
	},
	{
		name: "values: labels, finalizers, owner references, apiVersion",
		in: `[{"op":"replace","path":"/metadata/labels","value":{"example.com/a":"b"}},
			{"op":"add","path":"/metadata/finalizers/-","value":"example.com/f"},
			{"op":"replace","path":"/metadata/finalizers","value":["example.com/f","x.io/g"]},
			{"op":"add","path":"/metadata/ownerReferences/0","value":{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","uid":"1"}},
			{"op":"replace","path":"/metadata/ownerReferences/0/apiVersion","value":"kubevirt.io/v1"},
			{"op":"replace","path":"/apiVersion","value":"example.com/v2"},
			{"op":"replace","path":"/kind","value":"Widget"}]`,
		want: `[{"op":"replace","path":"/metadata/labels","value":{"renamed.example.io/a":"b"}},
			{"op":"add","path":"/metadata/finalizers/-","value":"renamed.example.io/f"},
			{"op":"replace","path":"/metadata/finalizers","value":["renamed.example.io/f","x.io/g"]},
			{"op":"add","path":"/metadata/ownerReferences/0","value":{"apiVersion":"x.virtualization.example.io/v1","kind":"RenamedVirtualMachine","uid":"1"}},
			{"op":"replace","path":"/metadata/ownerReferences/0/apiVersion","value":"x.virtualization.example.io/v1"},
			{"op":"replace","path":"/apiVersion","value":"renamed.example.io/v2"},
			{"op":"replace","path":"/kind","value":"Widget"}]`,
	},
	{
		name: "whole object, metadata, template and selector",
		in: `[{"op":"replace","path":"","value":{"apiVersion":"example.com/v1","kind":"Widget"}},
			{"op":"add","path":"/metadata","value":{"annotations":{"example.com/a":""}}},
			{"op":"add","path":"/spec/template","value":{"metadata":{"labels":{"example.com/a":""}}}},
			{"op":"add","path":"/spec/selector","value":{"matchLabels":{"example.com/a":""}}}]`,
		want: `[{"op":"replace","path":"","value":{"apiVersion":"renamed.example.io/v1","kind":"RenamedWidget"}},
			{"op":"add","path":"/metadata","value":{"annotations":{"renamed.example.io/a":""}}},
			{"op":"add","path":"/spec/template","value":{"metadata":{"labels":{"renamed.example.io/a":""}}}},
			{"op":"add","path":"/spec/selector","value":{"matchLabels":{"renamed.example.io/a":""}}}]`,
	},
	{
		// A key that is itself "metadata" or "labels" is no structure.
		name: "keys named like fields",
		in:   `[{"op":"add","path":"/metadata/labels/metadata","value":"x"},{"op":"add","path":"/metadata/labels/matchLabels","value":"y"}]`,
		want: `[{"op":"add","path":"/metadata/labels/unprefixed.renamed.example.net~1metadata","value":"x"},{"op":"add","path":"/metadata/labels/unprefixed.renamed.example.net~1matchLabels","value":"y"}]`,
	},
	{
		name:   "a cluster role's rules",
		target: Target{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"},
		in:     `[{"op":"add","path":"/rules/-","value":{"apiGroups":["example.com"],"resources":["widgets/status"],"verbs":["get"]}},{"op":"replace","path":"/rules/0/resources","value":["widgets"]}]`,
		want:   `[{"op":"add","path":"/rules/-","value":{"apiGroups":["renamed.example.io"],"resources":["renamedwidgets/status"],"verbs":["get"]}},{"op":"replace","path":"/rules/0/resources","value":["widgets"]}]`,
	},
	{
		name:   "a CRD's names and group, the CRD named by the path",
		target: Target{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition", Name: "widgets.example.com"},
		in:     `[{"op":"replace","path":"/spec/names/shortNames","value":["wd"]},{"op":"replace","path":"/spec/names","value":{"kind":"Widget","plural":"widgets"}}]`,
		want:   `[{"op":"replace","path":"/spec/names/shortNames","value":["renamedwd"]},{"op":"replace","path":"/spec/names","value":{"kind":"RenamedWidget","plural":"renamedwidgets"}}]`,
	},
	{
		name:   "a custom resource's kind and labels",
		target: Target{Group: "example.com", Kind: "Widget"},
		in:     `[{"op":"replace","path":"/kind","value":"Widget"},{"op":"replace","path":"/metadata/labels","value":{"example.com/a":"b"}},{"op":"add","path":"/metadata/finalizers/0","value":"example.com/f"}]`,
		want:   `[{"op":"replace","path":"/kind","value":"RenamedWidget"},{"op":"replace","path":"/metadata/labels","value":{"renamed.example.io/a":"b"}},{"op":"add","path":"/metadata/finalizers/0","value":"renamed.example.io/f"}]`,
	},
	{
		name:   "a service's selector",
		target: Target{Kind: "Service"},
		in:     `[{"op":"replace","path":"/spec/selector","value":{"example.com/app":"a"}}]`,
		want:   `[{"op":"replace","path":"/spec/selector","value":{"renamed.example.io/app":"a"}}]`,
	},
	{
		// Not canonical pointers (~2 is no escape) and not pointers are
		// left alone.
		name: "odd pointers",
		in:   `[{"op":"add","path":"/metadata/labels/example.com~1a~2","value":"b"},{"op":"add","path":"metadata/labels/example.com~1a","value":"b"},"junk",{"op":"add"}]`,
		want: `[{"op":"add","path":"/metadata/labels/example.com~1a~2","value":"b"},{"op":"add","path":"metadata/labels/example.com~1a","value":"b"},"junk",{"op":"add"}]`,
	},
}

// TestJSONPatch: RFC 6902 patches, both ways.
func TestJSONPatch(t *testing.T) {
	r := testRewriter(t)
	for _, c := range jsonPatchCases {
		t.Run(c.name, func(t *testing.T) {
			checkSwap(t, c.in, c.want, func(b []byte) ([]byte, error) { return r.JSONPatchJSON(b, c.target) })
		})
	}
	if _, err := r.JSONPatchJSON([]byte(`{}`), Target{}); err == nil {
		t.Error("an object was taken for a JSON patch")
	}
}
