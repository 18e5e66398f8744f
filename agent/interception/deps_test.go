package interception

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports: the interception reaches the node through netrules and the
// API through client-go, never through the agent's serving, upstream or
// cache code.
func TestImports(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const module = "github.com/kube-apicache/kube-apicache/"
	allowed := map[string]bool{
		module + "agent/interception":         true,
		module + "agent/apis/config/v1alpha1": true,
		module + "netrules":                   true,
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, module) && !allowed[dep] {
			t.Errorf("package interception depends on %s", dep)
		}
	}
}
