package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// TestBadStartupInput checks that each kind of bad start-up input makes the
// agent exit non-zero with a one-line reason, without changing the node.
func TestBadStartupInput(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	garbage := filepath.Join(pod.Dir, "garbage.crt")
	if err := os.WriteFile(garbage, []byte("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		// occupy, if set, is an address the test listens on in the node
		// namespace while the agent starts.
		occupy string
		want   string
	}{{
		name: "unknown flag",
		args: c.AgentArgs(certFile, keyFile, "--no-such-flag"),
		want: "unknown flag: --no-such-flag",
	}, {
		name: "missing certificate file",
		args: c.AgentArgs(filepath.Join(pod.Dir, "missing.crt"), keyFile),
		want: "loading serving certificate: open " + filepath.Join(pod.Dir, "missing.crt") + ": no such file or directory",
	}, {
		name: "invalid certificate",
		args: c.AgentArgs(garbage, keyFile),
		want: "loading serving certificate",
	}, {
		name: "key does not match certificate",
		args: c.AgentArgs(certFile, filepath.Join(c.Dir, "admin.key")),
		want: "loading serving certificate",
	}, {
		name:   "listen port in use",
		args:   c.AgentArgs(certFile, keyFile),
		occupy: fmt.Sprintf("0.0.0.0:%d", sandbox.AgentListenPort),
		want:   "address already in use",
	}, {
		name: "upstream unreachable",
		args: c.AgentArgs(certFile, keyFile, "--upstream=https://10.250.0.99:6443", "--upstream-check-timeout=2s"),
		want: "no upstream answered within 2s",
	}, {
		name: "upstream is the Service VIP without a socket mark",
		args: c.AgentArgs(certFile, keyFile, "--upstream=https://"+sandbox.ServiceVIP+":443", "--upstream-socket-mark=0"),
		want: "is the Service VIP",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.occupy != "" {
				l, err := c.Node.Listen("tcp", tc.occupy)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
			}
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			cmd := pod.Command(ctx, agentBin, tc.args...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("agent exited with %v, want a non-zero exit\n%s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "kube-apicache: ") || !strings.Contains(last, tc.want) {
				t.Errorf("last line of stderr = %q, want a one-line reason containing %q", last, tc.want)
			}
			t.Logf("exit %d: %s", exit.ExitCode(), last)
			assertNoAgentState(t, ctx, c)
		})
	}
}

// TestFailedUpgradeClosesConnection checks the CVE-2018-1002105 rule: when
// upstream refuses an upgrade, the client gets upstream's answer and then
// the connection is closed, never reused for anything else.
func TestFailedUpgradeClosesConnection(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-upgrade", "client")
	startAgent(t, ctx, c)

	pool := podCAPool(t, pod)
	raw, err := dialVIP(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: sandbox.ServiceVIP, NextProtos: []string{"http/1.1"}})
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	path := fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/exec?command=true&stdout=true", pod.Spec.Namespace, pod.Spec.Name)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
		path, sandbox.ServiceVIP, pod.Token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("upgrade succeeded without a kubelet")
	}
	if !strings.Contains(string(body), "10250") {
		t.Errorf("body = %s, want upstream's kubelet error", body)
	}
	// A second request on the same connection must find it closed.
	fmt.Fprintf(conn, "GET /version HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", sandbox.ServiceVIP, pod.Token)
	if resp2, err := http.ReadResponse(br, nil); err == nil {
		t.Errorf("connection reused after a failed upgrade: got %s", resp2.Status)
	} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isConnReset(err) {
		t.Errorf("second request: %v, want the connection closed", err)
	}
	t.Logf("failed upgrade answered %s, then the connection was closed", resp.Status)
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// TestFailedRestartRemovesDeadRedirect: given an agent killed with SIGKILL
// (its redirect left behind, pointing at nothing), when its successor fails
// to start, then the successor removes the stale redirect on its way out and
// pods reach kube-apiserver through kube-proxy's path again.
func TestFailedRestartRemovesDeadRedirect(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-restart", "client")
	a := startAgent(t, ctx, c)
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(t, a.Process, 10*time.Second)
	if nat, _, _ := c.NodeNetState(ctx); !strings.Contains(nat, sandbox.AgentChain) {
		t.Fatalf("SIGKILL left no redirect; the scenario needs one:\n%s", nat)
	}

	next, certFile, keyFile := newAgentPod(t, ctx, c)
	cmd := next.Command(ctx, agentBin, c.AgentArgs(certFile, keyFile, "--upstream=https://10.250.0.99:6443", "--upstream-check-timeout=1s")...)
	out, err := cmd.CombinedOutput()
	var exit *exitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("successor exited with %v, want non-zero:\n%s", err, out)
	}
	assertNoAgentState(t, ctx, c)
	quick, cancelQuick := context.WithTimeout(ctx, 10*time.Second)
	defer cancelQuick()
	mustKubectl(t, quick, pod, "get", "configmaps")
}

// TestInClusterBootstrap: given no --upstream, as the shipped DaemonSet
// runs the agent, when it starts in a pod (whose environment names the
// kubernetes Service), then it reaches kube-apiserver through the Service
// VIP on kube-proxy's path (its marked sockets skip its own redirect),
// becomes ready, learns the apiservers from the EndpointSlices, and relays a
// pod's requests.
func TestInClusterBootstrap(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, "e2e-bootstrap", "client")
	a := startAgent(t, ctx, c, "--upstream=")

	var endpoints []string
	waitFor(t, 30*time.Second, "the apiservers from the EndpointSlices", func() bool {
		endpoints = endpoints[:0]
		for _, s := range scrapeAgent(t, ctx, a)["kube_apicache_upstream_endpoint_healthy"] {
			endpoints = append(endpoints, s.labels["endpoint"])
		}
		for _, as := range c.APIServers() {
			if !slices.Contains(endpoints, strings.TrimPrefix(as.URL, "https://")) {
				return false
			}
		}
		return true
	})
	if slices.Contains(endpoints, net.JoinHostPort(sandbox.ServiceVIP, strconv.Itoa(sandbox.ServicePort))) {
		t.Errorf("upstream endpoints %v still include the Service VIP after the EndpointSlices were read", endpoints)
	}
	before := forwarded(t, ctx, a)
	out := mustKubectl(t, ctx, pod, "get", "configmaps", "-o", "name")
	if forwarded(t, ctx, a) <= before {
		t.Errorf("kubectl's request did not go through the agent; it printed %q", out)
	}
	figuref(t, "bootstrap without --upstream: ready through the Service VIP, then upstream endpoints %v", endpoints)
}
