// Package e2e runs kube-apicache against a sandbox cluster built from real
// parts (see package sandbox): a real kube-apiserver, etcd and
// kube-controller-manager, the kernel's netfilter in network namespaces, and
// unmodified kubectl and client-go clients in pods.
//
// The suite needs root. Without it the tests skip with a message, except
// under CI=true, where they fail: CI must never pass by skipping them.
//
// The shared cluster starts with the first test that asks for it
// (requireCluster), so a run of the real-node scenarios alone, which bring
// their own sandboxes, never starts it. Several test processes can share
// the suite (shards, see claim): each has its own sandbox, and each test
// runs in exactly one of them.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

var (
	// cluster is shared by the tests of this process; nil until the first
	// requireCluster, and when it cannot run (skipReason says why).
	cluster     *sandbox.Cluster
	clusterOnce sync.Once
	// skipReason says why the suite cannot run.
	skipReason string
	// Binaries built for the suite, in binTmp.
	agentBin, podclientBin, widgetopBin, binTmp string
	// binDir holds the control-plane binaries.
	binDir string
)

// Sharding: with KUBE_APICACHE_E2E_CLAIMS naming a directory shared by
// several test processes (make test's shards), a test runs in the process
// that claims it first and is skipped in the others, so the processes
// share the suite as a work queue, in source order. Tests that must not
// overlap with each other (the real node, whose kubelet and containerd
// use host paths) claim one group name together and so run one after
// another in one process. KUBE_APICACHE_E2E_SHARD names this process in
// the skip messages.
const (
	claimsEnv = "KUBE_APICACHE_E2E_CLAIMS"
	shardEnv  = "KUBE_APICACHE_E2E_SHARD"
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

// setUp checks what every test needs and builds the binaries; the shared
// cluster starts later (startCluster).
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
	agentBin, podclientBin, widgetopBin = bins.Agent, bins.PodClient, bins.Widgetop
	return nil
}

// startCluster starts the shared cluster, once.
func startCluster() {
	if skipReason != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := sandbox.Start(ctx, sandbox.Options{
		BinDir:     binDir,
		APIServers: 2,
		Logf:       func(f string, a ...any) { fmt.Fprintf(os.Stderr, "e2e: "+f+"\n", a...) },
	})
	if err != nil {
		skipReason = "starting the shared cluster: " + err.Error()
		return
	}
	cluster = c
}

// requireCluster claims the test (see claim) and returns the shared
// cluster, starting it on first use; it skips (or, under CI, fails) the
// test when the suite cannot run.
func requireCluster(t *testing.T) *sandbox.Cluster {
	t.Helper()
	requireBinaries(t)
	clusterOnce.Do(startCluster)
	if cluster == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sandbox unavailable under CI: %s", skipReason)
		}
		t.Skipf("sandbox unavailable: %s", skipReason)
	}
	return cluster
}

// requireBinaries claims the test and skips (or, under CI, fails) it when
// the suite's binaries could not be built: for tests that start sandboxes
// of their own.
func requireBinaries(t *testing.T) {
	t.Helper()
	claim(t, topLevel(t))
	if agentBin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("e2e suite unavailable under CI: %s", skipReason)
		}
		t.Skipf("e2e suite unavailable: %s", skipReason)
	}
}

// claim skips t unless this process holds group: the first process of a
// sharded run to ask for a group holds it for the rest of the run. Without
// KUBE_APICACHE_E2E_CLAIMS every group is this process's.
func claim(t *testing.T, group string) {
	t.Helper()
	dir := os.Getenv(claimsEnv)
	if dir == "" {
		return
	}
	self := os.Getenv(shardEnv)
	if self == "" {
		self = fmt.Sprint(os.Getpid())
	}
	path := filepath.Join(dir, strings.ReplaceAll(group, "/", "_"))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		_, err = f.WriteString(self)
		err = errors.Join(err, f.Close())
		if err != nil {
			t.Fatalf("claiming %s: %v", group, err)
		}
		return
	}
	if !errors.Is(err, os.ErrExist) {
		t.Fatalf("claiming %s: %v", group, err)
	}
	// The holder writes its name right after creating the file: wait for
	// it rather than read an empty file.
	var owner []byte
	for range 100 {
		if owner, err = os.ReadFile(path); err == nil && len(owner) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if string(owner) != self {
		t.Skipf("run by e2e shard %s", owner)
	}
}

// topLevel is the name of t's top-level test.
func topLevel(t *testing.T) string {
	name, _, _ := strings.Cut(t.Name(), "/")
	return name
}

// dumpOnFailure prints the sandbox's process logs if t fails.
func dumpOnFailure(t *testing.T, c *sandbox.Cluster) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sandbox logs:\n%s", c.Logs(40))
		}
	})
}
