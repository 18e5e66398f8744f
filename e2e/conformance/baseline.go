package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The direct run's results depend only on kube-apiserver and the suite,
// not on the agent: a direct run is kept, keyed by a stamp of everything
// that decides it, and reused while the stamp matches, as the builds are.
// The agent run always runs.

// baselineFile is the JSON file a kept direct run is stored in.
const baselineFile = "direct-result.json"

// keptRun is a direct run as stored.
type keptRun struct {
	Stamp    string
	Recorded time.Time
	Result   *RunResult
}

// defaultBaselineDir is beside the build caches of hack/.
func defaultBaselineDir() string {
	if d := os.Getenv("KUBE_APICACHE_CACHE_DIR"); d != "" {
		return filepath.Join(d, "conformance")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "kube-apicache", "conformance")
}

// baselineStamp hashes what a direct run's results depend on: the suite
// and control-plane binaries, the selected specs and the number of ginkgo
// processes, and the sources of this program, the sandbox and the Go
// module (the clients the sandbox uses).
func baselineStamp(binDir string, selected []string, procs int) (string, error) {
	h := sha256.New()
	var files []string
	for _, b := range []string{"e2e.test", "ginkgo", "kube-apiserver", "kube-controller-manager", "etcd"} {
		files = append(files, filepath.Join(binDir, b))
	}
	root := sandbox.RepoRoot()
	for _, pattern := range []string{"e2e/conformance/*.go", "e2e/conformance/specs.txt", "e2e/sandbox/*.go", "go.mod", "go.sum"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return "", err
		}
		sort.Strings(m)
		for _, f := range m {
			if !strings.HasSuffix(f, "_test.go") {
				files = append(files, f)
			}
		}
	}
	for _, f := range files {
		if err := hashFile(h, f); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(h, "procs=%d\n", procs)
	for _, s := range selected {
		fmt.Fprintf(h, "spec=%s\n", s)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(h, "file=%s\n", filepath.Base(path))
	_, err = io.Copy(h, f)
	return err
}

// loadBaseline returns the kept direct run for stamp, or nil when there is
// none (or it cannot be read, which only costs a new run).
func loadBaseline(dir, stamp string) *keptRun {
	b, err := os.ReadFile(filepath.Join(dir, stamp, baselineFile))
	if err != nil {
		return nil
	}
	var k keptRun
	if json.Unmarshal(b, &k) != nil || k.Stamp != stamp || k.Result == nil || len(k.Result.Results) == 0 {
		return nil
	}
	return &k
}

// saveBaseline keeps a direct run for stamp, replacing any kept run
// atomically.
func saveBaseline(dir, stamp string, res *RunResult) error {
	if res == nil || len(res.Results) == 0 {
		return errors.New("no spec results to keep")
	}
	b, err := json.MarshalIndent(keptRun{Stamp: stamp, Recorded: time.Now().UTC(), Result: res}, "", " ")
	if err != nil {
		return err
	}
	d := filepath.Join(dir, stamp)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(d, baselineFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d, baselineFile))
}
