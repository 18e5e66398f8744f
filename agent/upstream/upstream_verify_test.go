package upstream

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/agent/identity"
)

// upstreamTestCA is a cluster CA made for one test.
type upstreamTestCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// file holds the CA's certificate, for --upstream-ca-file.
	file string
}

var upstreamTestSerial atomic.Int64

func newUpstreamTestCA(t *testing.T, cn string) *upstreamTestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(upstreamTestSerial.Add(1)),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return &upstreamTestCA{cert: cert, key: key, file: file}
}

// issue returns a serving certificate for subject, dns and ips.
func (ca *upstreamTestCA) issue(t *testing.T, subject pkix.Name, dns []string, ips []net.IP) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(upstreamTestSerial.Add(1)),
		Subject:      subject,
		DNSNames:     dns,
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestUpstreamVerification runs a fake kube-apiserver endpoint on 127.0.0.1
// with each kind of certificate, builds the upstream transport as the agent
// does (New), and checks that a pod's request through the agent
// reaches it, credentials and all, only when its certificate is
// kube-apiserver's: signed by --upstream-ca-file, carrying the server name
// (kubernetes.default.svc unless --upstream-server-name says otherwise),
// and not a node's. The health check, which shares the transport, must
// agree.
func TestUpstreamVerification(t *testing.T) {
	ca := newUpstreamTestCA(t, "cluster-ca")
	other := newUpstreamTestCA(t, "some-other-ca")
	serviceNames := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	endpointIP := []net.IP{net.IPv4(127, 0, 0, 1)}
	apiserver := pkix.Name{CommonName: "kube-apiserver"}
	node := pkix.Name{CommonName: identity.NodeCommonName("evil"), Organization: []string{identity.NodesOrganization}}
	tests := []struct {
		name       string
		cert       *tls.Certificate
		serverName string // --upstream-server-name
		// wantForwarded: the requests reach the endpoint and their answers
		// the client; otherwise the client gets 503 and the endpoint
		// never sees a request or a token.
		wantForwarded bool
		// wantErr is in the health check's error when not forwarded.
		wantErr string
		// wantNode: the error is errNodeCertificate.
		wantNode bool
	}{{
		// kube-apiserver's own certificate, with the Service's names and
		// the endpoint IP, as kubeadm issues it.
		name:          "apiserver certificate",
		cert:          ca.issue(t, apiserver, serviceNames, endpointIP),
		wantForwarded: true,
	}, {
		// A kubelet-serving certificate of the node an EndpointSlice was
		// pointed at: the cluster CA signed it for the node's IP, which is
		// the endpoint IP. The old check (the endpoint IP as server name)
		// let it through and sent it every pod's token.
		name:    "kubelet-serving certificate for the endpoint IP",
		cert:    ca.issue(t, node, nil, endpointIP),
		wantErr: "kubernetes.default.svc",
	}, {
		// An agent's certificate: the cluster CA signed it for exactly the
		// names and IPs kube-apiserver's carries, so only its subject
		// tells it apart.
		name:     "agent certificate with the Service's names",
		cert:     ca.issue(t, node, serviceNames, append(endpointIP, net.IPv4(10, 96, 0, 1))),
		wantErr:  identity.NodesOrganization,
		wantNode: true,
	}, {
		// A node's common name without the organization is refused too.
		name:     "node common name alone",
		cert:     ca.issue(t, pkix.Name{CommonName: identity.NodeCommonName("evil")}, serviceNames, endpointIP),
		wantErr:  identity.NodeUserPrefix,
		wantNode: true,
	}, {
		// The right names from a CA the agent was not told to trust.
		name:    "certificate from another CA",
		cert:    other.issue(t, apiserver, serviceNames, endpointIP),
		wantErr: "unknown authority",
	}, {
		// By default the Service's name is checked, not the endpoint's
		// host: a certificate for the endpoint IP and another name fails.
		name:    "apiserver certificate without the Service's name",
		cert:    ca.issue(t, apiserver, []string{"apiserver.internal"}, endpointIP),
		wantErr: "kubernetes.default.svc",
	}, {
		// --upstream-server-name names what such a certificate carries.
		name:          "server name override",
		cert:          ca.issue(t, apiserver, []string{"apiserver.internal"}, nil),
		serverName:    "apiserver.internal",
		wantForwarded: true,
	}, {
		// An IP override checks that IP, as the old default did for the
		// endpoint's own.
		name:          "server name override by IP",
		cert:          ca.issue(t, apiserver, nil, endpointIP),
		serverName:    "127.0.0.1",
		wantForwarded: true,
	}, {
		// An override that names a node certificate still refuses it.
		name:       "server name override of a node certificate",
		cert:       ca.issue(t, node, nil, endpointIP),
		serverName: "127.0.0.1",
		wantErr:    identity.NodesOrganization,
		wantNode:   true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sawToken atomic.Bool
			ep := newTestEndpointWithCert(t, tc.cert, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "" {
					sawToken.Store(true)
				}
				ok(w, r)
			})
			up, err := New(Config{CAFile: ca.file, ServerName: tc.serverName, Endpoints: []*url.URL{ep.url}})
			if err != nil {
				t.Fatal(err)
			}
			front := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up.Pick()) }, Transport: up})
			defer front.Close()

			for _, r := range []struct{ method, path, upgrade string }{
				{http.MethodGet, "/api/v1/namespaces/x/configmaps", ""},
				{http.MethodPost, "/api/v1/namespaces/x/pods/p/exec", "SPDY/3.1"},
			} {
				req, _ := http.NewRequest(r.method, front.URL+r.path, nil)
				req.Header.Set("Authorization", "Bearer pod-token")
				if r.upgrade != "" {
					req.Header.Set("Connection", "Upgrade")
					req.Header.Set("Upgrade", r.upgrade)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				// A proxy in front answers the transport's refusal with
				// 502 (the agent's forwarder answers 503 and a Status).
				want := http.StatusBadGateway
				if tc.wantForwarded {
					want = http.StatusOK
				}
				if resp.StatusCode != want {
					t.Errorf("%s %s: %d, want %d", r.method, r.path, resp.StatusCode, want)
				}
			}
			checkErr := up.check(context.Background(), ep.url)
			if tc.wantForwarded {
				if got := ep.hits.Load(); got != 2 || !sawToken.Load() {
					t.Errorf("endpoint got %d requests (token: %t), want 2 with the token", got, sawToken.Load())
				}
				if checkErr != nil {
					t.Errorf("health check: %v", checkErr)
				}
				return
			}
			if got := ep.hits.Load(); got != 0 || sawToken.Load() {
				t.Errorf("refused endpoint got %d requests (token: %t)", got, sawToken.Load())
			}
			if checkErr == nil || !strings.Contains(checkErr.Error(), tc.wantErr) {
				t.Errorf("health check error = %v, want one naming %q", checkErr, tc.wantErr)
			}
			if got := errors.Is(checkErr, errNodeCertificate); got != tc.wantNode {
				t.Errorf("health check error %v: errors.Is(errNodeCertificate) = %t, want %t", checkErr, got, tc.wantNode)
			}
		})
	}
}

// TestUpstreamCAFile checks that an --upstream-ca-file the agent cannot use
// fails start-up with one line naming the flag.
func TestUpstreamCAFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		file string
		want string
	}{{
		// The file does not exist (say, no ServiceAccount token mounted).
		name: "missing",
		file: filepath.Join(dir, "missing.crt"),
		want: "reading --upstream-ca-file: open " + filepath.Join(dir, "missing.crt") + ": no such file or directory",
	}, {
		// A directory cannot be read as a file.
		name: "unreadable",
		file: dir,
		want: "reading --upstream-ca-file: read " + dir + ": is a directory",
	}, {
		// An empty file holds no CA.
		name: "empty",
		file: write("empty.crt", ""),
		want: "--upstream-ca-file " + filepath.Join(dir, "empty.crt") + " holds no PEM certificate",
	}, {
		// A PEM block that is not a certificate holds none either.
		name: "garbage",
		file: write("garbage.crt", "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"),
		want: "--upstream-ca-file " + filepath.Join(dir, "garbage.crt") + " holds no PEM certificate",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{CAFile: tc.file})
			if err == nil || err.Error() != tc.want {
				t.Errorf("New() = %v, want %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
		})
	}
}
