package status

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports: the listener learns of the rest of the agent through Checks
// and the registry it is given, never by importing the interceptor, the
// upstream set, the serving chain, the cache or netrules.
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
		module + "agent/status":           true,
		module + "agent/version":          true,
		module + "agent/internal/apihttp": true,
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, module) && !allowed[dep] {
			t.Errorf("package status depends on %s", dep)
		}
	}
}
