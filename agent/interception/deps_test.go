package interception

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the interception reaches the node through netrules and the
// API through client-go (reading refusals of node impersonation as the
// cache does, through internal/nodeimpersonation), never through the
// agent's serving, upstream or cache code.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/interception", "agent/apis/config/v1alpha1", "agent/apis/internal/kindfile", "netrules", "internal/nodeimpersonation")
}
