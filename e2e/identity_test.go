package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// identityPods numbers the pods these tests create.
var identityPods atomic.Int32

// newHostPod creates a hostNetwork pod in the agent's namespace running as
// serviceAccount.
func newHostPod(t *testing.T, ctx context.Context, c *sandbox.Cluster, prefix, serviceAccount string) *sandbox.Pod {
	t.Helper()
	return newSystemPod(t, ctx, c, prefix, serviceAccount, true)
}

// newSystemPod creates a pod in the agent's namespace running as
// serviceAccount.
func newSystemPod(t *testing.T, ctx context.Context, c *sandbox.Cluster, prefix, serviceAccount string, hostNetwork bool) *sandbox.Pod {
	t.Helper()
	pod, err := c.NewPod(ctx, sandbox.PodSpec{
		Name:           fmt.Sprintf("%s-%d", prefix, identityPods.Add(1)),
		Namespace:      sandbox.AgentNamespace,
		ServiceAccount: serviceAccount,
		HostNetwork:    hostNetwork,
	})
	if err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	return pod
}

// startApprover runs `kube-apicache approver` as the approver Deployment
// would: in a pod on the pod network, with the approver's ServiceAccount
// and the RBAC of manifests/approver.yaml, reaching kube-apiserver through
// the Service VIP with its in-cluster configuration.
func startApprover(t *testing.T, ctx context.Context, c *sandbox.Cluster) (*sandbox.Pod, *sandbox.Process) {
	t.Helper()
	pod := newSystemPod(t, ctx, c, "approver", "kube-apicache-approver", false)
	proc, err := pod.Start(agentBin, "approver", "-v=10")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "approver", 60, 10*time.Second)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if done, err := proc.Exited(); done {
			return false, fmt.Errorf("approver exited (%v): %s", err, proc.Log())
		}
		return strings.Contains(proc.Log(), "Approving kube-apicache serving certificates"), nil
	})
	if err != nil {
		t.Fatalf("approver did not start: %v", err)
	}
	return pod, proc
}

// agentCSRs returns the CSRs the agent's ServiceAccount sent, oldest first.
func agentCSRs(t *testing.T, ctx context.Context, c *sandbox.Cluster) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	list, err := c.Admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range list.Items {
		if csr.Spec.Username == sandbox.AgentUsername() {
			out = append(out, csr)
		}
	}
	slices.SortFunc(out, func(a, b certificatesv1.CertificateSigningRequest) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return out
}

func csrCondition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

// issuedCerts maps the serial of every certificate issued to the agent to
// the CSR that carried it.
func issuedCerts(t *testing.T, ctx context.Context, c *sandbox.Cluster) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for _, csr := range agentCSRs(t, ctx, c) {
		if len(csr.Status.Certificate) == 0 {
			continue
		}
		block, _ := pem.Decode(csr.Status.Certificate)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("CSR %s: %v", csr.Name, err)
		}
		out[cert.SerialNumber.String()] = cert
	}
	return out
}

// servedLeaf completes a TLS handshake with whatever answers the VIP from
// pod's network, as serverName, trusting only the pod's ca.crt.
func servedLeaf(ctx context.Context, pod *sandbox.Pod, pool *x509.CertPool, serverName string) (*x509.Certificate, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := dialVIP(dctx, pod)
	if err != nil {
		return nil, err
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: serverName})
	defer conn.Close()
	if err := conn.HandshakeContext(dctx); err != nil {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestServingIdentity is the CSR scenario, in order on one agent:
//
//  1. Given the approver running and an agent started without a
//     certificate file, the agent gets its certificate through the CSR API
//     (approved by the approver, signed by kube-controller-manager with the
//     cluster CA), and a pod's kubectl and client-go, trusting only their
//     ca.crt, work through it.
//  2. When the agent is told to renew (SIGHUP) while a pod runs requests
//     on new connections, an HTTP/2 connection and a watch, then the served
//     serial changes and no request fails.
//  3. CSRs for the kubelet-serving signer with an extra SAN, a wrong CN,
//     extra usages or from the wrong requester are denied with the reason;
//     a kubelet-style serving CSR is left alone.
//  4. The key was never written to a file, and neither it nor any token is
//     in the agent's or the approver's log at -v=10.
func TestServingIdentity(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	client := newClientPod(t, ctx, c, "e2e-identity", "client")
	pool := podCAPool(t, client)
	approverPod, approverProc := startApprover(t, ctx, c)

	// 1. The certificate comes through the CSR API.
	agentPod := newHostPod(t, ctx, c, "kube-apicache-csr", sandbox.AgentServiceAccount)
	started := time.Now()
	a, err := c.StartAgent(ctx, agentPod, agentBin, c.AgentArgs("", "", "--certificate-lifetime=10m", "-v=10")...)
	if err != nil {
		t.Fatalf("starting agent in CSR mode: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent", 80, 40*time.Second)
	figuref(t, "agent ready in CSR mode after %s", time.Since(started).Round(time.Millisecond))

	csrs := agentCSRs(t, ctx, c)
	if len(csrs) != 1 {
		t.Fatalf("agent CSRs = %d, want 1", len(csrs))
	}
	csr := csrs[0]
	if cond := csrCondition(&csr, certificatesv1.CertificateApproved); cond == nil || cond.Reason != approver.ReasonApproved {
		t.Errorf("CSR %s conditions %+v, want Approved by the approver", csr.Name, csr.Status.Conditions)
	}
	if csr.Spec.SignerName != "kubernetes.io/kubelet-serving" ||
		!slices.Equal(csr.Spec.Usages, []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}) ||
		csr.Spec.ExpirationSeconds == nil || *csr.Spec.ExpirationSeconds != 600 {
		t.Errorf("CSR spec: signer %s, usages %v, expirationSeconds %v; want kubelet-serving, [digital signature server auth], 600",
			csr.Spec.SignerName, csr.Spec.Usages, csr.Spec.ExpirationSeconds)
	}
	if got := csr.Spec.Extra[approver.NodeNameExtra]; !slices.Equal(got, certificatesv1.ExtraValue{sandbox.NodeName}) {
		t.Errorf("CSR extra %s = %v, want [%s] (Pod-bound token)", approver.NodeNameExtra, got, sandbox.NodeName)
	}
	issued := issuedCerts(t, ctx, c)
	if len(issued) != 1 {
		t.Fatalf("issued certificates = %d, want 1", len(issued))
	}
	var first *x509.Certificate
	for _, cert := range issued {
		first = cert
	}
	wantDNS := sandbox.KubernetesServiceNames()
	if !slices.Equal(first.DNSNames, wantDNS) || len(first.IPAddresses) != 2 ||
		!first.IPAddresses[0].Equal(net.ParseIP(sandbox.ServiceVIP)) || !first.IPAddresses[1].Equal(net.ParseIP(sandbox.AgentListenIP)) {
		t.Errorf("issued SANs %v %v, want %v [%s %s]", first.DNSNames, first.IPAddresses, wantDNS, sandbox.ServiceVIP, sandbox.AgentListenIP)
	}
	if first.Subject.CommonName != "system:node:"+sandbox.NodeName || !slices.Equal(first.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("issued subject %s", first.Subject)
	}
	if k, ok := first.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("issued key %T, want ECDSA P-256", first.PublicKey)
	}
	// The signer backdates NotBefore; NotAfter counts from issuance.
	if d := first.NotAfter.Sub(csr.CreationTimestamp.Time); d < 9*time.Minute || d > 11*time.Minute {
		t.Errorf("issued certificate expires %s after the CSR, want about 10m (expirationSeconds honoured)", d)
	}
	// Every name and IP pods may dial verifies with only the pod's ca.crt,
	// and the agent serves exactly the certificate the CSR carried.
	for _, name := range append(wantDNS, sandbox.ServiceVIP) {
		served, err := servedLeaf(ctx, client, pool, name)
		if err != nil {
			t.Fatalf("TLS to the VIP as %s: %v", name, err)
		}
		if served.SerialNumber.Cmp(first.SerialNumber) != 0 {
			t.Errorf("served serial %s as %s, want the issued %s", served.SerialNumber, name, first.SerialNumber)
		}
	}
	figuref(t, "CSR %s approved (%s), issued serial %s expiring %s after the CSR, served for %d names",
		csr.Name, approver.ReasonApproved, first.SerialNumber, first.NotAfter.Sub(csr.CreationTimestamp.Time).Round(time.Second), len(wantDNS)+1)

	before := agentRequests(t, ctx, a)
	mustKubectl(t, ctx, client, "get", "configmaps")
	// kubectl verifies the agent under the Service's full DNS name too.
	mustKubectl(t, ctx, client, "get", "configmaps", "--tls-server-name=kubernetes.default.svc."+sandbox.ClusterDomain)
	out, err := client.Command(ctx, podclientBin, "crud", "--name", "identity-crud").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "deleted identity-crud") {
		t.Errorf("client-go crud through the agent: %v\n%s", err, out)
	}
	after := agentRequests(t, ctx, a)
	if after["list"] <= before["list"] || after["create"] <= before["create"] {
		t.Errorf("agent request counts before %v after %v: kubectl and client-go did not go through the agent", before, after)
	}
	metrics, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kube_apicache_serving_certificate_ready 1",
		`kube_apicache_serving_certificate_renewals_total{result="issued"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if got := gaugeValue(t, metrics, "kube_apicache_serving_certificate_expiration_timestamp_seconds"); got != float64(first.NotAfter.Unix()) {
		t.Errorf("expiration metric %v, want %d", got, first.NotAfter.Unix())
	}

	// 2. Forced renewal under load.
	rotateUnderLoad(t, ctx, c, a, client, pool, first)

	// 3. Bad CSRs are denied with a reason.
	denyBadCSRs(t, ctx, c, agentPod)

	// 4. No key on disk, no secrets in logs.
	served, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	assertKeyNotOnDisk(t, a, served, started)
	agentLog, approverLog := a.Process.Log(), approverProc.Log()
	if !strings.Contains(agentLog, "Certificate signing request created") {
		t.Errorf("agent log at -v=10 lacks the CSR creation: the log check would be vacuous")
	}
	for name, log := range map[string]string{"agent": agentLog, "approver": approverLog} {
		for what, secret := range map[string]string{
			"the agent's token":    agentPod.Token,
			"the client's token":   client.Token,
			"the approver's token": approverPod.Token,
			"a private key":        "PRIVATE KEY",
		} {
			if strings.Contains(log, secret) {
				t.Errorf("%s log (%d bytes at -v=10) contains %s", name, len(log), what)
			}
		}
		figuref(t, "%s log at -v=10: %d bytes, %d lines, no token or key", name, len(log), strings.Count(log, "\n"))
	}
}

// rotateUnderLoad forces a renewal while a pod keeps a watch (kubectl), a
// client-go informer, an HTTP/2 connection and a stream of new TLS
// connections busy, and checks that none of them sees an error and that
// the served serial changes to a newly issued one.
func rotateUnderLoad(t *testing.T, ctx context.Context, c *sandbox.Cluster, a *sandbox.Agent, pod *sandbox.Pod, pool *x509.CertPool, first *x509.Certificate) {
	ns := pod.Spec.Namespace
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch := pod.Command(watchCtx, "kubectl", "get", "configmaps", "--watch-only", "-o", "name")
	waitWatch := lineReader(t, watch)
	inf := pod.Command(watchCtx, podclientBin, "informer")
	waitInf := lineReader(t, inf)
	if err := waitInf("SYNCED", 30*time.Second); err != nil {
		t.Fatalf("informer: %v", err)
	}
	time.Sleep(time.Second) // let kubectl's watch open

	type result struct {
		requests, failures atomic.Int64
		mu                 sync.Mutex
		errs               []string
		serials            map[string]int
	}
	var fresh, h2 result
	fresh.serials, h2.serials = map[string]int{}, map[string]int{}
	loop := func(r *result, hc *http.Client, stop <-chan struct{}) {
		url := vipURL("/api/v1/namespaces/" + ns + "/configmaps?limit=1")
		for i := 0; i < 5000; i++ { // bounded: at most a few minutes
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("Authorization", "Bearer "+pod.Token)
			resp, err := hc.Do(req)
			r.requests.Add(1)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %s", resp.Status)
				}
			}
			r.mu.Lock()
			if err != nil {
				r.failures.Add(1)
				if len(r.errs) < 5 {
					r.errs = append(r.errs, err.Error())
				}
			} else {
				r.serials[resp.TLS.PeerCertificates[0].SerialNumber.String()]++
			}
			r.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { loop(&fresh, vipClient(t, pod, false), stop) }) // a new TLS connection per request
	wg.Go(func() { loop(&h2, vipClient(t, pod, true), stop) })     // one HTTP/2 connection throughout
	time.Sleep(2 * time.Second)

	if err := a.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	hup := time.Now()
	var second *x509.Certificate
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		served, err := servedLeaf(ctx, pod, pool, "kubernetes.default.svc")
		if err != nil {
			return false, err
		}
		if served.SerialNumber.Cmp(first.SerialNumber) != 0 {
			second = served
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("served serial did not change after SIGHUP: %v", err)
	}
	renewal := time.Since(hup)
	// Events after the rotation still reach the watch and the informer
	// opened before it.
	createConfigMap(t, ctx, c, ns, "after-rotation")
	if err := waitWatch("configmap/after-rotation", 30*time.Second); err != nil {
		t.Errorf("kubectl watch across the rotation: %v", err)
	}
	if err := waitInf("ADDED after-rotation", 30*time.Second); err != nil {
		t.Errorf("informer across the rotation: %v", err)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	stopWatch()
	_ = watch.Wait()
	_ = inf.Wait()

	issued := issuedCerts(t, ctx, c)
	if issued[second.SerialNumber.String()] == nil {
		t.Errorf("served serial %s after renewal is not one the CSR API issued", second.SerialNumber)
	}
	if bytes.Equal(second.RawSubjectPublicKeyInfo, first.RawSubjectPublicKeyInfo) {
		t.Errorf("renewed certificate reuses the old key")
	}
	for name, r := range map[string]*result{"new connection per request": &fresh, "one HTTP/2 connection": &h2} {
		if r.failures.Load() != 0 {
			t.Errorf("%s: %d of %d requests failed during rotation: %q", name, r.failures.Load(), r.requests.Load(), r.errs)
		}
		figuref(t, "%s: %d requests, %d failures, served serials %v", name, r.requests.Load(), r.failures.Load(), r.serials)
	}
	if len(fresh.serials) < 2 {
		t.Errorf("new connections saw serials %v, want the old and the new", fresh.serials)
	}
	figuref(t, "renewal after SIGHUP served within %s (serial %s -> %s)", renewal.Round(time.Millisecond), first.SerialNumber, second.SerialNumber)
}

// denyBadCSRs submits CSRs that are each wrong in one way and checks that
// the approver denies each with the reason, and leaves a kubelet-style CSR
// for the node's own names alone.
func denyBadCSRs(t *testing.T, ctx context.Context, c *sandbox.Cluster, agentPod *sandbox.Pod) {
	// Another ServiceAccount, bound to a Pod on the node, that may create
	// CSRs (as kubelets' bootstrap identity may).
	other := newHostPod(t, ctx, c, "csr-requester", "csr-requester")
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-csr-requester"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "csr-requester", Namespace: sandbox.AgentNamespace}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	clientFor := func(token string) kubernetes.Interface {
		cfg := &rest.Config{
			Host:            c.APIServers()[0].URL,
			BearerToken:     token,
			TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM},
			Dial:            c.CP.DialContext,
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	asAgent, asOther := clientFor(agentPod.Token), clientFor(other.Token)

	good := func() *x509.CertificateRequest {
		return &x509.CertificateRequest{
			Subject:     pkix.Name{CommonName: "system:node:" + sandbox.NodeName, Organization: []string{"system:nodes"}},
			DNSNames:    sandbox.KubernetesServiceNames(),
			IPAddresses: []net.IP{net.ParseIP(sandbox.ServiceVIP), net.ParseIP(sandbox.AgentListenIP)},
		}
	}
	serving := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	tests := []struct {
		name       string
		client     kubernetes.Interface
		edit       func(*x509.CertificateRequest)
		usages     []certificatesv1.KeyUsage
		wantReason string // empty: left pending
		wantInMsg  string
	}{
		{name: "extra-san", client: asAgent, usages: serving,
			edit:       func(r *x509.CertificateRequest) { r.DNSNames = append(r.DNSNames, "evil.example.com") },
			wantReason: approver.ReasonWrongSANs, wantInMsg: "evil.example.com"},
		{name: "wrong-cn", client: asAgent, usages: serving,
			edit:       func(r *x509.CertificateRequest) { r.Subject.CommonName = "system:node:other-node" },
			wantReason: approver.ReasonNodeMismatch, wantInMsg: "system:node:other-node"},
		{name: "extra-usages", client: asAgent,
			usages:     append(slices.Clone(serving), certificatesv1.UsageClientAuth),
			wantReason: approver.ReasonWrongUsages, wantInMsg: "client auth"},
		{name: "wrong-requester", client: asOther, usages: serving,
			wantReason: approver.ReasonWrongRequester, wantInMsg: "system:serviceaccount:kube-apicache:csr-requester"},
		{name: "kubelet-style", client: asOther, usages: serving,
			edit: func(r *x509.CertificateRequest) {
				r.DNSNames, r.IPAddresses = []string{sandbox.NodeName}, []net.IP{net.ParseIP(sandbox.NodeIP)}
			}},
	}
	names := map[string]string{}
	for _, tc := range tests {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := good()
		if tc.edit != nil {
			tc.edit(tmpl)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		obj := &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-" + tc.name + "-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
				SignerName: "kubernetes.io/kubelet-serving",
				Usages:     tc.usages,
			},
		}
		created, err := tc.client.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: creating CSR: %v", tc.name, err)
		}
		names[tc.name] = created.Name
	}
	for _, tc := range tests {
		if tc.wantReason == "" {
			continue
		}
		var got *certificatesv1.CertificateSigningRequest
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			got, err = c.Admin.CertificatesV1().CertificateSigningRequests().Get(ctx, names[tc.name], metav1.GetOptions{})
			return err == nil && len(got.Status.Conditions) > 0, nil
		})
		if err != nil {
			t.Errorf("%s: CSR %s not decided: %v", tc.name, names[tc.name], err)
			continue
		}
		cond := csrCondition(got, certificatesv1.CertificateDenied)
		switch {
		case cond == nil || csrCondition(got, certificatesv1.CertificateApproved) != nil:
			t.Errorf("%s: conditions %+v, want Denied only", tc.name, got.Status.Conditions)
		case cond.Reason != tc.wantReason || !strings.Contains(cond.Message, tc.wantInMsg):
			t.Errorf("%s: Denied %s %q, want %s mentioning %q", tc.name, cond.Reason, cond.Message, tc.wantReason, tc.wantInMsg)
		default:
			figuref(t, "%s: Denied, reason %s: %s", tc.name, cond.Reason, cond.Message)
		}
		if len(got.Status.Certificate) > 0 {
			t.Errorf("%s: a certificate was issued", tc.name)
		}
	}
	// The approver has decided the others by now; the kubelet-style CSR
	// must still be pending.
	time.Sleep(time.Second)
	got, err := c.Admin.CertificatesV1().CertificateSigningRequests().Get(ctx, names["kubelet-style"], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 0 {
		t.Errorf("kubelet-style CSR: conditions %+v, want none (not the approver's)", got.Status.Conditions)
	} else {
		figuref(t, "kubelet-style CSR %s left pending", got.Name)
	}
}

// assertKeyNotOnDisk checks every file the agent could have written (its
// pod directory, its private /run and /tmp, the machine's temp directory,
// its open files) for a private key matching the served certificate.
func assertKeyNotOnDisk(t *testing.T, a *sandbox.Agent, served *x509.Certificate, since time.Time) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", a.Process.Pid())
	dirs := []string{a.Pod.Dir, root + "/run", root + "/tmp", os.TempDir()}
	scanned, keys := 0, 0
	check := func(path string) {
		data, err := os.ReadFile(path)
		if err != nil {
			return
		}
		scanned++
		for rest := data; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if !strings.Contains(block.Type, "PRIVATE KEY") {
				continue
			}
			keys++
			if keyMatches(block, served.PublicKey) {
				t.Errorf("%s holds the serving certificate's private key", path)
			}
		}
		if bytes.Contains(data, []byte("PRIVATE KEY")) && bytes.Contains(data, served.Raw[:64]) {
			t.Errorf("%s holds a key next to the serving certificate", path)
		}
	}
	for _, dir := range dirs {
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() {
				if path != dir && (d.Name() == "etcd-data" || strings.HasPrefix(d.Name(), "go-build")) {
					return filepath.SkipDir
				}
				return nil
			}
			info, err := d.Info()
			if err != nil || !info.Mode().IsRegular() || info.Size() > 1<<20 {
				return nil
			}
			if dir == os.TempDir() && info.ModTime().Before(since) {
				return nil // only what was written while the agent ran
			}
			check(path)
			return nil
		})
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.Process.Pid()))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", a.Process.Pid(), fd.Name()))
		if err == nil && strings.HasPrefix(target, "/") && !strings.HasPrefix(target, "/dev/") {
			check(target)
		}
	}
	if scanned == 0 {
		t.Fatalf("scanned no files; the check would be vacuous")
	}
	figuref(t, "key not on disk: scanned %d files (%d other private keys, none the serving key) in %v and the agent's %d open fds", scanned, keys, dirs, len(fds))
}

func keyMatches(block *pem.Block, pub crypto.PublicKey) bool {
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return false
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return false
	}
	eq, ok := s.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(pub)
}

// TestUntrustedServingCertificate: given certificate files from a CA the
// pods do not trust, the agent does not install its redirect, reports why
// on /readyz and in its log, and pods keep reaching kube-apiserver. When
// the files are replaced with a certificate from the cluster CA, the agent
// picks them up without a restart and starts intercepting; when they go
// back to the untrusted one, it stops again.
func TestUntrustedServingCertificate(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := newClientPod(t, ctx, c, "e2e-untrusted", "client")
	pool := podCAPool(t, client)
	pod := newHostPod(t, ctx, c, "kube-apicache-untrusted", sandbox.AgentServiceAccount)

	other, err := sandbox.NewCA("some-other-ca")
	if err != nil {
		t.Fatal(err)
	}
	spec := sandbox.CertSpec{
		CommonName:   "system:node:" + sandbox.NodeName,
		Organization: []string{"system:nodes"},
		DNSNames:     sandbox.KubernetesServiceNames(),
		IPs:          []net.IP{net.ParseIP(sandbox.ServiceVIP), net.ParseIP(sandbox.AgentListenIP)},
		Server:       true,
	}
	untrusted, err := other.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := c.CA.Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(pod.Dir, "tls.crt"), filepath.Join(pod.Dir, "tls.key")
	install := func(kp *sandbox.KeyPair) {
		// Key first, then certificate, each replaced atomically.
		for _, f := range []struct {
			path string
			data []byte
		}{{keyFile, kp.KeyPEM}, {certFile, kp.CertPEM}} {
			tmp := f.path + ".new"
			if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, f.path); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(untrusted)

	proc, err := pod.Start(agentBin, c.AgentArgs(certFile, keyFile)...)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, proc, "agent", 60, 40*time.Second)

	// Then: not ready, with the reason.
	var body string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if done, err := proc.Exited(); done {
			return false, fmt.Errorf("agent exited (%v)", err)
		}
		code, b, err := agentEndpoint(ctx, c, "/intercepting")
		body = b
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(b, "does not verify"), nil
	})
	if err != nil {
		t.Fatalf("/intercepting never gave the trust failure (last body %q): %v", body, err)
	}
	figuref(t, "/intercepting: %s", strings.TrimSpace(body))
	for _, want := range []string{"certificate signed by unknown authority", "some-other-ca"} {
		if !strings.Contains(body, want) {
			t.Errorf("/intercepting body %q lacks %q", body, want)
		}
	}
	time.Sleep(3 * time.Second) // several sync periods
	nat, _, err := c.NodeNetState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, sandbox.AgentChain) {
		t.Errorf("redirect installed with an untrusted certificate:\n%s", nat)
	}
	if log := proc.Log(); !strings.Contains(log, "Serving certificate cannot be used to intercept") || !strings.Contains(log, "unknown authority") {
		t.Errorf("agent log does not say why it does not intercept:\n%s", tailLines(log, 30))
	}
	quick, cancelQuick := context.WithTimeout(ctx, 15*time.Second)
	mustKubectl(t, quick, client, "get", "configmaps")
	cancelQuick()
	if served, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc"); err != nil || served.Subject.CommonName != "kube-apiserver" {
		t.Errorf("pods do not reach kube-apiserver directly: %v %v", served, err)
	}

	// When the files are replaced with a trusted certificate, then the
	// agent starts intercepting without a restart.
	install(trusted)
	a := &sandbox.Agent{Pod: pod, Process: proc}
	if err := a.WaitReady(ctx); err != nil {
		t.Fatalf("agent did not become ready after the trusted certificate was installed: %v", err)
	}
	served, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
	if err != nil || served.SerialNumber.Cmp(trusted.Cert.SerialNumber) != 0 {
		t.Fatalf("pod got %v (%v), want the agent's new certificate %s", served, err, trusted.Cert.SerialNumber)
	}
	figuref(t, "reloaded trusted certificate %s is served through the VIP", served.SerialNumber)

	// When they go back to the untrusted one, then interception stops.
	install(untrusted)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		served, err := servedLeaf(ctx, client, pool, "kubernetes.default.svc")
		return err == nil && served.Subject.CommonName == "kube-apiserver", nil
	})
	if err != nil {
		t.Fatalf("pods still reach the agent after its certificate stopped verifying: %v", err)
	}
	if code, b, err := agentEndpoint(ctx, c, "/intercepting"); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(b, "does not verify") {
		t.Errorf("/intercepting = %d %q (%v), want 503 with the trust failure", code, b, err)
	}
	figuref(t, "certificate that stopped verifying: pods go to kube-apiserver again")
}
