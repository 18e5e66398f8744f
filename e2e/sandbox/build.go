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
	Widgetop  string // the sample operator of the API rewriting test
}

// BuildBinaries builds the agent, the pod client and the sample operator
// into dir.
func BuildBinaries(dir string) (Binaries, error) {
	b := Binaries{
		Agent:     filepath.Join(dir, "kube-apicache"),
		PodClient: filepath.Join(dir, "podclient"),
		Widgetop:  filepath.Join(dir, "widgetop"),
	}
	for bin, pkg := range map[string]string{
		b.Agent:     "./cmd/kube-apicache",
		b.PodClient: "./e2e/podclient",
		b.Widgetop:  "./e2e/widgetop",
	} {
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
