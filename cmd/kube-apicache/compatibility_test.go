package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// compatibilityRow is one row of the compatibility matrix in
// docs/install/requirements.md.
type compatibilityRow struct {
	dimension, value, status string
}

// tested says whether the row claims that the e2e suite runs it.
func (r compatibilityRow) tested() bool { return strings.HasPrefix(r.status, "**Tested**") }

// compatibilityMatrix returns the rows of the table under the
// "## Compatibility" heading of page.
func compatibilityMatrix(t *testing.T, page string) []compatibilityRow {
	t.Helper()
	_, section, ok := strings.Cut(page, "\n## Compatibility\n")
	if !ok {
		t.Fatal("docs/install/requirements.md has no ## Compatibility section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []compatibilityRow
	for line := range strings.Lines(section) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) != 5 || cells[0] != "" || cells[4] != "" {
			continue
		}
		r := compatibilityRow{strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2]), strings.TrimSpace(cells[3])}
		if r.dimension == "Dimension" || strings.HasPrefix(r.dimension, "---") {
			continue
		}
		rows = append(rows, r)
	}
	return rows
}

// kubeVersionRef is the Kubernetes release a build script pins.
var kubeVersionRef = regexp.MustCompile(`(?m)^KUBE_VERSION=(v\d+\.\d+\.\d+)$`)

// kubeModuleRef is the k8s.io/kubernetes an e2e tools module builds.
var kubeModuleRef = regexp.MustCompile(`(?m)^(?:require)?\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\b`)

// proxyModeRef is the kube-proxy mode an e2e scenario starts the real node
// with: startRealNodeSandbox(t, ctx, dir, images, "<mode>").
var proxyModeRef = regexp.MustCompile(`startRealNodeSandbox\(.*,\s*"([a-z]+)"\)`)

// TestCompatibilityMatrix keeps the compatibility matrix honest:
// the Kubernetes releases it marks tested are exactly those e2e/k8s pins
// (hack/test.sh runs the matrix scenario on each), the one it says the
// whole suite runs on is the release the e2e builds pin, and the
// kube-proxy modes it marks tested are exactly those the e2e suite runs a
// real kube-proxy in.
func TestCompatibilityMatrix(t *testing.T) {
	page, err := os.ReadFile("../../docs/install/requirements.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := compatibilityMatrix(t, string(page))

	pinned := map[string]bool{}
	b, err := os.ReadFile("../../hack/build-e2e-test.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := kubeVersionRef.FindSubmatch(b)
	if m == nil {
		t.Fatal("hack/build-e2e-test.sh pins no KUBE_VERSION")
	}
	pinned[string(m[1])] = true
	def, err := os.ReadFile("../../e2e/k8s/default")
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{filepath.Join("k8s", strings.TrimSpace(string(def))), filepath.Join("tools", "e2etest")} {
		b, err := os.ReadFile(filepath.Join("../../e2e", mod, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := kubeModuleRef.FindSubmatch(b)
		if m == nil {
			t.Fatalf("e2e/%s/go.mod requires no k8s.io/kubernetes", mod)
		}
		pinned[string(m[1])] = true
	}
	if len(pinned) != 1 {
		t.Fatalf("the build scripts and the e2e tools pin several Kubernetes versions: %v", pinned)
	}
	// Every release in e2e/k8s is tested (the default by the whole
	// suite, the others by the matrix scenario), and no other.
	releases, err := filepath.Glob("../../e2e/k8s/1.*/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, mod := range releases {
		b, err := os.ReadFile(mod)
		if err != nil {
			t.Fatal(err)
		}
		m := kubeModuleRef.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s requires no k8s.io/kubernetes", mod)
		}
		want = append(want, string(m[1]))
	}
	var testedKube []string
	for _, r := range rows {
		if r.dimension == "Kubernetes" && r.tested() {
			first, _, _ := strings.Cut(r.value, " ")
			testedKube = append(testedKube, first)
			if _, ok := pinned[first]; ok && !strings.Contains(r.status, "whole e2e suite") {
				t.Errorf("the matrix row of %s, the suite's release, does not say the whole e2e suite runs on it", first)
			}
		}
	}
	slices.Sort(want)
	slices.Sort(testedKube)
	if !slices.Equal(testedKube, want) {
		t.Errorf("the matrix marks Kubernetes %v tested; e2e/k8s pins %v", testedKube, want)
	}
	for v := range pinned {
		if !slices.Contains(testedKube, v) {
			t.Errorf("the e2e builds pin %s, which the matrix does not mark tested", v)
		}
	}

	var run []string
	sources, err := filepath.Glob("../../e2e/*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range sources {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range proxyModeRef.FindAllSubmatch(b, -1) {
			run = append(run, string(m[1]))
		}
	}
	slices.Sort(run)
	run = slices.Compact(run)
	if len(run) == 0 {
		t.Fatal("no e2e scenario starts a real kube-proxy (startRealNodeSandbox)")
	}
	var tested []string
	for _, r := range rows {
		if r.dimension != "kube-proxy" {
			continue
		}
		mode, _, _ := strings.Cut(r.value, " ")
		if r.tested() {
			tested = append(tested, mode)
		} else if slices.Contains(run, mode) {
			t.Errorf("the matrix does not mark kube-proxy %s tested, but the e2e suite runs it", r.value)
		}
	}
	slices.Sort(tested)
	if !slices.Equal(tested, run) {
		t.Errorf("the matrix marks kube-proxy modes %v tested; the e2e suite runs %v", tested, run)
	}
}
