package rewrite

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the rewriter is a library over JSON. It knows nothing of
// the agent's other parts and imports no HTTP: the handlers that use it
// are the ones that decide what to rewrite.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/rewrite", "agent/apis/rewrite/v1alpha1", "agent/apis/internal/kindfile")

	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	out, err := exec.Command(goBin, "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp == "net/http" || strings.HasPrefix(imp, "net/http/") {
			t.Errorf("imports %s", imp)
		}
	}
}
