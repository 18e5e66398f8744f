package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// TestDemo runs the README's `make demo` program on its real-node path, as
// a new user does: given a sandbox with a real node, when the demo installs
// the shipped manifests with kubectl and runs its client pods, then it
// exits 0 (it fails on its own when a node-local list or the watch-list
// informers' initial state is not answered from the cache), and it prints
// the cache hits, the latency side by side and the reads kept off
// kube-apiserver. The demo brings its own sandbox and real node, so it is
// in the real-node group.
func TestDemo(t *testing.T) {
	images := requireRealNode(t)
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "demo")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./e2e/demo")
	build.Dir = sandbox.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, "--duration=1s", "--bin-dir", realNodeBinDir(), "--images-dir", filepath.Dir(images[0]))
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the demo failed after %s: %v\n%s", took.Round(time.Second), err, out)
	}
	text := string(out)
	for _, want := range []string{
		"agent pod Ready",
		"pods hit",
		"reads answered on the node for",
		"Latency:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, text)
		}
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "reads answered on the node for") || strings.Contains(l, "agent pod Ready") {
			figuref(t, "demo: %s", strings.TrimSpace(l))
		}
	}
	figuref(t, "demo: exited 0 in %s", took.Round(time.Second))
}
