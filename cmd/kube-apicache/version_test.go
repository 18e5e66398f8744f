package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kube-apicache/kube-apicache/agent/version"
)

// runCommand runs the kube-apicache command with args and returns what it
// printed and its error.
func runCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestVersion: `kube-apicache version` and `kube-apicache --version`
// print version.Get() on one line, `version -o json` prints it whole as
// JSON, and an unknown output format is an error naming the flag.
func TestVersion(t *testing.T) {
	want := version.Get()
	if !strings.HasPrefix(want.String(), "kube-apicache "+want.GitVersion) || !strings.Contains(want.String(), want.GoVersion) {
		t.Errorf("version.Get().String() = %q, want the version and the Go version", want.String())
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := runCommand(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if out != want.String()+"\n" {
			t.Errorf("%v printed %q, want %q", args, out, want.String()+"\n")
		}
	}

	out, err := runCommand(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got version.Info
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("version -o json printed %q: %v", out, err)
	}
	if got != want {
		t.Errorf("version -o json = %+v, want %+v", got, want)
	}
	for _, field := range []string{`"gitVersion"`, `"gitCommit"`, `"goVersion"`, `"platform"`} {
		if !strings.Contains(out, field) {
			t.Errorf("version -o json has no %s: %s", field, out)
		}
	}

	out, err = runCommand(t, "version", "-o", "yaml")
	if err == nil || !strings.Contains(err.Error(), `--output "yaml"`) {
		t.Errorf("version -o yaml = %v (printed %q), want an error naming --output", err, out)
	}
}
