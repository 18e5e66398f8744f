package serving

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports: serving reaches the node's netfilter state only through
// the funcs it is given, never through netrules or the interception.
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
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case module + "netrules", module + "agent/interception", module + "agent":
			t.Errorf("package serving depends on %s", dep)
		}
	}
}
