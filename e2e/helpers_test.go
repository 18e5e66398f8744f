package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Process.Log())
		}
		a.Process.Stop(40 * time.Second)
	})
	return a
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
		deadline := time.After(timeout)
		var seen []string
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return fmt.Errorf("output ended before %q; saw %q", substr, seen)
				}
				if strings.Contains(l, substr) {
					return nil
				}
				seen = append(seen, l)
			case <-deadline:
				return fmt.Errorf("no %q within %s; saw %q", substr, timeout, seen)
			}
		}
	}
}

// agentRequests sums kube_apicache_requests_total by verb.
func agentRequests(t *testing.T, ctx context.Context, a *sandbox.Agent) map[string]float64 {
	t.Helper()
	text, err := a.Metrics(ctx)
	if err != nil {
		t.Fatalf("reading agent metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing agent metrics: %v", err)
	}
	out := map[string]float64{}
	if f, ok := families["kube_apicache_requests_total"]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "verb" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// vipClient returns an HTTP client that dials from inside pod's network
// namespace and trusts only the pod's ServiceAccount ca.crt, as an
// in-cluster client does.
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

// vipURL is the kubernetes Service as pods address it.
func vipURL(path string) string {
	return fmt.Sprintf("https://%s:%d%s", sandbox.ServiceVIP, sandbox.ServicePort, path)
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
