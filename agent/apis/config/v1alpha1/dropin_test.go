package v1alpha1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"
)

const header = "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\n"

// writeFiles writes each name's content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// Given a main file and drop-ins, when they are loaded, then the drop-ins
// are merged over the main file in lexical order of their names.
func TestLoadWithDropIns(t *testing.T) {
	for _, tc := range []struct {
		// name says what the scenario shows.
		name string
		// main is the --config file ("" for none); dropIns the files of
		// --config-dir.
		main    string
		dropIns map[string]string
		// want is the merged configuration; wantFiles the drop-ins read.
		want      *AgentConfiguration
		wantFiles []string
	}{{
		name: "a drop-in sets one field and keeps the others of its section",
		main: header + "cluster:\n  clusterDomain: example.internal\n  signerName: a/b\n",
		dropIns: map[string]string{
			"50-signer.yaml": header + "cluster:\n  signerName: example.com/agents\n",
		},
		want: &AgentConfiguration{Cluster: ClusterConfiguration{
			ClusterDomain: ptr.To("example.internal"), SignerName: ptr.To("example.com/agents"),
		}},
		wantFiles: []string{"50-signer.yaml"},
	}, {
		name: "a later drop-in overrides an earlier one, whatever order they were written in",
		main: header + "cache:\n  asNode: true\n",
		dropIns: map[string]string{
			"90-last.yaml":  header + "cache:\n  asNode: false\n",
			"10-first.yaml": header + "cache:\n  asNode: true\n  historyEvents: 5\n",
		},
		want:      &AgentConfiguration{Cache: CacheConfiguration{AsNode: ptr.To(false), HistoryEvents: ptr.To[int32](5)}},
		wantFiles: []string{"10-first.yaml", "90-last.yaml"},
	}, {
		name: "a list replaces the list before it; null removes a field",
		main: header + "cluster:\n  serviceVIPs: [10.96.0.1, fd00::1]\n  clusterDomain: example.internal\n",
		dropIns: map[string]string{
			"50.yaml": header + "cluster:\n  serviceVIPs: [10.100.0.1]\n  clusterDomain: null\n",
		},
		want:      &AgentConfiguration{Cluster: ClusterConfiguration{ServiceVIPs: []string{"10.100.0.1"}}},
		wantFiles: []string{"50.yaml"},
	}, {
		name: "the main file is not read again as a drop-in of its own directory",
		main: "config.yaml",
		dropIns: map[string]string{
			"config.yaml":    header + "cluster:\n  signerName: a/main\n",
			"50-signer.yaml": header + "cluster:\n  signerName: a/drop-in\n",
		},
		want:      &AgentConfiguration{Cluster: ClusterConfiguration{SignerName: ptr.To("a/drop-in")}},
		wantFiles: []string{"50-signer.yaml"},
	}, {
		name: "other names are ignored: other extensions, hidden files, directories",
		main: header,
		dropIns: map[string]string{
			"50.conf":        header + "cluster:\n  signerName: a/conf\n",
			"50.yml":         header + "cluster:\n  signerName: a/yml\n",
			".50-edit.yaml":  header + "cluster:\n  signerName: a/hidden\n",
			"README":         "not configuration",
			"60-signer.yaml": header + "cluster:\n  signerName: a/yaml\n",
		},
		want:      &AgentConfiguration{Cluster: ClusterConfiguration{SignerName: ptr.To("a/yaml")}},
		wantFiles: []string{"60-signer.yaml"},
	}, {
		name:    "an empty directory changes nothing",
		main:    header + "cluster:\n  signerName: a/main\n",
		dropIns: map[string]string{},
		want:    &AgentConfiguration{Cluster: ClusterConfiguration{SignerName: ptr.To("a/main")}},
	}, {
		name:      "drop-ins without a main file",
		dropIns:   map[string]string{"50.yaml": header + "cache:\n  asNode: false\n"},
		want:      &AgentConfiguration{Cache: CacheConfiguration{AsNode: ptr.To(false)}},
		wantFiles: []string{"50.yaml"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			confDir := filepath.Join(dir, "conf.d")
			if err := os.Mkdir(confDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(confDir, "70-dir.yaml"), 0o700); err != nil {
				t.Fatal(err)
			}
			writeFiles(t, confDir, tc.dropIns)
			main := ""
			switch {
			case tc.main == "config.yaml":
				main = filepath.Join(confDir, "config.yaml")
			case tc.main != "":
				main = filepath.Join(dir, "config.yaml")
				writeFiles(t, dir, map[string]string{"config.yaml": tc.main})
			}
			got, files, err := LoadWithDropIns(main, confDir)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.APIVersion, tc.want.Kind = SchemeGroupVersion.String(), "AgentConfiguration"
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("configuration (-want +got):\n%s", diff)
			}
			var names []string
			for _, f := range files {
				names = append(names, filepath.Base(f))
			}
			if diff := cmp.Diff(tc.wantFiles, names); diff != "" {
				t.Errorf("drop-ins read (-want +got):\n%s", diff)
			}
		})
	}
}

// Given a drop-in with a mistake among valid ones, when the directory is
// loaded, then the one error names that file and the mistake.
func TestLoadWithDropInsErrors(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field": {
			doc:  header + "cache:\n  asnode: false\n",
			want: `unknown field "cache.asnode"`,
		},
		"no apiVersion": {
			doc:  "kind: AgentConfiguration\ncache:\n  asNode: false\n",
			want: "apiVersion is required",
		},
		"no kind": {
			doc:  "apiVersion: config.kube-apicache.io/v1alpha1\ncache:\n  asNode: false\n",
			want: "kind is required",
		},
		"empty": {
			doc:  "",
			want: "is required",
		},
		"not YAML": {
			doc:  header + "cache: [\n",
			want: "yaml",
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{
				"10-good.yaml": header + "cache:\n  asNode: true\n",
				"50-bad.yaml":  tc.doc,
				"90-good.yaml": header + "cache:\n  asNode: true\n",
			})
			_, _, err := LoadWithDropIns("", dir)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, filepath.Join(dir, "50-bad.yaml")+":") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want one naming 50-bad.yaml and containing %q", msg, tc.want)
			}
			if strings.Contains(msg, "good") {
				t.Errorf("error %q names a valid drop-in", msg)
			}
		})
	}
}

// A drop-in directory that does not exist is an error, not an empty one:
// a mistyped --config-dir must not go unnoticed.
func TestLoadWithDropInsMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, _, err := LoadWithDropIns("", dir)
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("error %v, want one naming %s", err, dir)
	}
}

// The shipped ConfigMap's file, merged with no drop-ins, is the file
// itself: mounting the ConfigMap as a drop-in directory changes nothing
// until an overlay adds a key.
func TestShippedConfigAsDropInDirectory(t *testing.T) {
	want := shippedConfig(t)
	dir := t.TempDir()
	raw, err := os.ReadFile("../../../../manifests/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, doc, _ := strings.Cut(string(raw), "  config.yaml: |\n")
	var lines []string
	for line := range strings.Lines(doc) {
		lines = append(lines, strings.TrimPrefix(line, "    "))
	}
	writeFiles(t, dir, map[string]string{"config.yaml": strings.Join(lines, "")})
	got, files, err := LoadWithDropIns(filepath.Join(dir, "config.yaml"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 0 {
		t.Errorf("drop-ins read: %q", files)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("configuration (-file +merged):\n%s", diff)
	}
}

// The drop-ins the components in manifests/components add (the keys
// named NN-*.yaml) are valid, and each changes the shipped configuration.
func TestComponentDropIns(t *testing.T) {
	base := shippedConfig(t)
	files, err := filepath.Glob("../../../../manifests/components/*/[0-9][0-9]-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("only %d drop-ins under manifests/components", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			dir := t.TempDir()
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			writeFiles(t, dir, map[string]string{filepath.Base(f): string(data)})
			c, _, err := LoadWithDropIns("", dir)
			if err != nil {
				t.Fatal(err)
			}
			merged := mergeOver(t, base, c)
			if cmp.Equal(base, merged) {
				t.Errorf("%s changes nothing in the shipped configuration", f)
			}
		})
	}
}

// mergeOver returns base with every field over sets replaced.
func mergeOver(t *testing.T, base, over *AgentConfiguration) *AgentConfiguration {
	t.Helper()
	b, o := base.DeepCopyObject().(*AgentConfiguration), over.DeepCopyObject().(*AgentConfiguration)
	ob, _ := json.Marshal(o)
	if err := json.Unmarshal(ob, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Given a ConfigMap's data as the agent's watch of the kill switch sees
// it, when it is merged, then it reads as the mounted directory does: the
// main key first, the other .yaml keys over it in name order, other and
// dotted keys ignored, and a bad key or a missing main key an error that
// names it.
func TestMergeData(t *testing.T) {
	data := map[string]string{
		"config.yaml":          header + "interception:\n  enabled: true\ncluster:\n  clusterDomain: one.local\n",
		"20-kill-switch.yaml":  header + "interception:\n  enabled: false\n",
		"10-domain.yaml":       header + "cluster:\n  clusterDomain: two.local\n",
		"README":               "not a configuration",
		"..2026_11_28_00.yaml": "not: a configuration either",
	}
	c, err := MergeData(data, "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Interception.Enabled == nil || *c.Interception.Enabled || ptr.Deref(c.Cluster.ClusterDomain, "") != "two.local" {
		t.Errorf("merged interception.enabled %v, clusterDomain %q; want false (20-kill-switch.yaml), two.local (10-domain.yaml)",
			c.Interception.Enabled, ptr.Deref(c.Cluster.ClusterDomain, ""))
	}

	for _, tc := range []struct {
		name string
		data map[string]string
		want string
	}{
		{"no main key", map[string]string{"20-kill-switch.yaml": data["20-kill-switch.yaml"]}, "no key config.yaml"},
		{"misspelt field in a drop-in", map[string]string{"config.yaml": header, "30-bad.yaml": header + "interception:\n  enabeld: false\n"}, "30-bad.yaml"},
		{"drop-in without kind", map[string]string{"config.yaml": header, "30-bad.yaml": "interception:\n  enabled: false\n"}, "30-bad.yaml"},
	} {
		if _, err := MergeData(tc.data, "config.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: MergeData error = %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}
