package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// webhookProxyFiles writes a serving certificate for the proxy and
// rewrite configurations into a temporary directory.
type webhookProxyFiles struct {
	dir       string
	cert, key string
	certPEM   []byte
	// one has a single profile, two has two.
	one, two string
}

const oneProfile = `apiVersion: config.kube-apicache.io/v1alpha1
kind: RewriteConfiguration
profiles:
- name: widgets
  selector: {serviceAccounts: [widgets-system/widget-operator]}
  groups: [{from: example.com, to: renamed.example.io}]
  kindPrefix: Renamed
  labels: [{from: example.com, to: renamed.example.io}]
`

const twoProfiles = oneProfile + `- name: gadgets
  selector: {serviceAccounts: [gadgets-system/gadget-operator]}
  groups: [{from: gadgets.example.net, to: renamed.example.net}]
  kindPrefix: Other
`

func newWebhookProxyFiles(t *testing.T) *webhookProxyFiles {
	t.Helper()
	f := &webhookProxyFiles{dir: t.TempDir()}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("webhook.widgets-system.svc", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.certPEM = certPEM
	f.cert, f.key = f.write(t, "tls.crt", string(certPEM)), f.write(t, "tls.key", string(keyPEM))
	f.one, f.two = f.write(t, "one.yaml", oneProfile), f.write(t, "two.yaml", twoProfiles)
	return f
}

func (f *webhookProxyFiles) write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWebhookProxyFlags: a missing or bad flag is a one-line error naming
// it, before anything is served.
func TestWebhookProxyFlags(t *testing.T) {
	f := newWebhookProxyFiles(t)
	invalid := f.write(t, "invalid.yaml", strings.Replace(oneProfile, "kindPrefix: Renamed", "kindPrefix: renamed", 1))
	unknown := f.write(t, "unknown.yaml", oneProfile+"  colour: blue\n")
	certs := []string{"--tls-cert-file", f.cert, "--tls-private-key-file", f.key, "--listen-address", "127.0.0.1:0"}
	withCerts := func(args ...string) []string { return append(append([]string{}, certs...), args...) }
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "--tls-cert-file and --tls-private-key-file are required"},
		{"no key", []string{"--tls-cert-file", f.cert}, "--tls-cert-file and --tls-private-key-file are required"},
		{"no backend", withCerts("--rewrite-config", f.one), "--backend is required"},
		{"backend scheme", withCerts("--backend", "ftp://127.0.0.1:9443", "--rewrite-config", f.one), `--backend "ftp://127.0.0.1:9443": the scheme must be https or http`},
		{"backend query", withCerts("--backend", "https://127.0.0.1:9443?x=1", "--rewrite-config", f.one), "no query or fragment"},
		{"CA for plain HTTP", withCerts("--backend", "http://127.0.0.1:9443", "--backend-ca-file", f.cert, "--rewrite-config", f.one), "need an https --backend"},
		{"no rewrite config", withCerts("--backend", "https://127.0.0.1:9443"), "--rewrite-config is required"},
		{"missing rewrite config", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", filepath.Join(f.dir, "nope.yaml")), "--rewrite-config: open"},
		{"invalid rewrite config", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", invalid), "kindPrefix"},
		{"unknown field", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", unknown), "colour"},
		{"profile required", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.two), "--profile is required: " + f.two + " has 2 profiles (widgets, gadgets)"},
		{"unknown profile", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.two, "--profile", "nope"), `--profile "nope": ` + f.two + " has no such profile (it has widgets, gadgets)"},
		{"listen", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one, "--listen-address", "9444"), `--listen-address "9444": must be host:port`},
		{"metrics address", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one, "--metrics-bind-address", "localhost"), `--metrics-bind-address "localhost": must be host:port`},
		{"timeout", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one, "--timeout", "0s"), "--timeout 0s must be positive"},
		{"body limit", withCerts("--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one, "--max-body-bytes", "0"), "--max-body-bytes 0 must be positive"},
		{"unreadable certificate", []string{"--tls-cert-file", filepath.Join(f.dir, "nope.crt"), "--tls-private-key-file", f.key, "--listen-address", "127.0.0.1:0", "--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one}, "--tls-cert-file: loading the serving certificate"},
		{"certificate and key apart", []string{"--tls-cert-file", f.cert, "--tls-private-key-file", f.one, "--listen-address", "127.0.0.1:0", "--backend", "https://127.0.0.1:9443", "--rewrite-config", f.one}, "--tls-cert-file: loading the serving certificate"},
		{"unreadable backend CA", withCerts("--backend", "https://127.0.0.1:9443", "--backend-ca-file", filepath.Join(f.dir, "nope.crt"), "--rewrite-config", f.one), "--backend-ca-file: loading the backend CA bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(append([]string{"webhook-proxy"}, tc.args...))
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if strings.Contains(oneLine(err), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
		})
	}
}

// TestWebhookProxyServes: the command's proxy serves a review over TLS
// with the given certificate, verifies the webhook server against the CA
// bundle and name given, answers the probes and metrics, and at the end
// of its context lets a call in flight finish before it returns.
func TestWebhookProxyServes(t *testing.T) {
	f := newWebhookProxyFiles(t)
	release := make(chan struct{})
	reached := make(chan struct{}, 1)
	backend := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Request    struct {
				UID  string `json:"uid"`
				Kind struct{ Group, Kind string }
			} `json:"request"`
		}
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			t.Errorf("webhook server: %v", err)
		}
		if review.Request.Kind.Group != "example.com" || review.Request.Kind.Kind != "Widget" {
			t.Errorf("webhook server got kind %+v, want example.com Widget", review.Request.Kind)
		}
		if r.URL.Path == "/slow" {
			reached <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"`+review.Request.UID+`","allowed":true,"warnings":["example.com/v1 Widget is deprecated"]}}`)
	}))
	defer backend.Close()
	ca := f.write(t, "backend-ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: backend.Certificate().Raw})))

	o := &webhookProxyOptions{
		listenAddress: "127.0.0.1:0", certFile: f.cert, keyFile: f.key,
		// httptest's certificate names example.com.
		backend: backend.URL, backendCAFile: ca, backendServerName: "example.com",
		rewriteConfig: f.one, timeout: 10 * time.Second, maxBodyBytes: 1 << 20, gracePeriod: 10 * time.Second,
		metricsBindAddress: "127.0.0.1:0",
	}
	wp, err := o.complete()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- wp.run(ctx, ln, mln) }()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(f.certPEM)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "webhook.widgets-system.svc"}}}
	base := "https://" + ln.Addr().String()
	review := func(path string) (int, string) {
		resp, err := client.Post(base+path, "application/json", strings.NewReader(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"renamed.example.io","version":"v1","kind":"RenamedWidget"}}}`))
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	get := func(url string) (int, string) {
		resp, err := client.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	want := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"allowed":true,"uid":"u","warnings":["renamed.example.io/v1 RenamedWidget is deprecated"]}}`
	if code, body := review("/validate"); code != 200 || body != want {
		t.Fatalf("review: %d %s\nwant 200 %s", code, body, want)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(base + path); code != 200 || body != "ok\n" {
			t.Errorf("GET %s on the webhook listener: %d %q", path, code, body)
		}
	}
	metrics := "http://" + mln.Addr().String()
	if code, body := get(metrics + "/metrics"); code != 200 || !strings.Contains(body, `kube_apicache_webhook_proxy_requests_total{code="200",kind="AdmissionReview"} 1`) || !strings.Contains(body, "kube_apicache_build_info") {
		t.Errorf("GET /metrics: %d\n%s", code, body)
	}
	if code, _ := get(metrics + "/readyz"); code != 200 {
		t.Errorf("GET /readyz on the metrics listener: %d", code)
	}

	// A call in flight when the context ends still gets its answer;
	// meanwhile the proxy is not ready.
	slow := make(chan string, 1)
	go func() {
		code, body := review("/slow")
		slow <- body
		if code != 200 {
			t.Errorf("the call in flight at shutdown: %d %s", code, body)
		}
	}()
	<-reached
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get(metrics + "/readyz"); code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz did not fail after the context ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if body := <-slow; body != want {
		t.Errorf("the call in flight at shutdown: %s", body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after the context ended")
	}
}
