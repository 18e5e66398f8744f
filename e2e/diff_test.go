package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

const diffNS = "e2e-diff"

// TestDiffCommand is the `kube-apicache diff` scenario.
//
// Given an agent that caches configmaps, and a pod allowed to read those
// of its namespace,
// when `kube-apicache diff` runs in the pod for the namespace's
// configmaps, through the agent (the Service VIP, which the agent
// intercepts) and straight to a kube-apiserver endpoint, with the pod's
// in-cluster credentials,
// then it reports no difference and exits 0, and the agent answered the
// read from its cache;
// when its agent address is instead a server with a certificate of the
// cluster CA that relays to the agent but changes one label of one
// configmap,
// then it reports exactly that label's path, with both values, and exits 1.
func TestDiffCommand(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := newClientPod(t, ctx, c, diffNS, "differ")
	for _, name := range []string{"cm-a", "cm-b"} {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tier": "web"}},
			Data:       map[string]string{"k": name},
		}
		if _, err := c.Admin.CoreV1().ConfigMaps(diffNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	grantClusterRead(t, ctx, c, "e2e-diff-agent",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sandbox.AgentServiceAccount, Namespace: sandbox.AgentNamespace},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: readVerbs})
	agent := startAgent(t, ctx, c, "--cache-resources=configmaps")
	waitSynced(t, ctx, agent, []string{"configmaps"})

	path := "/api/v1/namespaces/" + diffNS + "/configmaps?labelSelector=tier"
	apiserver := c.APIServers()[0].URL
	diff := func(agentURL string) (string, int) {
		t.Helper()
		out, err := pod.Command(ctx, agentBin, "diff", "--timeout=20s", "--agent", agentURL, "--apiserver", apiserver, path).CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		case err != nil:
			t.Fatalf("kube-apicache diff: %v\n%s", err, out)
		}
		return string(out), 0
	}

	// When diff compares the agent's answer with kube-apiserver's, then
	// there is no difference, and the agent answered from its cache.
	before := readCacheMetrics(t, ctx, agent)
	out, code := diff(vipURL(""))
	outcome := cacheOutcome(before, readCacheMetrics(t, ctx, agent))
	t.Logf("kube-apicache diff through the agent:\n%s", out)
	if code != 0 || !strings.Contains(out, "no difference") || !strings.Contains(out, ", 2 items") {
		t.Errorf("exit status %d, want 0 with no difference between 2 items:\n%s", code, out)
	}
	if outcome != "cache" {
		t.Errorf("the agent took the read as %s, want it answered from its cache", outcome)
	}

	// When the agent's answer is altered on the way, then diff reports
	// exactly the altered label.
	tamper, relayed := tamperingRelay(t, c, pod)
	out, code = diff(tamper)
	t.Logf("kube-apicache diff through the tampering relay:\n%s", out)
	want := "1 difference (agent, then direct):\n  items[" + diffNS + `/cm-b].metadata.labels.tier: agent "tampered" direct "web"` + "\n"
	if code != 1 || !strings.HasSuffix(out, want) {
		t.Errorf("exit status %d, want 1 ending with %q:\n%s", code, want, out)
	}
	if n := relayed.Load(); n != 1 {
		t.Errorf("the relay answered %d requests, want 1 (no second read for a planted difference)", n)
	}
}

// tamperingRelay serves HTTPS in pod's network namespace, with a
// certificate of the cluster CA for the kubernetes Service names, and
// relays each request to the agent through the Service VIP, setting the
// tier label of configmap cm-b in the answer to "tampered". It returns its
// URL and the number of requests it relayed.
func tamperingRelay(t *testing.T, c *sandbox.Cluster, pod *sandbox.Pod) (string, *atomic.Int32) {
	t.Helper()
	kp, err := c.CA.Issue(sandbox.CertSpec{CommonName: "e2e-diff-relay", DNSNames: sandbox.KubernetesServiceNames(), Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	l, err := pod.NetNS.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	toAgent := &http.Transport{
		DialContext:     pod.NetNS.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: podCAPool(t, pod), ServerName: "kubernetes.default.svc"},
	}
	var relayed atomic.Int32
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			relayed.Add(1)
			req, err := http.NewRequestWithContext(r.Context(), r.Method, vipURL(r.URL.RequestURI()), nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			req.Header = r.Header.Clone()
			resp, err := toAgent.RoundTrip(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(tamperLabel(body))
		}),
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() {
		_ = srv.Close()
		toAgent.CloseIdleConnections()
	})
	return "https://" + net.JoinHostPort("127.0.0.1", portOf(l.Addr())), &relayed
}

// tamperLabel sets the tier label of configmap cm-b in a JSON list;
// anything else passes unchanged.
func tamperLabel(body []byte) []byte {
	var list map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&list) != nil {
		return body
	}
	items, _ := list["items"].([]any)
	for _, item := range items {
		md, _ := item.(map[string]any)["metadata"].(map[string]any)
		labels, _ := md["labels"].(map[string]any)
		if md["name"] == "cm-b" && labels != nil {
			labels["tier"] = "tampered"
		}
	}
	out, err := json.Marshal(list)
	if err != nil {
		return body
	}
	return out
}

func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}
