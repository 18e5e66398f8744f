package helmtest

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the chart's copies of the manifests' files (files/) from manifests/")

// chartFiles are the chart's files/ that copy (part of) a file of the
// kustomize manifests, each with the function that derives it.
var chartFiles = map[string]func(t *testing.T) []byte{
	// The AgentConfiguration of the ConfigMap, without the ConfigMap.
	"config.yaml": func(t *testing.T) []byte {
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal(read(t, "config.yaml"), &cm); err != nil {
			t.Fatal(err)
		}
		return []byte(cm.Data["config.yaml"])
	},
	"dashboard.json": func(t *testing.T) []byte { return read(t, "monitoring/dashboard.json") },
	// The PrometheusRule's spec: the chart writes its metadata.
	"prometheusrule-spec.yaml": func(t *testing.T) []byte {
		_, spec, ok := strings.Cut(string(read(t, "monitoring/prometheusrule.yaml")), "\nspec:\n")
		if !ok {
			t.Fatal("manifests/monitoring/prometheusrule.yaml has no spec")
		}
		return []byte("# The PrometheusRule's spec, as manifests/monitoring/prometheusrule.yaml\n" +
			"# has it (hack/helmtest checks that the two render alike). Not a template:\n" +
			"# the alerts' own {{ }} are Prometheus's.\nspec:\n" + spec)
	},
}

// read is a file of the manifests.
func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(manifestsDir, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The chart's copies of the manifests' files are current: after a change
// of config.yaml or manifests/monitoring, `go test -run TestChartFiles
// -update` in hack/helmtest writes them again.
func TestChartFiles(t *testing.T) {
	for name, derive := range chartFiles {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(chartDir, "files", name)
			want := derive(t)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is not current: run `go -C hack/helmtest test -run TestChartFiles -update ./...`", path)
			}
		})
	}
}
