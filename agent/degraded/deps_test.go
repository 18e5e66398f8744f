package degraded

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: degraded mode reads the upstream set through an interface
// and answers no request: it depends on no serving, upstream or cache
// code.
func TestImports(t *testing.T) {
	depstest.None(t, "agent/serving", "agent/upstream", "cache", "agent")
}
