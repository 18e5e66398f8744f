package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readTgz returns the regular files of a .tgz by name.
func readTgz(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = string(b)
	}
}

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestPackageChart(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "Chart.yaml"), []byte("apiVersion: v2\nname: kube-apicache\n# the chart's own version\nversion: 0.0.0-dev\nappVersion: \"latest\"\n"), 0o644)
	mkfile(t, filepath.Join(dir, "values.yaml"), []byte(`# The agent's image.
image:
  repository: kube-apicache
  # Pinned by digest in releases.
  digest: ""
  pullPolicy: IfNotPresent
  nested:
    tag: not-this-one
resources: {}
tag: nor-this
`), 0o644)
	mkfile(t, filepath.Join(dir, "templates/daemonset.yaml"), []byte("kind: DaemonSet\n"), 0o644)
	mkfile(t, filepath.Join(dir, "ci/test-values.yaml"), []byte("x: 1\n"), 0o644)
	mkfile(t, filepath.Join(dir, "README.md.swp"), []byte("junk"), 0o644)
	mkfile(t, filepath.Join(dir, ".helmignore"), []byte("# editor files\n*.swp\nci/\n"), 0o644)

	out, err := packageChart(dir, t.TempDir(), chartRelease{Version: "v0.1.0", Repository: "registry.example/kube-apicache", Digest: testDigest})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(out) != "kube-apicache-0.1.0.tgz" {
		t.Errorf("archive %s, want kube-apicache-0.1.0.tgz", out)
	}
	want := map[string]string{
		"kube-apicache/.helmignore":              "# editor files\n*.swp\nci/\n",
		"kube-apicache/Chart.yaml":               "apiVersion: v2\nname: kube-apicache\n# the chart's own version\nversion: \"0.1.0\"\nappVersion: \"0.1.0\"\n",
		"kube-apicache/templates/daemonset.yaml": "kind: DaemonSet\n",
		"kube-apicache/values.yaml": `# The agent's image.
image:
  tag: "v0.1.0"
  repository: "registry.example/kube-apicache"
  # Pinned by digest in releases.
  digest: "` + testDigest + `"
  pullPolicy: IfNotPresent
  nested:
    tag: not-this-one
resources: {}
tag: nor-this
`,
	}
	if diff := cmp.Diff(want, readTgz(t, out)); diff != "" {
		t.Errorf("chart archive (-want +got):\n%s", diff)
	}
}

func TestPackageChartErrors(t *testing.T) {
	tests := []struct {
		name, values string
		rel          chartRelease
		wantErr      string
	}{
		{"no image map", "replicas: 1\n", chartRelease{Version: "v0.1.0", Digest: testDigest}, "no top-level image map"},
		{"an empty image map", "image: {}\n", chartRelease{Version: "v0.1.0", Digest: testDigest}, "no top-level image map"},
		{"not a release version", "image:\n  tag: x\n", chartRelease{Version: "0.1.0", Digest: testDigest}, "want vX.Y.Z"},
		{"not a digest", "image:\n  tag: x\n", chartRelease{Version: "v0.1.0", Digest: "latest"}, "want sha256:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			mkfile(t, filepath.Join(dir, "Chart.yaml"), []byte("apiVersion: v2\nname: c\nversion: 0.0.0\n"), 0o644)
			mkfile(t, filepath.Join(dir, "values.yaml"), []byte(tt.values), 0o644)
			_, err := packageChart(dir, t.TempDir(), tt.rel)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one with %q", err, tt.wantErr)
			}
		})
	}
}
