package rewrite

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
)

// testProfile is the profile of the unit tests: an operator of
// example.com and kubevirt.io whose copies live in renamed.example.io and
// x.virtualization.example.io, with kinds prefixed Renamed and its label,
// annotation and finalizer keys moved to renamed.example.io.
func testProfile() v1alpha1.RewriteProfile {
	return v1alpha1.RewriteProfile{
		Name:     "widgets",
		Selector: v1alpha1.CallerSelector{ServiceAccounts: []string{"widgets-system/operator"}, Namespaces: []string{"renamed"}},
		Groups: []v1alpha1.GroupRename{
			{From: "example.com", To: "renamed.example.io"},
			{From: "kubevirt.io", To: "x.virtualization.example.io"},
		},
		KindPrefix:     "Renamed",
		KeepCategories: []string{"all"},
		Labels: []v1alpha1.KeyDomainRename{
			{From: "example.com", To: "renamed.example.io"},
			{From: "", To: "unprefixed.renamed.example.net"},
		},
		Annotations: []v1alpha1.KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
		Finalizers:  []v1alpha1.KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
	}
}

func testRewriter(t testing.TB) *Rewriter {
	t.Helper()
	r, err := New(testProfile())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkSwap rewrites in with fn and compares the answer with want, then
// rewrites want and compares with in: every case is checked both ways.
func checkSwap(t *testing.T, in, want string, fn func(data []byte) ([]byte, error)) {
	t.Helper()
	for _, c := range []struct{ from, to, dir string }{{in, want, "rename"}, {want, in, "restore"}} {
		got, err := fn([]byte(c.from))
		if err != nil {
			t.Fatalf("%s: %v", c.dir, err)
		}
		g, err := Decode(got)
		if err != nil {
			t.Fatalf("%s: answer %s: %v", c.dir, got, err)
		}
		w, err := Decode([]byte(c.to))
		if err != nil {
			t.Fatalf("%s: fixture %s: %v", c.dir, c.to, err)
		}
		if d := cmp.Diff(w, g); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.dir, d)
		}
	}
}

func TestNewRefusesInvalidProfile(t *testing.T) {
	p := testProfile()
	p.KindPrefix = ""
	if _, err := New(p); err == nil {
		t.Fatal("New accepted a profile without a kind prefix")
	}
}

// TestSelects: ServiceAccounts by name or namespace; nothing else.
func TestSelects(t *testing.T) {
	r := testRewriter(t)
	for user, want := range map[string]bool{
		"system:serviceaccount:widgets-system:operator": true,
		"system:serviceaccount:widgets-system:other":    false,
		"system:serviceaccount:renamed:anyone":          true,
		"system:serviceaccount:renamed:":                false,
		"system:serviceaccount:renamed:a:b":             false,
		"widgets-system/operator":                       false,
		"admin":                                         false,
		"system:serviceaccounts:renamed":                false,
	} {
		if got := r.Selects(user); got != want {
			t.Errorf("Selects(%q) = %v, want %v", user, got, want)
		}
	}
}

// TestNames: the name functions swap, and are their own inverse.
func TestNames(t *testing.T) {
	r := testRewriter(t)
	type pair struct{ a, b string }
	for _, c := range []struct {
		name  string
		fn    func(string) string
		pairs []pair
	}{
		{"group", r.Group, []pair{{"example.com", "renamed.example.io"}, {"apps", "apps"}, {"", ""}}},
		{"apiVersion", r.APIVersion, []pair{{"example.com/v1", "renamed.example.io/v1"}, {"v1", "v1"}, {"apps/v1", "apps/v1"}}},
		{"kind", func(k string) string { _, k = r.Kind("example.com", k); return k }, []pair{
			{"Widget", "RenamedWidget"},
			{"WidgetList", "RenamedWidgetList"},
			// Names that already carry the prefix pair up by count.
			{"RenamedRenamedThing", "RenamedRenamedRenamedThing"},
			// Not a kind: left alone, and so is the prefix alone.
			{"widget", "widget"},
			{"Renamed", "RenamedRenamed"},
		}},
		{"kind of another group", func(k string) string { _, k = r.Kind("apps", k); return k }, []pair{{"Deployment", "Deployment"}}},
		{"resource", func(s string) string { _, s = r.Resource("kubevirt.io", s); return s }, []pair{
			{"virtualmachines", "renamedvirtualmachines"},
			{"virtualmachines/status", "renamedvirtualmachines/status"},
			{"*", "*"},
			{"*/scale", "*/scale"},
		}},
		{"category", r.categories.swap, []pair{{"all", "all"}, {"kubevirt", "renamedkubevirt"}, {"renamedall", "renamedrenamedall"}}},
		{"label key", r.LabelKey, []pair{
			{"example.com/role", "renamed.example.io/role"},
			{"vm.example.com/name", "vm.renamed.example.io/name"},
			{"app", "unprefixed.renamed.example.net/app"},
			{"app.kubernetes.io/name", "app.kubernetes.io/name"},
			{"notexample.com/x", "notexample.com/x"},
			{"$patch", "$patch"},
		}},
		{"finalizer", r.Finalizer, []pair{{"example.com/cleanup", "renamed.example.io/cleanup"}, {"foregroundDeletion", "foregroundDeletion"}}},
		{"CRD name", r.CRDName, []pair{{"widgets.example.com", "renamedwidgets.renamed.example.io"}, {"deployments.apps", "deployments.apps"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range c.pairs {
				if got := c.fn(p.a); got != p.b {
					t.Errorf("%q → %q, want %q", p.a, got, p.b)
				}
				if got := c.fn(p.b); got != p.a {
					t.Errorf("%q → %q, want %q", p.b, got, p.a)
				}
			}
		})
	}
}

// TestSwapperIsAnInvolution walks the escape chains of a prefix.
func TestSwapperIsAnInvolution(t *testing.T) {
	for _, s := range []swapper{kindSwapper("Renamed"), resourceSwapper("renamed", map[string]bool{"all": true})} {
		for _, root := range []string{"", "Widget", "widget", "all", "1", "*", "Renamed", "renamed"} {
			x := root
			for range 5 {
				if got := s.swap(s.swap(x)); got != x {
					t.Errorf("prefix %q: swap(swap(%q)) = %q", s.prefix, x, got)
				}
				x = s.prefix + x
			}
		}
	}
}

// TestProfiles: each caller finds its profile's rewriter, or none.
func TestProfiles(t *testing.T) {
	second := testProfile()
	second.Name = "second"
	second.Selector = v1alpha1.CallerSelector{Namespaces: []string{"second"}}
	second.Groups = []v1alpha1.GroupRename{{From: "example.com", To: "second.example.io"}}
	ps, err := NewProfiles(&v1alpha1.RewriteConfiguration{Profiles: []v1alpha1.RewriteProfile{testProfile(), second}})
	if err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]string{
		"system:serviceaccount:widgets-system:operator": "widgets",
		"system:serviceaccount:second:anyone":           "second",
		"system:serviceaccount:default:default":         "",
	} {
		got := ""
		if r := ps.For(user); r != nil {
			got = r.Name()
		}
		if got != want {
			t.Errorf("For(%q) = %q, want %q", user, got, want)
		}
	}
	bad := testProfile()
	bad.Groups = nil
	if _, err := NewProfiles(&v1alpha1.RewriteConfiguration{Profiles: []v1alpha1.RewriteProfile{bad}}); err == nil {
		t.Error("NewProfiles accepted a profile without groups")
	}
}

// With an empty resource prefix, kinds are prefixed and resource names
// stay: only the group tells the copies apart.
func TestKeepResourceNames(t *testing.T) {
	p := testProfile()
	p.ResourcePrefix = new(string)
	r, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.CRDName("widgets.example.com"); got != "widgets.renamed.example.io" {
		t.Errorf("CRDName = %s, want widgets.renamed.example.io", got)
	}
	path, _, renamed := r.RequestPath("/apis/example.com/v1/namespaces/ns/widgets/w", nil)
	if path != "/apis/renamed.example.io/v1/namespaces/ns/widgets/w" || !renamed {
		t.Errorf("RequestPath = %s, %v", path, renamed)
	}
	if g, k := r.Kind("example.com", "Widget"); g != "renamed.example.io" || k != "RenamedWidget" {
		t.Errorf("Kind = %s %s", g, k)
	}
	checkSwap(t,
		`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","names":{"kind":"Widget","listKind":"WidgetList","plural":"widgets","singular":"widget","shortNames":["wdg"]}}}`,
		`{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.renamed.example.io"},"spec":{"group":"renamed.example.io","names":{"kind":"RenamedWidget","listKind":"RenamedWidgetList","plural":"widgets","singular":"widget","shortNames":["wdg"]}}}`,
		r.ObjectJSON)
	bad := "Widgets"
	p.ResourcePrefix = &bad
	if _, err := New(p); err == nil {
		t.Error("New accepted an upper-case resource prefix")
	}
}
