package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const example = `apiVersion: config.kube-apicache.io/v1alpha1
kind: RewriteConfiguration
profiles:
- name: widgets
  selector:
    serviceAccounts: [widgets-system/operator]
  groups:
  - from: example.com
    to: renamed.example.io
  kindPrefix: Renamed
  labels:
  - from: example.com
    to: renamed.example.io
`

// TestDecode: a file decodes, and the defaults are set.
func TestDecode(t *testing.T) {
	c, err := Decode([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	want := RewriteProfile{
		Name:           "widgets",
		Selector:       CallerSelector{ServiceAccounts: []string{"widgets-system/operator"}},
		Groups:         []GroupRename{{From: "example.com", To: "renamed.example.io"}},
		KindPrefix:     "Renamed",
		KeepCategories: []string{"all"},
		Labels:         []KeyDomainRename{{From: "example.com", To: "renamed.example.io"}},
	}
	if d := cmp.Diff([]RewriteProfile{want}, c.Profiles); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if errs := Validate(c, nil); len(errs) > 0 {
		t.Errorf("the example is not valid: %v", errs)
	}
}

// TestDecodeErrors: strict decoding names what is wrong.
func TestDecodeErrors(t *testing.T) {
	for _, c := range []struct {
		name, data, want string
	}{
		{"unknown field", strings.Replace(example, "kindPrefix", "kindprefix", 1), `unknown field "profiles[0].kindprefix"`},
		{"duplicate field", example + "profiles: []\n", `key "profiles" already set`},
		{"no apiVersion", "kind: RewriteConfiguration\n", "apiVersion is required"},
		{"no kind", "apiVersion: config.kube-apicache.io/v1alpha1\n", "kind is required"},
		{"other kind", "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\n", "AgentConfiguration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode([]byte(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestLoad: the file's path is in errors.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("kind: RewriteConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err != nil {
		t.Error(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("error %v does not name the file", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file gave no error")
	}
}

// TestDeepCopy: the copy shares no slices.
func TestDeepCopy(t *testing.T) {
	c, err := Decode([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	cp := c.DeepCopyObject().(*RewriteConfiguration)
	cp.Profiles[0].Groups[0].To = "changed.example.io"
	if c.Profiles[0].Groups[0].To != "renamed.example.io" {
		t.Error("the copy shares the groups")
	}
}

// TestComponentExample: the example profiles the kustomize component
// manifests/components/rewriting ships (and the Helm chart's
// rewriting.config default, which hack/helmtest keeps equal) decode
// strictly and validate.
func TestComponentExample(t *testing.T) {
	c, err := Load("../../../../manifests/components/rewriting/rewrite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if errs := Validate(c, nil); len(errs) > 0 {
		t.Errorf("the example is not valid: %v", errs.ToAggregate())
	}
	if len(c.Profiles) != 1 || c.Profiles[0].ResourcePrefix == nil || *c.Profiles[0].ResourcePrefix != "" {
		t.Errorf("profiles %+v, want one with resourcePrefix \"\"", c.Profiles)
	}
}
