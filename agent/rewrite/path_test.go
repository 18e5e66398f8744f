package rewrite

import (
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRequestPath: paths and queries, both ways.
func TestRequestPath(t *testing.T) {
	r := testRewriter(t)
	for _, c := range []struct {
		name            string
		path, query     string
		wantPath, wantQ string
		renamed         bool
	}{
		{"group", "/apis/example.com", "", "/apis/renamed.example.io", "", true},
		{"group version", "/apis/example.com/v1/", "", "/apis/renamed.example.io/v1/", "", true},
		{"cluster list", "/apis/example.com/v1/widgets", "limit=5", "/apis/renamed.example.io/v1/renamedwidgets", "limit=5", true},
		{"namespaced subresource", "/apis/kubevirt.io/v1/namespaces/ns/virtualmachines/vm/status", "", "/apis/x.virtualization.example.io/v1/namespaces/ns/renamedvirtualmachines/vm/status", "", true},
		{"legacy watch", "/apis/example.com/v1/watch/namespaces/ns/widgets", "", "/apis/renamed.example.io/v1/watch/namespaces/ns/renamedwidgets", "", true},
		{"label selector", "/apis/example.com/v1/widgets", "labelSelector=example.com%2Fa%3Db%2C%21example.com%2Fc%2Capp+in+%28x%2Cy%29&watch=1",
			"/apis/renamed.example.io/v1/renamedwidgets", "labelSelector=renamed.example.io%2Fa%3Db%2C%21renamed.example.io%2Fc%2Cunprefixed.renamed.example.net%2Fapp+in+%28x%2Cy%29&watch=1", true},
		{"pods by label", "/api/v1/namespaces/n/pods", "labelSelector=example.com%2Fa", "/api/v1/namespaces/n/pods", "labelSelector=renamed.example.io%2Fa", false},
		{"crd by name", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com", "", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/renamedwidgets.renamed.example.io", "", false},
		{"crd field selector", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "fieldSelector=metadata.name%3Dwidgets.example.com&watch=true",
			"/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "fieldSelector=metadata.name%3Drenamedwidgets.renamed.example.io&watch=true", false},
		{"other group", "/apis/apps/v1/deployments", "fieldSelector=metadata.name%3Dwidgets.example.com", "/apis/apps/v1/deployments", "fieldSelector=metadata.name%3Dwidgets.example.com", false},
		{"discovery root", "/apis", "", "/apis", "", false},
		{"resource named namespaces stays", "/apis/example.com/v1/namespaces", "", "/apis/renamed.example.io/v1/namespaces", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, d := range []struct{ path, q, wantPath, wantQ string }{
				{c.path, c.query, c.wantPath, c.wantQ}, {c.wantPath, c.wantQ, c.path, c.query},
			} {
				q, err := url.ParseQuery(d.q)
				if err != nil {
					t.Fatal(err)
				}
				p, gq, renamed := r.RequestPath(d.path, q)
				if p != d.wantPath {
					t.Errorf("path %s → %s, want %s", d.path, p, d.wantPath)
				}
				if got := gq.Encode(); got != d.wantQ {
					t.Errorf("query %s → %s, want %s", d.q, got, d.wantQ)
				}
				if renamed != c.renamed {
					t.Errorf("renamed = %v, want %v", renamed, c.renamed)
				}
			}
		})
	}
}

// TestRequestPathLeavesQueryAlone: the caller's query is never modified.
func TestRequestPathLeavesQueryAlone(t *testing.T) {
	r := testRewriter(t)
	q := url.Values{"labelSelector": {"example.com/a"}}
	_, out, _ := r.RequestPath("/apis/example.com/v1/widgets", q)
	if d := cmp.Diff(url.Values{"labelSelector": {"example.com/a"}}, q); d != "" {
		t.Errorf("query modified:\n%s", d)
	}
	if out.Get("labelSelector") != "renamed.example.io/a" {
		t.Errorf("labelSelector = %q", out.Get("labelSelector"))
	}
}

// TestLabelSelector: only keys move; operators, values and spaces stay.
func TestLabelSelector(t *testing.T) {
	r := testRewriter(t)
	for in, want := range map[string]string{
		"":                                   "",
		"example.com/a":                      "renamed.example.io/a",
		" !example.com/a , b!=c":             " !renamed.example.io/a , unprefixed.renamed.example.net/b!=c",
		"x notin (example.com/a, b),y==z":    "unprefixed.renamed.example.net/x notin (example.com/a, b),unprefixed.renamed.example.net/y==z",
		"app.kubernetes.io/name=example.com": "app.kubernetes.io/name=example.com",
	} {
		if got := r.LabelSelector(in); got != want {
			t.Errorf("LabelSelector(%q) = %q, want %q", in, got, want)
		}
		if got := r.LabelSelector(want); got != in {
			t.Errorf("LabelSelector(%q) = %q, want %q", want, got, in)
		}
	}
}
