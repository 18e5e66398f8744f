package sandbox

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// RepoRoot is the root of the kube-apicache source tree.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Binaries are the programs the sandbox runs besides the control plane.
type Binaries struct {
	Agent     string // kube-apicache
	PodClient string // the in-pod client-go program
}

// BuildBinaries builds the agent and the pod client into dir.
func BuildBinaries(dir string) (Binaries, error) {
	b := Binaries{Agent: filepath.Join(dir, "kube-apicache"), PodClient: filepath.Join(dir, "podclient")}
	for bin, pkg := range map[string]string{b.Agent: "./cmd/kube-apicache", b.PodClient: "./e2e/podclient"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("building %s: %v: %s", pkg, err, out)
		}
	}
	return b, nil
}

// DefaultBinDir is where `make control-plane` puts etcd, kube-apiserver and
// kube-controller-manager.
func DefaultBinDir() string {
	return filepath.Join(RepoRoot(), "_output", "bin")
}
