package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/rewriting"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// TestRewriteIdleProfile: the rewrite idle case's profile loads and
// passes the checks an agent makes of it on its own, and selects its
// ServiceAccount but neither the bench's client pod nor the agent.
func TestRewriteIdleProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rewrite-idle.yaml")
	if err := os.WriteFile(path, []byte(rewriteIdleProfile), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := rewriting.Load(path)
	if err != nil {
		t.Fatalf("the profile does not load: %v", err)
	}
	if len(p.Rewriters) != 1 {
		t.Fatalf("%d profiles, want 1", len(p.Rewriters))
	}
	if p.Rewriters.For("system:serviceaccount:e2e-bench-none:nobody") == nil {
		t.Errorf("the profile does not select %s", rewriteProfileSelects)
	}
	for _, user := range []string{"system:serviceaccount:" + benchNS + ":bench-client", sandbox.AgentUsername()} {
		if p.Rewriters.For(user) != nil {
			t.Errorf("the profile selects %s", user)
		}
	}
}
