package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReleaseScript runs hack/release.sh end to end on a small image (the
// fake agent image, as `make image` would leave it) instead of building
// the real one, with a fake Helm chart: every artefact is there, the
// manifests and the chart pin the image's digest, and SHA256SUMS holds.
func TestReleaseScript(t *testing.T) {
	kubectl := os.Getenv("KUBECTL")
	if kubectl == "" {
		kubectl = "kubectl"
	}
	for _, tool := range []string{kubectl, "git", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
	if _, err := exec.Command("git", "rev-parse", "--verify", "HEAD").Output(); err != nil {
		t.Skip("not a git checkout:", err)
	}

	p := platforms["linux/amd64"]
	ref := imageRef{Name: "registry.example/kube-apicache:v0.1.0", Tag: "v0.1.0"}
	img, in := fakeAgentImage(t, p)
	images := t.TempDir()
	if err := writeSBOM(filepath.Join(images, sbomFile("kube-apicache.oci.tar", p)), in, ref, p, img); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if _, err := writeArchive(filepath.Join(images, "kube-apicache.oci.tar"), work, []platformImage{{Platform: p, Image: img}}, ref); err != nil {
		t.Fatal(err)
	}
	chart := t.TempDir()
	mkfile(t, filepath.Join(chart, "Chart.yaml"), []byte("apiVersion: v2\nname: kube-apicache\nversion: 0.0.0\n"), 0o644)
	mkfile(t, filepath.Join(chart, "values.yaml"), []byte("image:\n  repository: kube-apicache\n  tag: \"\"\n  digest: \"\"\n  pullPolicy: IfNotPresent\n"), 0o644)

	out := filepath.Join(t.TempDir(), "v0.1.0")
	release := func(version string) (string, error) {
		cmd := exec.Command("../release.sh", version)
		cmd.Env = append(os.Environ(),
			"GO="+filepath.Join(runtime.GOROOT(), "bin", "go"),
			"KUBECTL="+kubectl,
			"IMAGE_REPO=registry.example/kube-apicache",
			"CHART_DIR="+chart,
			"RELEASE_DIR="+out,
			"KUBE_APICACHE_RELEASE_IMAGES="+images,
			"KUBE_APICACHE_RELEASE_DIRTY=1",
		)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}

	for _, bad := range []string{"0.1.0", "v0.1", "v0.1.0-rc.1", "v01.0.0"} {
		if output, err := release(bad); err == nil || strings.Count(strings.TrimSpace(output), "\n") > 0 || !strings.Contains(output, "vX.Y.Z") {
			t.Errorf("release %q: %v, %q; want one line of error naming vX.Y.Z", bad, err, output)
		}
	}

	output, err := release("v0.1.0")
	if err != nil {
		t.Fatalf("release.sh v0.1.0: %v\n%s", err, output)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	want := []string{
		"SHA256SUMS",
		"kube-apicache-0.1.0.tgz",
		"kube-apicache-monitoring-v0.1.0.yaml",
		"kube-apicache-v0.1.0.linux-amd64.spdx.json",
		"kube-apicache-v0.1.0.oci.tar",
		"kube-apicache-v0.1.0.yaml",
		"release-notes.md",
	}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Fatalf("release files (-want +got):\n%s", diff)
	}

	digest, err := img.Digest() // one platform: index.json names the image
	if err != nil {
		t.Fatal(err)
	}
	pinned := "registry.example/kube-apicache:v0.1.0@" + digest.String()
	manifests, err := os.ReadFile(filepath.Join(out, "kube-apicache-v0.1.0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(manifests), "image: "+pinned+"\n"); n != 2 {
		t.Errorf("the manifests name %s %d times, want 2 (the agents and the approver)", pinned, n)
	}
	values := readTgz(t, filepath.Join(out, "kube-apicache-0.1.0.tgz"))["kube-apicache/values.yaml"]
	if !strings.Contains(values, `digest: "`+digest.String()+`"`) || !strings.Contains(values, `tag: "v0.1.0"`) {
		t.Errorf("chart values do not pin the image:\n%s", values)
	}
	notes, err := os.ReadFile(filepath.Join(out, "release-notes.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(notes), "# kube-apicache v0.1.0\n\nCommit: ") || !strings.Contains(string(notes), "Image: "+pinned+"\n") || !strings.Contains(string(notes), "### Added") {
		t.Errorf("release-notes.md:\n%.600s", notes)
	}

	// SHA256SUMS: every other file, each sum right.
	sums, err := os.Open(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer sums.Close()
	var summed []string
	sc := bufio.NewScanner(sums)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		if got, err := fileSHA256(filepath.Join(out, name)); err != nil || got != sum {
			t.Errorf("%s: sha256 %s (%v), SHA256SUMS says %s", name, got, err, sum)
		}
		summed = append(summed, name)
	}
	if diff := cmp.Diff(slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "SHA256SUMS" }), summed); diff != "" {
		t.Errorf("files in SHA256SUMS (-want +got):\n%s", diff)
	}
}
