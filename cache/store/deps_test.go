package store

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoHTTP: the store stays below serving. Its own files import
// no net/http; none of its dependencies is a serving or client package;
// and net/http reaches it only through apimachinery's runtime (whose
// util/runtime and util/net import it), as it reaches every package that
// uses runtime.Object. A new dependency that brings HTTP in fails here.
func TestImportsNoHTTP(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the package's dependencies")
	}
	list := func(args ...string) []string {
		t.Helper()
		out, err := exec.Command(goTool, append([]string{"list"}, args...)...).Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
			}
			t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}

	for _, imp := range list("-f", `{{join .Imports "\n"}}`, ".") {
		if imp == "net/http" || strings.HasPrefix(imp, "net/http/") {
			t.Errorf("package store imports %s", imp)
		}
	}

	self := list("-f", "{{.ImportPath}}", ".")[0]
	module := strings.TrimSuffix(self, "/cache/store")
	forbidden := []string{
		"net/http/httptest", "net/http/httputil",
		"k8s.io/apiserver/",
		"k8s.io/client-go/rest", "k8s.io/client-go/tools/", "k8s.io/client-go/transport",
		"k8s.io/client-go/discovery", "k8s.io/client-go/dynamic",
		"k8s.io/apimachinery/pkg/api/errors",
	}
	// The packages through which net/http reaches anything that uses
	// runtime.Object and client-go's scheme.
	viaRuntime := map[string]bool{
		"k8s.io/apimachinery/pkg/util/runtime":                true,
		"k8s.io/apimachinery/pkg/util/net":                    true,
		"k8s.io/apimachinery/pkg/runtime/serializer/protobuf": true,
		"golang.org/x/net/http2":                              true,
	}
	for _, line := range list("-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, ".") {
		pkg, imports, _ := strings.Cut(line, " ")
		if pkg != self && (pkg == module || strings.HasPrefix(pkg, module+"/")) {
			t.Errorf("package store depends on %s of this module", pkg)
		}
		for _, f := range forbidden {
			if pkg == strings.TrimSuffix(f, "/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(pkg, f)) {
				t.Errorf("package store depends on %s", pkg)
			}
		}
		for _, imp := range strings.Fields(imports) {
			if imp == "net/http" && !viaRuntime[pkg] && !strings.HasPrefix(pkg, "net/http/") {
				t.Errorf("net/http reaches package store through %s", pkg)
			}
		}
	}
}
