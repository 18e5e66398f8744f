package webhookproxy

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the webhook proxy is the rewriter behind an HTTP handler;
// it knows nothing of the agent's other parts.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/webhookproxy", "agent/rewrite", "agent/apis/rewrite/v1alpha1", "agent/apis/internal/kindfile", "agent/internal/keypair")
}
