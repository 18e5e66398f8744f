package status

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the listener learns of the rest of the agent through Checks
// and the registry it is given, never by importing the interceptor, the
// upstream set, the serving chain, the cache or netrules.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/status", "agent/version", "agent/internal/metricsserver", "agent/internal/apihttp", "agent/internal/keypair")
}
