package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSplitManifest: a rendered manifest splits into its objects in
// order, and the objects a filter keeps join into a manifest that splits
// back into the same ones.
func TestSplitManifest(t *testing.T) {
	rendered := []byte(`apiVersion: v1
kind: Namespace
metadata:
  name: kube-apicache
---
apiVersion: v1
data:
  config.yaml: |
    apiVersion: kube-apicache.io/v1alpha1
    kind: AgentConfiguration
kind: ConfigMap
metadata:
  name: kube-apicache-config
  namespace: kube-apicache
---
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-apicache
  namespace: kube-apicache
`)
	objs, err := SplitManifest(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.Kind+" "+o.Namespace+"/"+o.Name)
	}
	want := []string{"Namespace /kube-apicache", "ConfigMap kube-apicache/kube-apicache-config", "DaemonSet kube-apicache/kube-apicache"}
	if !slices.Equal(got, want) {
		t.Fatalf("objects %q, want %q", got, want)
	}

	path := filepath.Join(t.TempDir(), "part.yaml")
	n, err := JoinManifest(path, objs, func(o ManifestObject) bool { return o.Kind != "DaemonSet" })
	if err != nil || n != 2 {
		t.Fatalf("JoinManifest wrote %d objects (%v), want 2", n, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := SplitManifest(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0].Name != "kube-apicache" || again[1].Name != "kube-apicache-config" ||
		!bytes.Equal(bytes.TrimSpace(again[1].YAML), bytes.TrimSpace(objs[1].YAML)) {
		t.Errorf("joined and split again: %+v", again)
	}

	if _, err := SplitManifest([]byte("apiVersion: v1\nkind: ConfigMap\n")); err == nil {
		t.Error("a document without a name split without an error")
	}
}
