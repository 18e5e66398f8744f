package metricsserver

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the listener knows nothing of the components it serves.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/internal/metricsserver", "agent/internal/apihttp", "agent/internal/keypair")
}
