package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/audit"
	"github.com/kube-apicache/kube-apicache/agent/serving"
)

// writeTestConfig writes an AgentConfiguration with body and returns its
// path.
func writeTestConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	doc := "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\n" + body
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Given a file that sets the fail-open timeout, when the command line sets
// it by its deprecated name, then the command line wins, as with the new
// name.
func TestConfigDeprecatedNameWins(t *testing.T) {
	path := writeTestConfig(t, "interception:\n  failOpenTimeout: 5s\n")
	for _, arg := range []string{"--liveness-timeout=3s", "--fail-open-timeout=3s"} {
		fs := newCommand().Flags()
		if err := fs.Parse([]string{arg}); err != nil {
			t.Fatal(err)
		}
		if _, err := (&configFile{path: path}).apply(fs); err != nil {
			t.Fatal(err)
		}
		if got := fs.Lookup("fail-open-timeout").Value.String(); got != "3s" {
			t.Errorf("%s and a file with 5s: fail-open timeout %s, want the command line's 3s", arg, got)
		}
	}
}

// Given a file that sets the shutdown grace period and the sync period,
// when the command line sets the first too, then the command line wins
// and a warning names the flag, the field and both values; the field the
// command line left alone is not reported.
func TestConfigOverrideWarned(t *testing.T) {
	path := writeTestConfig(t, "interception:\n  shutdownGracePeriod: 20s\n  syncPeriod: 5s\n")
	logger, buf := ktestingLogger(t)
	klog.SetLogger(logger)
	defer klog.ClearLogger()
	fs := newCommand().Flags()
	if err := fs.Parse([]string{"--shutdown-grace-period=30s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := (&configFile{path: path}).apply(fs); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("shutdown-grace-period").Value.String(); got != "30s" {
		t.Errorf("shutdown grace period %s, want the command line's 30s", got)
	}
	logged := buf.String()
	for _, want := range []string{"a command-line flag overrides the configuration file", `flag="--shutdown-grace-period"`,
		`field="interception.shutdownGracePeriod"`, `flagValue="30s"`, `fileValue="20s"`} {
		if !strings.Contains(logged, want) {
			t.Errorf("log lacks %s:\n%s", want, logged)
		}
	}
	if strings.Contains(logged, "sync-period") || strings.Count(logged, "overrides the configuration file") != 1 {
		t.Errorf("want one warning, for --shutdown-grace-period only:\n%s", logged)
	}
}

// Given a main file and a directory of drop-ins, when the agent and the
// approver read them, then each reads the merged configuration: a later
// drop-in wins over an earlier one and over the main file, and the
// approver takes the drop-ins' cluster section too.
func TestConfigDropIns(t *testing.T) {
	path := writeTestConfig(t, "cluster:\n  signerName: example.com/main\n  clusterDomain: example.internal\ncache:\n  asNode: true\n")
	dir := t.TempDir()
	for name, body := range map[string]string{
		"10-signer.yaml":   "cluster:\n  signerName: example.com/first\n",
		"20-signer.yaml":   "cluster:\n  signerName: example.com/second\n",
		"50-identity.yaml": "cache:\n  asNode: false\n",
	} {
		doc := "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\n" + body
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fs := newCommand().Flags()
	if _, err := (&configFile{path: path, dir: dir}).apply(fs); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"signer-name": "example.com/second", "cluster-domain": "example.internal", "cache-as-node": "false"} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("agent's --%s %q, want %q", flag, got, want)
		}
	}
	approver, _, err := newCommand().Find([]string{"approver"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&configFile{path: path, dir: dir, sections: approverSections}).apply(approver.Flags()); err != nil {
		t.Fatal(err)
	}
	if got := approver.Flags().Lookup("signer-name").Value.String(); got != "example.com/second" {
		t.Errorf("approver's --signer-name %q, want the last drop-in's", got)
	}

	// A mistake in one drop-in stops the command with an error naming it.
	bad := filepath.Join(dir, "30-bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ncache:\n  asnode: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = (&configFile{path: path, dir: dir}).apply(newCommand().Flags())
	if err == nil || !strings.Contains(err.Error(), bad+":") || !strings.Contains(err.Error(), `unknown field "cache.asnode"`) {
		t.Errorf("error %v, want one naming %s and the unknown field", err, bad)
	}
}

// ktestingLogger returns a logger that keeps what it logs, and that text.
func ktestingLogger(t *testing.T) (klog.Logger, interface{ String() string }) {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, logger.GetSink().(ktesting.Underlier).GetBuffer()
}

// Given a file with agent settings whose flags the approver and cleanup
// also have under the same names, when those commands read it, then only
// their sections apply: the agent's metrics address does not move the
// approver's own listener.
func TestConfigSectionsPerCommand(t *testing.T) {
	path := writeTestConfig(t, "cluster:\n  clusterDomain: example.internal\nmetrics:\n  bindAddress: 10.0.0.1:10445\n")
	root := newCommand()
	approver, _, err := root.Find([]string{"approver"})
	if err != nil {
		t.Fatal(err)
	}
	fs := approver.Flags()
	if _, err := (&configFile{path: path, sections: approverSections}).apply(fs); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("cluster-domain").Value.String(); got != "example.internal" {
		t.Errorf("approver's cluster domain %q, want the file's", got)
	}
	if got := fs.Lookup("metrics-bind-address").Value.String(); got != defaultApproverMetricsAddress {
		t.Errorf("approver's metrics address %q, want its own default %q", got, defaultApproverMetricsAddress)
	}
}

// Given the resolv.conf files the kubelet writes, the cluster domain is
// the svc.<domain> entry of the search path; files without one give none.
func TestClusterDomainFromResolvConf(t *testing.T) {
	for name, tc := range map[string]struct{ conf, want string }{
		"ClusterFirst":     {conf: "search kube-apicache.svc.example.internal svc.example.internal example.internal\nnameserver 10.96.0.10\noptions ndots:5\n", want: "example.internal"},
		"trailing dots":    {conf: "search default.svc.cluster.local. svc.cluster.local. cluster.local.\n", want: "cluster.local"},
		"host's own":       {conf: "nameserver 10.0.0.2\nsearch corp.example\n"},
		"no search":        {conf: "nameserver 10.0.0.2\n"},
		"invalid domain":   {conf: "search svc.UPPER_case\n"},
		"empty after svc.": {conf: "search svc.\n"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(path, []byte(tc.conf), 0o600); err != nil {
				t.Fatal(err)
			}
			got, ok := clusterDomainFromResolvConf(path)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("clusterDomainFromResolvConf = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// Every flag of the agent has a configuration field except those --help
// says are on the command line only: --node-name, --config, --version and
// the request limit, audit and logging flags.
func TestFlagsWithoutField(t *testing.T) {
	commandLineOnly := map[string]bool{"node-name": true, "config": true, "config-dir": true, "version": true}
	extra := pflag.NewFlagSet("extra", pflag.ContinueOnError)
	limits := serving.DefaultLimits()
	limits.AddFlags(extra)
	audit.NewOptions().AddFlags(extra)
	extra.VisitAll(func(f *pflag.Flag) { commandLineOnly[f.Name] = true })
	fields := configv1alpha1.Fields()
	cmd := newCommand()
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Deprecated == "" && !slices.Contains(fields, f.Name) && !commandLineOnly[f.Name] {
			t.Errorf("--%s has no configuration field, and --help does not say so", f.Name)
		}
	})
	if !strings.Contains(cmd.Long, "all but --node-name and the request limit, audit and\nlogging flags") {
		t.Errorf("--help no longer names the flags without a field; update this test with it:\n%s", cmd.Long)
	}
}
