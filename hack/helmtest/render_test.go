package helmtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	// chartDir is the chart; manifestsDir the kustomize base, whose
	// components are in manifestsDir/components.
	chartDir     = "../../manifests/helm/kube-apicache"
	manifestsDir = "../../manifests"
	// namespace is the base's namespace, and the release's in the tests.
	namespace = "kube-apicache"
)

// objects are rendered objects by their id (see id), each decoded from
// JSON, so that both renderers' numbers and strings compare alike.
type objects map[string]map[string]any

// id names an object by group, kind, namespace and name: two objects with
// the same id are the same object to kube-apiserver.
func id(obj map[string]any) string {
	group, _, _ := strings.Cut(fmt.Sprint(obj["apiVersion"]), "/")
	if !strings.Contains(fmt.Sprint(obj["apiVersion"]), "/") {
		group = "core"
	}
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	return fmt.Sprintf("%s/%s %s/%s", group, obj["kind"], ns, name)
}

// add decodes one YAML document into objs; empty documents are skipped.
func (objs objects) add(t *testing.T, source, doc string) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("%s: %v\n%s", source, err, doc)
	}
	var obj map[string]any
	if err := json.Unmarshal(j, &obj); err != nil {
		t.Fatalf("%s: %v", source, err)
	}
	if len(obj) == 0 {
		return
	}
	k := id(obj)
	if _, dup := objs[k]; dup {
		t.Fatalf("%s: %s rendered twice", source, k)
	}
	objs[k] = obj
}

// renderChart renders the chart with values over its defaults, as
// `helm template kube-apicache <chart> --namespace ns` would.
func renderChart(t *testing.T, ns string, values map[string]any) objects {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	opts := chartutil.ReleaseOptions{Name: "kube-apicache", Namespace: ns, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	objs := objects{}
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			objs.add(t, name, doc)
		}
	}
	return objs
}

// renderKustomize renders the base with components (names under
// manifests/components) in an overlay, as an operator's would use them.
func renderKustomize(t *testing.T, components ...string) objects {
	t.Helper()
	// kustomize refuses an overlay inside its base, and a base named by
	// an absolute path: a directory of its own here, naming the base and
	// the components by relative paths. Go ignores names starting with _.
	overlay, err := os.MkdirTemp(".", "_overlay.")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(overlay) })
	base := filepath.Join("..", manifestsDir)
	k := "resources: [" + base + "]\n"
	if len(components) > 0 {
		k += "components:\n"
		for _, c := range components {
			k += "  - " + filepath.Join(base, "components", c) + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize with %q: %v", components, err)
	}
	objs := objects{}
	for _, r := range m.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		objs.add(t, "kustomize "+r.CurId().String(), string(doc))
	}
	return objs
}

// mustJSON is obj as JSON.
func mustJSON(t *testing.T, obj map[string]any) string {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
