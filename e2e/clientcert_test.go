package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// issueClientCertificate has kube-controller-manager issue a client
// certificate for user through the CSR API (signer
// kubernetes.io/kube-apiserver-client, approved by the admin), as the
// upstream "building a client with a CSR" conformance spec does; it
// returns the certificate and key in PEM.
func issueClientCertificate(t *testing.T, ctx context.Context, c *sandbox.Cluster, user string) (certPEM, keyPEM []byte) {
	t.Helper()
	request, keyPEM := newCSR(t, user)
	expiry := int32(3600)
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-client-cert-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:           request,
			SignerName:        certificatesv1.KubeAPIServerClientSignerName,
			ExpirationSeconds: &expiry,
			Usages:            []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	csrs := c.Admin.CertificatesV1().CertificateSigningRequests()
	created, err := csrs.Create(ctx, csr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = csrs.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
	created.Status.Conditions = append(created.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "E2E", Message: "client certificate scenario",
	})
	if _, err := csrs.UpdateApproval(ctx, created.Name, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := csrs.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		certPEM = got.Status.Certificate
		return len(certPEM) > 0, nil
	})
	if err != nil {
		t.Fatalf("waiting for the client certificate: %v", err)
	}
	return certPEM, keyPEM
}

// newCSR returns a PEM certificate request for commonName and its new key.
func newCSR(t *testing.T, commonName string) (csrPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// certClient is a client-go clientset that authenticates with a client
// certificate, from inside pod's network namespace, to host.
func certClient(t *testing.T, pod *sandbox.Pod, host string, certPEM, keyPEM []byte, userAgent string) kubernetes.Interface {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(pod.Dir, "serviceaccount", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{
		Host:            host,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: certPEM, KeyData: keyPEM},
		Dial:            pod.NetNS.DialContext,
		Timeout:         30 * time.Second,
		UserAgent:       userAgent,
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// uaCertVIP is the User-Agent of the certificate client's calls through
// the VIP.
const uaCertVIP = "kube-apicache-e2e/client-cert"

// TestClientCertificateCaller is the client-certificate scenario.
//
// Given an intercepting agent, and a pod whose client authenticates to the
// kubernetes Service with a client certificate the cluster issued through
// the CSR API (no token), allowed to read and write ConfigMaps in one
// namespace and nothing else,
// when the pod lists, creates and gets ConfigMaps and tries to read a
// Secret, through the Service VIP and directly,
// then every call has the same outcome both ways (allowed ones succeed; the
// Secret is forbidden to the certificate's own user, not to
// system:anonymous); kube-apiserver's audit log shows the certificate's
// user from the pod's address for each call made through the VIP; the
// agent counted the hand-off; and a host-network caller presenting a
// certificate, which the agent cannot steer by source, gets a 401 that
// says why instead of being forwarded as someone else.
func TestClientCertificateCaller(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := startAgent(t, ctx, c)
	const ns, user = "client-cert", "e2e-cert-caller"
	pod := newClientPod(t, ctx, c, ns, "cert-pod")
	pool := podCAPool(t, pod)
	waitFor(t, 10*time.Second, "the pod is intercepted", func() bool {
		leaf, err := servedLeaf(ctx, pod, pool, "kubernetes.default.svc")
		return err == nil && leaf.Subject.CommonName == "system:node:"+sandbox.NodeName
	})

	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create"}}}}
	if _, err := c.Admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if _, err := c.Admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	certPEM, keyPEM := issueClientCertificate(t, ctx, c, user)

	t0 := time.Now()
	// calls runs the same calls with cs and returns their outcomes.
	calls := func(cs kubernetes.Interface, suffix string) (outcomes []string, firstCall time.Duration) {
		t.Helper()
		cms := cs.CoreV1().ConfigMaps(ns)
		start := time.Now()
		_, err := cms.List(ctx, metav1.ListOptions{})
		firstCall = time.Since(start)
		outcomes = append(outcomes, outcome("list configmaps", err))
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "by-cert-" + suffix}}, metav1.CreateOptions{})
		outcomes = append(outcomes, outcome("create configmap", err))
		_, err = cms.Get(ctx, "by-cert-"+suffix, metav1.GetOptions{})
		outcomes = append(outcomes, outcome("get configmap", err))
		_, err = cs.CoreV1().Secrets(ns).Get(ctx, "absent", metav1.GetOptions{})
		outcomes = append(outcomes, outcome("get secret", err))
		return outcomes, firstCall
	}
	viaVIP, took := calls(certClient(t, pod, vipURL(""), certPEM, keyPEM, uaCertVIP), "vip")
	direct, _ := calls(certClient(t, pod, c.APIServers()[0].URL, certPEM, keyPEM, uaCertVIP+"-direct"), "direct")
	figuref(t, "client certificate: the first call through the VIP took %s (one 429 with Retry-After: 1, then kube-apiserver through kube-proxy)", took.Round(time.Millisecond))
	for i := range direct {
		if i >= len(viaVIP) || viaVIP[i] != direct[i] {
			t.Errorf("through the VIP %q, directly %q", viaVIP, direct)
			break
		}
	}
	if want := fmt.Sprintf("User %q cannot get", user); !strings.HasPrefix(viaVIP[3], "get secret: Forbidden: ") || !strings.Contains(viaVIP[3], want) {
		t.Errorf("the secret through the VIP: %q, want Forbidden to %q", viaVIP[3], user)
	}
	for _, o := range viaVIP[:3] {
		if !strings.HasSuffix(o, ": ok") {
			t.Errorf("through the VIP: %s", o)
		}
	}

	// kube-apiserver saw the certificate's user, from the pod, for each
	// call made through the VIP.
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		seen = nil
		for _, e := range auditEvents(t, c, func(e *auditv1.Event) bool {
			return e.Stage == auditv1.StageResponseComplete && e.UserAgent == uaCertVIP &&
				!e.RequestReceivedTimestamp.Time.Before(t0)
		}) {
			seen = append(seen, fmt.Sprintf("%s %s from %v as %s: %d", e.Verb, e.ObjectRef.Resource, e.SourceIPs, e.User.Username, e.ResponseStatus.Code))
		}
		return len(seen) >= 4, nil
	})
	if err != nil {
		t.Errorf("audit events of the certificate's calls through the VIP: %q, want 4", seen)
	}
	for _, s := range seen {
		if !strings.Contains(s, " as "+user+": ") || !strings.Contains(s, "["+pod.IP+"]") {
			t.Errorf("audit event not as the certificate's user from the pod: %s", s)
		}
	}
	figuref(t, "client certificate: kube-apiserver audited %d calls of the pod, all as %s", len(seen), user)
	text, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `kube_apicache_client_certificate_requests_total{outcome="bypassed"} 1`) {
		t.Errorf("the agent did not count one hand-off:\n%s", grepLines(text, "client_certificate"))
	}

	// A host-network caller with a certificate: 401, with the reason.
	host, err := c.NewPod(ctx, sandbox.PodSpec{Name: "cert-host", Namespace: ns, HostNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = certClient(t, host, vipURL(""), certPEM, keyPEM, uaCertVIP).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) || !strings.Contains(err.Error(), "cannot pass a TLS client certificate on") {
		t.Errorf("host-network caller with a certificate: %v, want 401 with the reason", err)
	}
	if code, body, err := agentEndpoint(ctx, c, "/intercepting"); code != http.StatusOK {
		t.Errorf("/intercepting = %d %q (%v): the node must stay intercepted", code, body, err)
	}
}

// outcome is what an API call gave, for comparison: ok, or the error's
// reason and message.
func outcome(call string, err error) string {
	if err == nil {
		return call + ": ok"
	}
	return fmt.Sprintf("%s: %s: %s", call, apierrors.ReasonForError(err), err)
}
