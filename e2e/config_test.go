package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// writeConfig writes an AgentConfiguration with body (YAML below kind) and
// returns its path.
func writeConfig(t *testing.T, path, body string) string {
	t.Helper()
	doc := "apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\n" + body
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	// Replaced whole, as the kubelet swaps a ConfigMap volume's files.
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigFile: given an agent configured by an AgentConfiguration file,
// (1) when the file names a Service VIP that is not the kubernetes
// Service's, then the agent is not ready and does not intercept, and both
// say why; (2) when the file's interception.enabled turns false while the
// agent intercepts, then within seconds the agent stops intercepting, stays
// ready, and a pod's request to the VIP still reaches kube-apiserver (by
// kube-proxy's path), and turning it back on intercepts again; (3) when the
// file has a misspelt field, then the agent exits 1 with one line naming it.
func TestConfigFile(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	client, _ := setUpCacheScenario(t, ctx, c)
	hc := vipClient(t, client, true)

	t.Run("WrongVIP", func(t *testing.T) {
		cfg := writeConfig(t, filepath.Join(dir, "wrong.yaml"), "cluster:\n  serviceVIPs: [10.96.0.99]\n")
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		// Started as a process: it is never ready, which StartAgent waits for.
		proc, err := pod.Start(agentBin, c.AgentArgs(certFile, keyFile, "--config="+cfg)...)
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Stop(40 * time.Second)
		var code int
		var body string
		waitFor(t, 30*time.Second, "/readyz to report the wrong VIP", func() bool {
			code, body, _ = agentEndpoint(ctx, c, "/readyz")
			return strings.Contains(body, "10.96.0.99 is not a cluster IP")
		})
		figuref(t, "config/wrong VIP: /readyz %d %s", code, body)
		if code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d with a wrong VIP, want 503", code)
		}
		code, body, _ = agentEndpoint(ctx, c, "/intercepting")
		figuref(t, "config/wrong VIP: /intercepting %d %s", code, body)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "(config field cluster.serviceVIPs)") && !strings.Contains(body, "10.96.0.99") {
			t.Errorf("/intercepting = %d %q with a wrong VIP, want 503 naming it", code, body)
		}
		if !strings.Contains(proc.Log(), "does not match the kubernetes Service") {
			t.Errorf("the agent's log does not say the configuration does not match the Service")
		}
	})

	t.Run("KillSwitch", func(t *testing.T) {
		cfg := writeConfig(t, filepath.Join(dir, "config.yaml"), "interception:\n  enabled: true\n")
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		a, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, "--config="+cfg)...)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Process.Stop(40 * time.Second)
		if err := a.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		before := totalRequests(t, ctx, a)
		if code, _ := vipRequest(ctx, hc, http.MethodGet, "/version", client.Token, nil); code != http.StatusOK {
			t.Fatalf("GET /version through the agent: %d", code)
		}
		if totalRequests(t, ctx, a) <= before {
			t.Fatalf("the request before the switch did not reach the agent")
		}

		writeConfig(t, cfg, "interception:\n  enabled: false\n")
		took := waitFor(t, 30*time.Second, "/intercepting to report the kill switch", func() bool {
			_, body, _ := agentEndpoint(ctx, c, "/intercepting")
			return strings.Contains(body, "interception turned off")
		})
		code, body, _ := agentEndpoint(ctx, c, "/intercepting")
		figuref(t, "config/kill switch: off %v after the file changed (polled every 5s); /intercepting %d %s", took.Round(time.Millisecond), code, body)
		if code != http.StatusServiceUnavailable {
			t.Errorf("/intercepting = %d with interception off, want 503", code)
		}
		if code, body, _ := agentEndpoint(ctx, c, "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d %q with interception off, want 200 (stepped aside on purpose)", code, body)
		}
		// New connections go to kube-proxy's path.
		hcOff := vipClient(t, client, true)
		before = totalRequests(t, ctx, a)
		if code, _ := vipRequest(ctx, hcOff, http.MethodGet, "/version", client.Token, nil); code != http.StatusOK {
			t.Errorf("GET /version with interception off: %d, want 200 from kube-apiserver", code)
		}
		if n := totalRequests(t, ctx, a); n != before {
			t.Errorf("a new connection reached the agent with interception off (%v requests before, %v after)", before, n)
		}

		writeConfig(t, cfg, "interception:\n  enabled: true\n")
		took = waitFor(t, 30*time.Second, "interception back on", func() bool {
			code, _, _ := agentEndpoint(ctx, c, "/intercepting")
			return code == http.StatusOK
		})
		figuref(t, "config/kill switch: on again %v after the file changed", took.Round(time.Millisecond))
	})

	t.Run("KillSwitchConfigMap", func(t *testing.T) {
		cms := c.Admin.CoreV1().ConfigMaps(sandbox.AgentNamespace)
		doc := func(enabled bool) map[string]string {
			return map[string]string{"config.yaml": fmt.Sprintf("apiVersion: config.kube-apicache.io/v1alpha1\nkind: AgentConfiguration\ninterception:\n  enabled: %t\n", enabled)}
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-apicache-config"}, Data: doc(true)}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cms.Delete(context.Background(), cm.Name, metav1.DeleteOptions{}) }()
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		a, err := c.StartAgent(ctx, pod, agentBin, c.AgentArgs(certFile, keyFile, "--interception-configmap="+sandbox.AgentNamespace+"/"+cm.Name)...)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Process.Stop(40 * time.Second)
		if err := a.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		set := func(enabled bool) {
			cur, err := cms.Get(ctx, cm.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cur.Data = doc(enabled)
			if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		set(false)
		took := waitFor(t, 30*time.Second, "/intercepting to report the ConfigMap's kill switch", func() bool {
			_, body, _ := agentEndpoint(ctx, c, "/intercepting")
			return strings.Contains(body, "interception turned off (interception.enabled: false in ConfigMap")
		})
		figuref(t, "config/kill switch by ConfigMap watch: off %v after the update", took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("the ConfigMap's kill switch took %v, want a watch's second or two", took)
		}
		set(true)
		took = waitFor(t, 30*time.Second, "interception back on", func() bool {
			code, _, _ := agentEndpoint(ctx, c, "/intercepting")
			return code == http.StatusOK
		})
		figuref(t, "config/kill switch by ConfigMap watch: on again %v after the update", took.Round(time.Millisecond))
	})

	t.Run("MisspeltField", func(t *testing.T) {
		cfg := writeConfig(t, filepath.Join(dir, "bad.yaml"), "cluster:\n  serviceVIP: 10.96.0.1\n")
		pod, certFile, keyFile := newAgentPod(t, ctx, c)
		proc, err := pod.Start(agentBin, c.AgentArgs(certFile, keyFile, "--config="+cfg)...)
		if err != nil {
			t.Fatal(err)
		}
		if code := waitExit(t, proc, 20*time.Second); code != 1 {
			t.Errorf("exit code %d with a misspelt field, want 1", code)
		}
		out := strings.TrimSpace(proc.Log())
		figuref(t, "config/misspelt field: %s", lastN(strings.Split(out, "\n"), 1)[0])
		if !strings.Contains(out, `unknown field "cluster.serviceVIP"`) {
			t.Errorf("the error does not name the field:\n%s", out)
		}
	})
}

// totalRequests is the agent's kube_apicache_requests_total, summed.
func totalRequests(t *testing.T, ctx context.Context, a *sandbox.Agent) float64 {
	t.Helper()
	return sumWhere(scrapeAgent(t, ctx, a)["kube_apicache_requests_total"], nil)
}
