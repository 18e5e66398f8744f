package main

import (
	"os"
	"path/filepath"
	"testing"
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
