package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// claimers are the calls that claim a test for this shard (claim, and the
// helpers that call it first thing).
var claimers = map[string]bool{"claim": true, "requireCluster": true, "requireBinaries": true, "requireRealNode": true}

// TestEveryTestClaims: in a sharded run a test that claims nothing runs in
// every shard, and one whose subtests claim (t.Run before the claim) is
// skipped in all shards but one while its own body, figures included, runs
// in each. So every test of the suite claims itself before its first
// subtest: directly, or through a doTest helper that does.
func TestEveryTestClaims(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("test files: %v, %v", files, err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" || fn.Name.Name == "TestEveryTestClaims" {
				continue
			}
			checked++
			if !claimsFirst(fn.Body) {
				t.Errorf("%s (%s): calls no claim (requireCluster, requireBinaries, requireRealNode, claim or a doTest helper) before its first t.Run",
					fn.Name.Name, fset.Position(fn.Pos()))
			}
		}
	}
	if checked < 40 {
		t.Errorf("checked %d tests, want the whole suite", checked)
	}
}

// claimsFirst reports whether body calls a claimer (or a doTest helper)
// before any t.Run, in source order.
func claimsFirst(body *ast.BlockStmt) bool {
	claimed, ran := false, false
	ast.Inspect(body, func(n ast.Node) bool {
		if claimed || ran {
			return false
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch f := call.Fun.(type) {
		case *ast.Ident:
			if claimers[f.Name] || strings.HasPrefix(f.Name, "doTest") {
				claimed = true
			}
		case *ast.SelectorExpr:
			if f.Sel.Name == "Run" {
				if x, ok := f.X.(*ast.Ident); ok && x.Name == "t" {
					ran = true
				}
			}
		}
		return true
	})
	return claimed
}
