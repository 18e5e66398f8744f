package upstream

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the upstream set knows nothing of the redirect, of serving
// or of the cache; the socket mark comes as a dial Control.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/upstream", "agent/identity", "agent/internal/apihttp", "agent/internal/keypair")
}
