package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

var agentPods atomic.Int32

// newAgentPod creates a fresh agent Pod object and serving certificate.
func newAgentPod(t *testing.T, ctx context.Context, c *sandbox.Cluster) (pod *sandbox.Pod, certFile, keyFile string) {
	t.Helper()
	name := fmt.Sprintf("kube-apicache-%d", agentPods.Add(1))
	pod, certFile, keyFile, err := c.NewAgentPod(ctx, name)
	if err != nil {
		t.Fatalf("creating agent pod: %v", err)
	}
	return pod, certFile, keyFile
}

// startAgent runs the agent as the DaemonSet would and stops it (SIGTERM)
// when the test ends.
func startAgent(t *testing.T, ctx context.Context, c *sandbox.Cluster, extra ...string) *sandbox.Agent {
	t.Helper()
	pod, certFile, keyFile := newAgentPod(t, ctx, c)
	a, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, extra...)...)
	if err != nil {
		t.Fatalf("starting agent: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent", 0, 40*time.Second)
	return a
}

// stopOnCleanup stops p when the test ends (SIGTERM, then SIGKILL after
// grace). If the test failed, it first logs p's output as what's log: the
// last tail lines, or all of it if tail is 0.
func stopOnCleanup(t *testing.T, p *sandbox.Process, what string, tail int, grace time.Duration) {
	t.Cleanup(func() {
		if t.Failed() {
			log := p.Log()
			if tail > 0 {
				log = tailLines(log, tail)
			}
			t.Logf("%s log:\n%s", what, log)
		}
		p.Stop(grace)
	})
}

// newClientPod creates a pod whose ServiceAccount may edit its namespace.
func newClientPod(t *testing.T, ctx context.Context, c *sandbox.Cluster, ns, name string) *sandbox.Pod {
	t.Helper()
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: name, Namespace: ns, ServiceAccount: name})
	if err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	if err := pod.Grant(ctx, "edit"); err != nil {
		t.Fatalf("granting edit: %v", err)
	}
	if err := pod.WaitAllowed(ctx, "create", "configmaps"); err != nil {
		t.Fatalf("waiting for RBAC: %v", err)
	}
	return pod
}

// kubectl runs kubectl inside pod with no kubeconfig (in-cluster config).
func kubectl(ctx context.Context, pod *sandbox.Pod, args ...string) (stdout, stderr string, err error) {
	cmd := pod.Command(ctx, "kubectl", args...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// mustKubectl runs kubectl and fails the test on error.
func mustKubectl(t *testing.T, ctx context.Context, pod *sandbox.Pod, args ...string) string {
	t.Helper()
	out, errOut, err := kubectl(ctx, pod, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// lineReader starts cmd and returns a function that waits for a stdout line
// containing substr.
func lineReader(t *testing.T, cmd interface {
	StdoutPipe() (io.ReadCloser, error)
	Start() error
}) func(substr string, timeout time.Duration) error {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return func(substr string, timeout time.Duration) error {
		_, seen, err := awaitLine(lines, timeout, substr, func(l string) bool { return strings.Contains(l, substr) })
		if err != nil {
			return fmt.Errorf("%w; saw %q", err, seen)
		}
		return nil
	}
}

// awaitLine reads lines until one satisfies match and returns it, with the
// lines read before it. It fails if lines is closed first or timeout
// passes; want names the awaited line in the error.
func awaitLine(lines <-chan string, timeout time.Duration, want string, match func(string) bool) (line string, skipped []string, err error) {
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return "", skipped, fmt.Errorf("output ended before %q", want)
			}
			if match(l) {
				return l, skipped, nil
			}
			skipped = append(skipped, l)
		case <-deadline:
			return "", skipped, fmt.Errorf("no %q within %s", want, timeout)
		}
	}
}

// vipClient returns an HTTP client that dials from inside pod's network
// namespace and trusts only the pod's ServiceAccount ca.crt, as an
// in-cluster client does: for the Service VIP, or any kube-apiserver
// address the pod reaches.
func vipClient(t *testing.T, pod *sandbox.Pod, http2 bool) *http.Client {
	t.Helper()
	pool := podCAPool(t, pod)
	tr := &http.Transport{
		DialContext:       pod.NetNS.DialContext,
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: http2,
		DisableKeepAlives: !http2,
	}
	if !http2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return &http.Client{Transport: tr, Timeout: 15 * time.Second}
}

// dialVIP opens a TCP connection from inside pod's network namespace to
// the kubernetes Service VIP.
func dialVIP(ctx context.Context, pod *sandbox.Pod) (net.Conn, error) {
	return pod.NetNS.DialContext(ctx, "tcp", net.JoinHostPort(sandbox.ServiceVIP, strconv.Itoa(sandbox.ServicePort)))
}

// vipURL is the kubernetes Service as pods address it.
func vipURL(path string) string {
	return fmt.Sprintf("https://%s:%d%s", sandbox.ServiceVIP, sandbox.ServicePort, path)
}

// tailLines returns the last n lines of s, a trailing newline aside.
func tailLines(s string, n int) string {
	return strings.Join(lastN(strings.Split(strings.TrimRight(s, "\n"), "\n"), n), "\n")
}

// lastN returns the last n elements of s, or all of them if there are
// fewer.
func lastN(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// auditEvents reads kube-apiserver's audit log and returns the events keep
// accepts (all of them if keep is nil), in the order they were logged.
func auditEvents(t *testing.T, c *sandbox.Cluster, keep func(*auditv1.Event) bool) []auditv1.Event {
	t.Helper()
	events, err := c.AuditEvents()
	if err != nil {
		t.Fatalf("reading the audit log: %v", err)
	}
	if keep == nil {
		return events
	}
	var out []auditv1.Event
	for i := range events {
		if keep(&events[i]) {
			out = append(out, events[i])
		}
	}
	return out
}

// waitExit waits for p to exit and returns its code.
func waitExit(t *testing.T, p *sandbox.Process, timeout time.Duration) int {
	t.Helper()
	_ = p.Wait(timeout)
	if done, _ := p.Exited(); !done {
		_ = p.Signal(syscall.SIGKILL)
		t.Fatalf("%s did not exit within %s", p.Name, timeout)
	}
	return p.ExitCode()
}

type exitError = exec.ExitError

// podCAPool holds the CA from the pod's ServiceAccount ca.crt: all an
// in-cluster client trusts.
func podCAPool(t *testing.T, pod *sandbox.Pod) *x509.CertPool {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(pod.Dir, "serviceaccount", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("no certificate in the pod's ca.crt")
	}
	return pool
}

// agentEndpoint returns the status code and body of one of the agent's
// health paths (/healthz, /readyz, /intercepting), asked anonymously from
// the node, as the kubelet probes them: on the DaemonSet's agent where it
// runs (it listens on the node's IP), else on the sandbox agent's address.
func agentEndpoint(ctx context.Context, c *sandbox.Cluster, path string) (int, string, error) {
	return agentEndpointAs(ctx, c, path, "")
}

// agentEndpointAs is agentEndpoint with the bearer token given.
func agentEndpointAs(ctx context.Context, c *sandbox.Cluster, path, token string) (int, string, error) {
	addr := sandbox.AgentMetricsAddr
	if a, err := c.DaemonSetAgentMetricsAddr(ctx); err == nil {
		addr = a
	}
	code, b, err := sandbox.AgentGetWithToken(ctx, c.Node, addr, path, token, 5*time.Second)
	return code, strings.TrimSpace(string(b)), err
}
