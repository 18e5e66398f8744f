package helmtest

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// diffObjects says how the chart's objects differ from kustomize's, object
// by object: those only one of them renders, then a diff (-kustomize
// +chart) of each object both render differently. Empty: the same objects.
func diffObjects(kustomize, chart objects) string {
	var ids []string
	for k := range kustomize {
		ids = append(ids, k)
	}
	for k := range chart {
		if _, ok := kustomize[k]; !ok {
			ids = append(ids, k)
		}
	}
	sort.Strings(ids)
	var b strings.Builder
	for _, k := range ids {
		want, inK := kustomize[k]
		got, inC := chart[k]
		switch {
		case !inC:
			b.WriteString("only kustomize renders " + k + "\n")
		case !inK:
			b.WriteString("only the chart renders " + k + "\n")
		default:
			if d := cmp.Diff(want, got, multiline); d != "" {
				b.WriteString(k + " (-kustomize +chart):\n" + d)
			}
		}
	}
	return b.String()
}

// multiline compares strings of several lines line by line, so that a
// diff of a ConfigMap's file shows the lines that differ.
var multiline = cmp.FilterValues(func(x, y string) bool {
	return strings.Contains(x, "\n") || strings.Contains(y, "\n")
}, cmp.Transformer("lines", func(s string) []string { return strings.Split(s, "\n") }))

// The chart passes helm's linter, with its defaults and with every value
// that stands for a component turned on.
func TestLint(t *testing.T) {
	for name, values := range map[string]map[string]any{"defaults": nil, "everything": everything()} {
		t.Run(name, func(t *testing.T) {
			l := lint.All(chartDir, values, namespace, false)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}

// everything turns on every value of componentValues at once.
func everything() map[string]any {
	v := map[string]any{}
	for _, c := range componentValues {
		for k, x := range c.values {
			v[k] = x
		}
	}
	return v
}

// The chart's defaults render the same objects as the kustomize base.
func TestDefaultsMatchBase(t *testing.T) {
	base := renderKustomize(t)
	if len(base) < 20 {
		t.Fatalf("the base renders only %d objects", len(base))
	}
	if d := diffObjects(base, renderChart(t, namespace, nil)); d != "" {
		t.Errorf("the chart's defaults differ from `kubectl kustomize manifests/`:\n%s", d)
	}
}

// componentValues are the components under manifests/components with a
// chart equivalent, and the values that stand for each.
var componentValues = []struct {
	component string
	values    map[string]any
}{
	{"audit-logging", map[string]any{"audit": map[string]any{"enabled": true}}},
	{"bring-your-own-certificate", map[string]any{"certificate": map[string]any{"secretName": "kube-apicache-serving-tls"}}},
	{"eks-signer", map[string]any{"signerName": "beta.eks.amazonaws.com/app-serving"}},
	{"monitoring", map[string]any{"monitoring": map[string]any{"enabled": true}}},
	{"pilot", map[string]any{"pilot": map[string]any{"enabled": true}}},
	{"pre-1.36-identity", map[string]any{"pre136Identity": true}},
	{"rewriting", map[string]any{"rewriting": map[string]any{"enabled": true}}},
}

// withoutChartEquivalent are the components the chart does not offer,
// with the reason (docs/install/helm.md says the same).
var withoutChartEquivalent = map[string]string{
	"cilium-local-redirect": "moves the agents to another namespace and dataplane; render it with kustomize",
}

// Each component with a chart equivalent renders, over the base, the same
// objects as the chart with the values that stand for it; every component
// is either among them or listed as without one.
func TestComponentsMatchValues(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(manifestsDir, "components", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		c := filepath.Base(filepath.Dir(d))
		if _, ok := withoutChartEquivalent[c]; ok {
			continue
		}
		if !slices.ContainsFunc(componentValues, func(v struct {
			component string
			values    map[string]any
		}) bool {
			return v.component == c
		}) {
			t.Errorf("component %s has no chart value in componentValues, nor a reason in withoutChartEquivalent", c)
		}
	}
	for _, tc := range componentValues {
		t.Run(tc.component, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(manifestsDir, "components", tc.component)); err != nil {
				t.Fatal(err)
			}
			if d := diffObjects(renderKustomize(t, tc.component), renderChart(t, namespace, tc.values)); d != "" {
				t.Errorf("the chart with %v differs from the base with components/%s:\n%s", tc.values, tc.component, d)
			}
		})
	}
}

// Given a value changed from the default, the comparison finds the
// difference: the tests above would fail if the chart drifted.
func TestChangedValueDiffers(t *testing.T) {
	base := renderKustomize(t)
	for name, tc := range map[string]struct {
		values map[string]any
		// want are strings the difference names.
		want []string
	}{
		"image tag": {
			values: map[string]any{"image": map[string]any{"tag": "v9.9.9"}},
			want:   []string{"apps/DaemonSet kube-apicache/kube-apicache", "apps/Deployment kube-apicache/kube-apicache-approver", "kube-apicache:v9.9.9"},
		},
		"an agent resource": {
			values: map[string]any{"agent": map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "512Mi"}}}},
			want:   []string{"apps/DaemonSet kube-apicache/kube-apicache", "512Mi"},
		},
		"no quota": {
			values: map[string]any{"quota": map[string]any{"enabled": false}},
			want:   []string{"only kustomize renders core/ResourceQuota kube-apicache/kube-apicache-critical-pods"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := diffObjects(base, renderChart(t, namespace, tc.values))
			for _, w := range tc.want {
				if !strings.Contains(d, w) {
					t.Errorf("the difference does not name %q:\n%s", w, d)
				}
			}
		})
	}
}

// A digest pins the image of the agents and the approver alike.
func TestImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	objs := renderChart(t, namespace, map[string]any{"image": map[string]any{"repository": "registry.example/kube-apicache", "digest": digest}})
	for _, k := range []string{"apps/DaemonSet kube-apicache/kube-apicache", "apps/Deployment kube-apicache/kube-apicache-approver"} {
		if got := image(t, objs[k]); got != "registry.example/kube-apicache@"+digest {
			t.Errorf("%s: image %q", k, got)
		}
	}
}

// image is the first container's image of a workload.
func image(t *testing.T, obj map[string]any) string {
	t.Helper()
	c := container(t, obj)
	s, _ := c["image"].(string)
	return s
}

// container is the first container of a workload.
func container(t *testing.T, obj map[string]any) map[string]any {
	t.Helper()
	spec, _ := obj["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	cs, _ := pod["containers"].([]any)
	if len(cs) == 0 {
		t.Fatalf("no containers in %v", obj["metadata"])
	}
	c, _ := cs[0].(map[string]any)
	return c
}

// Given another release namespace, every namespaced object but the Role
// and RoleBinding in `default` moves there, and so do the references to
// it: the kill switch's ConfigMap, the agents' ServiceAccount as the
// approver and the bindings name it, and the PodMonitors' target.
func TestReleaseNamespace(t *testing.T) {
	const ns = "apicache-elsewhere"
	objs := renderChart(t, ns, map[string]any{"monitoring": map[string]any{"enabled": true}})
	for k, obj := range objs {
		meta := obj["metadata"].(map[string]any)
		n, _ := meta["namespace"].(string)
		if n == namespace || strings.Contains(mustJSON(t, obj), `"`+namespace+`/`) || strings.Contains(mustJSON(t, obj), "configMap: "+namespace+"/") {
			t.Errorf("%s still names namespace %s", k, namespace)
		}
	}
	cm := objs["core/ConfigMap "+ns+"/kube-apicache-config"]
	if cm == nil || !strings.Contains(cm["data"].(map[string]any)["config.yaml"].(string), "configMap: "+ns+"/kube-apicache-config") {
		t.Errorf("the configuration's interception.configMap does not name %s", ns)
	}
	if objs["core/Namespace /"+ns] == nil {
		t.Errorf("no Namespace %s", ns)
	}
}

// Configuration values become one drop-in after the components' ones.
func TestConfigValues(t *testing.T) {
	objs := renderChart(t, namespace, map[string]any{
		"pre136Identity": true,
		"config":         map[string]any{"cache": map[string]any{"pinnedResources": "pods,services"}},
	})
	data := objs["core/ConfigMap kube-apicache/kube-apicache-config"]["data"].(map[string]any)
	want := "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncache:\n  pinnedResources: pods,services\n"
	if diff := cmp.Diff(want, data["90-values.yaml"]); diff != "" {
		t.Errorf("90-values.yaml (-want +got):\n%s", diff)
	}
	var keys []string
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if diff := cmp.Diff([]string{"50-pre-1.36-identity.yaml", "90-values.yaml", "config.yaml"}, keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
}

// The values schema refuses a misspelt value or one of the wrong type,
// rather than ignoring it: a typo must not leave a component off.
func TestValuesSchema(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	opts := chartutil.ReleaseOptions{Name: "kube-apicache", Namespace: namespace, IsInstall: true}
	for name, tc := range map[string]struct {
		values map[string]any
		want   string
	}{
		"misspelt":               {values: map[string]any{"audit": map[string]any{"enable": true}}, want: "enable"},
		"unknown section":        {values: map[string]any{"pilots": map[string]any{"enabled": true}}, want: "pilots"},
		"wrong type":             {values: map[string]any{"pre136Identity": "yes"}, want: "pre136Identity"},
		"bad digest":             {values: map[string]any{"image": map[string]any{"digest": "latest"}}, want: "digest"},
		"rewriting as an object": {values: map[string]any{"rewriting": map[string]any{"config": map[string]any{"profiles": []any{}}}}, want: "config"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := chartutil.ToRenderValues(ch, tc.values, opts, chartutil.DefaultCapabilities)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// rewriting.config is the key rewrite.yaml of its ConfigMap as written,
// and the drop-in points the agents at where the DaemonSet mounts it.
func TestRewritingConfig(t *testing.T) {
	const config = "apiVersion: config.kube-apicache.io/v1alpha1\nkind: RewriteConfiguration\nprofiles:\n- name: mine\n"
	objs := renderChart(t, namespace, map[string]any{"rewriting": map[string]any{"enabled": true, "config": config}})
	cm := objs["core/ConfigMap kube-apicache/kube-apicache-rewrite"]
	if cm == nil {
		t.Fatal("no ConfigMap kube-apicache-rewrite")
	}
	if diff := cmp.Diff(config, cm["data"].(map[string]any)["rewrite.yaml"]); diff != "" {
		t.Errorf("rewrite.yaml (-want +got):\n%s", diff)
	}
	dropIn, _ := objs["core/ConfigMap kube-apicache/kube-apicache-config"]["data"].(map[string]any)["50-rewriting.yaml"].(string)
	if !strings.Contains(dropIn, "configFile: /etc/kube-apicache/rewrite/rewrite.yaml") {
		t.Errorf("50-rewriting.yaml does not name /etc/kube-apicache/rewrite/rewrite.yaml:\n%s", dropIn)
	}
	mounted := false
	for _, m := range container(t, objs["apps/DaemonSet kube-apicache/kube-apicache"])["volumeMounts"].([]any) {
		m := m.(map[string]any)
		mounted = mounted || (m["name"] == "rewrite" && m["mountPath"] == "/etc/kube-apicache/rewrite")
	}
	if !mounted {
		t.Error("the DaemonSet does not mount rewrite at /etc/kube-apicache/rewrite")
	}
	if objs := renderChart(t, namespace, nil); objs["core/ConfigMap kube-apicache/kube-apicache-rewrite"] != nil {
		t.Error("the defaults render kube-apicache-rewrite")
	}
}
