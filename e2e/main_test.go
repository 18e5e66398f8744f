// Package e2e runs kube-apicache against a sandbox cluster built from real
// parts (see package sandbox): a real kube-apiserver, etcd and
// kube-controller-manager, the kernel's netfilter in network namespaces, and
// unmodified kubectl and client-go clients in pods.
//
// The suite needs root. Without it the tests skip with a message, except
// under CI=true, where they fail: CI must never pass by skipping them.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

var (
	// cluster is shared by the whole suite; nil when the suite cannot run.
	cluster *sandbox.Cluster
	// skipReason says why the suite cannot run.
	skipReason string
	// Binaries built for the suite, in binTmp.
	agentBin, podclientBin, binTmp string
	// binDir holds the control-plane binaries.
	binDir string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if err := setUp(); err != nil {
		skipReason = err.Error()
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "e2e: cannot run under CI: %s\n", skipReason)
			return 1
		}
		fmt.Fprintf(os.Stderr, "e2e: skipping the sandbox suite: %s\n", skipReason)
	}
	// Tear the sandbox down on Ctrl-C and SIGTERM too.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "e2e: interrupted; tearing down the sandbox")
		sandbox.StopAll()
		os.Exit(130)
	}()
	code := m.Run()
	if err := writeFigures(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: writing figures: %v\n", err)
		code = 1
	}
	if binTmp != "" {
		_ = os.RemoveAll(binTmp)
	}
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", err)
			code = 1
		}
	}
	return code
}

func setUp() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root for network namespaces and iptables (run as root, or with CI=true to make this an error)")
	}
	binDir = os.Getenv("KUBE_APICACHE_BIN_DIR")
	if binDir == "" {
		binDir = sandbox.DefaultBinDir()
	}
	var err error
	if binTmp, err = os.MkdirTemp("", "kube-apicache-e2e-bin-"); err != nil {
		return err
	}
	bins, err := sandbox.BuildBinaries(binTmp)
	if err != nil {
		return err
	}
	agentBin, podclientBin = bins.Agent, bins.PodClient
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err = sandbox.Start(ctx, sandbox.Options{
		BinDir:     binDir,
		APIServers: 2,
		Logf:       func(f string, a ...any) { fmt.Fprintf(os.Stderr, "e2e: "+f+"\n", a...) },
	})
	return err
}

// requireCluster skips (or, under CI, fails) a test when the suite cannot run.
func requireCluster(t *testing.T) *sandbox.Cluster {
	t.Helper()
	if cluster == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sandbox unavailable under CI: %s", skipReason)
		}
		t.Skipf("sandbox unavailable: %s", skipReason)
	}
	return cluster
}

// dumpOnFailure prints the sandbox's process logs if t fails.
func dumpOnFailure(t *testing.T, c *sandbox.Cluster) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sandbox logs:\n%s", c.Logs(40))
		}
	})
}
