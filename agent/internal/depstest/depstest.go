// Package depstest checks, from a package's own tests, which packages of
// this module it depends on: the rules that keep the agent's parts apart
// are tests, not conventions.
package depstest

import (
	"os/exec"
	"strings"
	"testing"
)

// Module is the import path prefix of this module's packages.
const Module = "github.com/kube-apicache/kube-apicache/"

// Deps returns the packages of this module that the package in the test's
// working directory depends on, itself included (go list -deps). It skips
// the test where there is no go command.
func Deps(t *testing.T) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the imports with")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var deps []string
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, Module) {
			deps = append(deps, strings.TrimPrefix(dep, Module))
		}
	}
	return deps
}

// Only fails the test for every package of this module the package under
// test depends on that is not in allowed (paths below the module).
func Only(t *testing.T, allowed ...string) {
	t.Helper()
	ok := map[string]bool{}
	for _, a := range allowed {
		ok[a] = true
	}
	for _, dep := range Deps(t) {
		if !ok[dep] {
			t.Errorf("depends on %s", dep)
		}
	}
}

// None fails the test for every package in forbidden (paths below the
// module) the package under test depends on.
func None(t *testing.T, forbidden ...string) {
	t.Helper()
	no := map[string]bool{}
	for _, f := range forbidden {
		no[f] = true
	}
	for _, dep := range Deps(t) {
		if no[dep] {
			t.Errorf("depends on %s", dep)
		}
	}
}
