package rewrite

import "testing"

// TestText: messages and Warning headers.
func TestText(t *testing.T) {
	r := testRewriter(t)
	for in, want := range map[string]string{
		`widgets.example.com "x" not found`:                                   `renamedwidgets.renamed.example.io "x" not found`,
		`Widget.example.com "x" is invalid: spec: Required value`:             `RenamedWidget.renamed.example.io "x" is invalid: spec: Required value`,
		"example.com/v1 Widget is deprecated; use example.com/v2":             "renamed.example.io/v1 RenamedWidget is deprecated; use renamed.example.io/v2",
		"the group kubevirt.io.":                                              "the group x.virtualization.example.io.",
		"virtualmachines.kubevirt.io/status, unrelated.io apps/v1 Deployment": "virtualmachines.kubevirt.io/status, unrelated.io apps/v1 Deployment",
		`widgets.example.com "w" is forbidden: User "u" cannot get resource "widgets/status" in API group "example.com" in the namespace "n"`: `renamedwidgets.renamed.example.io "w" is forbidden: User "u" cannot get resource "renamedwidgets/status" in API group "renamed.example.io" in the namespace "n"`,
		`cannot list resource "pods" in API group "" at the cluster scope`:                                                                    `cannot list resource "pods" in API group "" at the cluster scope`,
		`resource "example.com" in API group "example.com"`:                                                                                   `resource "renamedexample.com" in API group "renamed.example.io"`,
		`299 - "example.com/v1 Widget is deprecated in v1.40+, unavailable in v1.42+; use example.com/v2 Widget"`:                             `299 - "renamed.example.io/v1 RenamedWidget is deprecated in v1.40+, unavailable in v1.42+; use renamed.example.io/v2 RenamedWidget"`,
		"*.example.com":                      "*.renamed.example.io",
		"":                                   "",
		"no names here: Widget example":      "no names here: Widget example",
		"notexample.com and sub.example.com": "notexample.com and renamedsub.renamed.example.io",
	} {
		if got := r.Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
		if got := r.Text(want); got != in {
			t.Errorf("Text(%q) = %q, want %q", want, got, in)
		}
	}
}
