package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// testCA is a CA and a serving certificate it issued for the kubernetes
// Service names and 127.0.0.1, as the cluster CA issues the agent's.
type testCA struct {
	pem  []byte
	leaf tls.Certificate
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, leafKey.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		pem:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaf: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
	}
}

// fakeAPI is a TLS server answering each GET with respond(n), n counting
// its requests from 0; it records the Authorization and Accept headers.
type fakeAPI struct {
	*httptest.Server
	mu      sync.Mutex // protects the fields below
	n       int
	headers []string
}

func newFakeAPI(t *testing.T, ca testCA, respond func(n int) (int, string)) *fakeAPI {
	t.Helper()
	f := &fakeAPI{}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		n := f.n
		f.n++
		f.headers = append(f.headers, r.Header.Get("Authorization")+" "+r.Header.Get("Accept")+" "+r.URL.RequestURI())
		f.mu.Unlock()
		code, body := respond(n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	f.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf}}
	f.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.headers...)
}

// writeKubeconfig writes a kubeconfig for server with a bearer token, or
// with a client certificate where clientCert is set.
func writeKubeconfig(t *testing.T, server string, ca []byte, clientCert bool) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	user := &clientcmdapi.AuthInfo{Token: "t0ken"}
	if clientCert {
		user = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("x"), ClientKeyData: []byte("y")}
	}
	cfg.AuthInfos["u"] = user
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// runDiff runs `kube-apicache diff args...` and returns its output and
// exit status.
func runDiff(t *testing.T, args ...string) (string, int) {
	t.Helper()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cmd := newCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"diff"}, args...))
	err := cmd.Execute()
	code := 0
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
		if ee.err != nil {
			out.WriteString("error: " + ee.err.Error() + "\n")
		}
	case err != nil:
		t.Fatalf("diff returned %v, not an exit status", err)
	}
	return out.String(), code
}

func podList(listRV, itemRV, app string) string {
	return `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"` + listRV + `"},"items":[
		{"metadata":{"name":"web-0","namespace":"default","resourceVersion":"7","labels":{"app":"x"}}},
		{"metadata":{"name":"web-1","namespace":"default","resourceVersion":"` + itemRV + `","labels":{"app":"` + app + `"}}}]}`
}

// TestDiff runs diff against two TLS servers standing for an agent and
// kube-apiserver, both with certificates of the kubeconfig's CA.
func TestDiff(t *testing.T) {
	ca := newTestCA(t)
	const path = "/api/v1/namespaces/default/pods?labelSelector=app%3Dx"
	for _, tc := range []struct {
		name          string
		agent, direct func(n int) (int, string)
		code          int
		want, notWant []string
		// requests each server must have seen.
		requests int
	}{{
		// Equal answers, but for the list's own resourceVersion: no
		// difference, and a note.
		name:     "list resourceVersion only",
		agent:    func(int) (int, string) { return 200, podList("100", "8", "x") },
		direct:   func(int) (int, string) { return 200, podList("105", "8", "x") },
		want:     []string{"no difference", `note: list resourceVersion: agent "100", direct "105"`, ", 2 items"},
		notWant:  []string{"read twice"},
		requests: 1,
	}, {
		// A label planted in one item of the same resourceVersion: its
		// path is reported, without a second read.
		name:     "planted label",
		agent:    func(int) (int, string) { return 200, podList("100", "8", "z") },
		direct:   func(int) (int, string) { return 200, podList("105", "8", "x") },
		code:     1,
		want:     []string{"1 difference (agent, then direct):\n  items[default/web-1].metadata.labels.app: agent \"z\" direct \"x\"\n"},
		notWant:  []string{"read twice", "no difference"},
		requests: 1,
	}, {
		// Different status codes.
		name: "status codes",
		agent: func(int) (int, string) {
			return 403, `{"kind":"Status","reason":"Forbidden","message":"pods is forbidden"}`
		},
		direct:   func(int) (int, string) { return 200, podList("105", "8", "x") },
		code:     1,
		want:     []string{"code: agent 403 direct 200", "body: agent Status Forbidden: pods is forbidden direct PodList, 279 bytes"},
		requests: 1,
	}, {
		// The object changed between the first two reads (its
		// resourceVersions differ); the second reads agree.
		name:  "concurrent change",
		agent: func(int) (int, string) { return 200, podList("100", "8", "x") },
		direct: func(n int) (int, string) {
			if n == 0 {
				return 200, podList("105", "9", "y")
			}
			return 200, podList("106", "8", "x")
		},
		want:     []string{"read twice: the first answers had 2 differences", "no difference"},
		requests: 2,
	}, {
		// The agent keeps answering an older version: reported after the
		// second read, marked as a possible change.
		name:     "stale item",
		agent:    func(int) (int, string) { return 200, podList("100", "8", "x") },
		direct:   func(int) (int, string) { return 200, podList("105", "9", "y") },
		code:     1,
		want:     []string{"read twice", `items[default/web-1].metadata.resourceVersion: agent "8" direct "9" (object changed between the reads?)`},
		requests: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			agent, direct := newFakeAPI(t, ca, tc.agent), newFakeAPI(t, ca, tc.direct)
			kubeconfig := writeKubeconfig(t, direct.URL, ca.pem, false)
			out, code := runDiff(t, "--kubeconfig", kubeconfig, "--agent", agent.URL, path)
			t.Logf("kube-apicache diff:\n%s", out)
			if code != tc.code {
				t.Errorf("exit status %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
			// The same credentials, headers and path, to both.
			wantSeen := strings.Repeat("Bearer t0ken application/json "+path+"\n", tc.requests)
			for name, f := range map[string]*fakeAPI{"agent": agent, "direct": direct} {
				if got := strings.Join(f.seen(), "\n") + "\n"; got != wantSeen {
					t.Errorf("%s saw %q, want %q", name, got, wantSeen)
				}
			}
		})
	}
}

// TestDiffTrouble: usage, configuration and transport errors exit 2 with
// one line, and the credentials never reach an agent whose certificate
// the cluster CA did not issue.
func TestDiffTrouble(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	ok := func(int) (int, string) { return 200, podList("1", "1", "x") }
	direct := newFakeAPI(t, ca, ok)
	kubeconfig := writeKubeconfig(t, direct.URL, ca.pem, false)
	impostor := newFakeAPI(t, other, ok)
	otherCA := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(otherCA, other.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	agent := newFakeAPI(t, ca, ok)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no path", []string{"--kubeconfig", kubeconfig}, "one PATH"},
		{"unknown flag", []string{"--nope", "/api"}, "unknown flag"},
		{"relative path", []string{"--kubeconfig", kubeconfig, "api/v1/pods"}, "must start with /"},
		{"watch", []string{"--kubeconfig", kubeconfig, "--agent", agent.URL, "/api/v1/pods?watch=true"}, "watches are not compared"},
		{"watch path", []string{"--kubeconfig", kubeconfig, "--agent", agent.URL, "/api/v1/watch/pods"}, "watches are not compared"},
		{"client certificate", []string{"--kubeconfig", writeKubeconfig(t, direct.URL, ca.pem, true), "--agent", agent.URL, "/api/v1/pods"}, "client certificate"},
		{"agent not of the cluster CA", []string{"--kubeconfig", kubeconfig, "--agent", impostor.URL, "/api/v1/pods"}, "must verify against --agent-ca-file"},
		{"wrong --agent-ca-file", []string{"--kubeconfig", kubeconfig, "--agent", agent.URL, "--agent-ca-file", otherCA, "/api/v1/pods"}, "certificate"},
		{"plain http agent", []string{"--kubeconfig", kubeconfig, "--agent", "http://127.0.0.1:1", "/api/v1/pods"}, "must be https"},
		{"--agent and --node", []string{"--kubeconfig", kubeconfig, "--agent", agent.URL, "--node", "n1", "/api/v1/pods"}, "give one"},
		{"same address", []string{"--kubeconfig", kubeconfig, "--agent", direct.URL, "/api/v1/pods"}, "same address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runDiff(t, tc.args...)
			if code != diffTrouble || !strings.Contains(out, tc.want) {
				t.Errorf("exit status %d, want %d with %q:\n%s", code, diffTrouble, tc.want, out)
			}
		})
	}
	if seen := impostor.seen(); len(seen) > 0 {
		t.Errorf("an agent whose certificate the cluster CA did not issue got requests: %q", seen)
	}
}
