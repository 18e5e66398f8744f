package v1alpha1

import (
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/internal/depstest"
)

// TestImports: the file format depends on no part of the agent.
func TestImports(t *testing.T) {
	depstest.Only(t, "agent/apis/rewrite/v1alpha1", "agent/apis/internal/kindfile")
}
