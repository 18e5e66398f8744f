package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"

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

// TestLoggingFlags: the logging flags are component-base's: -v, --vmodule
// and --logging-format (text or json); the klog flags Kubernetes dropped
// are unknown, and an unknown format is a one-line error.
func TestLoggingFlags(t *testing.T) {
	reset := func() {
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Fatal(err)
		}
	}
	reset()
	t.Cleanup(reset)
	for _, flag := range []string{"--logtostderr", "--alsologtostderr", "--log-dir=/tmp", "--log_dir=/tmp", "--log_file=x.log", "--log-file=x.log", "--one_output", "--skip_headers", "--add_dir_header", "--stderrthreshold=0"} {
		if _, err := runCommand(t, "version", flag); err == nil || !strings.Contains(err.Error(), "unknown flag") {
			t.Errorf("version %s: error %v, want an unknown flag", flag, err)
		}
	}
	if _, err := runCommand(t, "version", "--logging-format=xml"); err == nil || !strings.Contains(err.Error(), "Unsupported log format") || strings.Contains(oneLine(err), "\n") {
		t.Errorf("--logging-format=xml: error %v, want an unsupported format", err)
	}
	reset()
	out, err := runCommand(t, "version", "--logging-format=json", "-v=3")
	if err != nil || out != version.Get().String()+"\n" {
		t.Errorf("version --logging-format=json -v=3 = %q, %v; want the version", out, err)
	}
	reset()
	if _, err := runCommand(t, "version", "--vmodule=config=4", "-v=1"); err != nil {
		t.Errorf("-v and --vmodule: %v", err)
	}
}
