package serving

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: serving reaches the node's netfilter state only through
// the funcs it is given, never through netrules or the interception.
func TestImports(t *testing.T) {
	depstest.None(t, "netrules", "agent/interception", "agent")
}
