package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// eksApproverRole is the name the scenario gives the approver ClusterRole
// that manifests/components/eks-signer renders, beside the shipped one.
const eksApproverRole = "kube-apicache:approver-eks-e2e"

// TestEKSSigner is the Amazon EKS scenario, on a signer that behaves as
// EKS's beta.eks.amazonaws.com/app-serving is documented to
// (sandbox.EKSSigner: the cluster CA, one year whatever is asked, no
// client auth):
//
//  1. Given the approver's RBAC as manifests/components/eks-signer renders
//     it, the approver and the agent both run with that signer's
//     --signer-name, and the agent asks for ten minutes.
//  2. Then the agent gets its certificate: one CSR for that signer, with
//     key encipherment, digital signature and server auth and no client
//     auth, approved by the approver, issued by the cluster CA for one
//     year; the agent serves it although it is not the lifetime asked
//     for, and says so in its log.
//  3. And a pod, trusting only its ca.crt, verifies the agent and works
//     through it.
func TestEKSSigner(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	signerFlag := "--signer-name=" + sandbox.EKSAppServingSignerName
	before := map[string]bool{}
	for _, csr := range agentCSRs(t, ctx, c) {
		before[csr.Name] = true
	}
	t.Cleanup(func() {
		// Leave no CSR behind for the other CSR tests.
		for _, csr := range newAgentCSRs(t, context.Background(), c, before) {
			_ = c.Admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
		}
	})

	// 1. The approver's right to approve for the EKS signer, from the
	// component, under a name of its own so the shipped role stays.
	objs, err := sandbox.RenderComponent(ctx, t.TempDir(), "eks-signer")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	for _, obj := range objs {
		if r, ok := obj.(*rbacv1.ClusterRole); ok && r.Name == "kube-apicache:approver" {
			role = r
		}
	}
	if role == nil {
		t.Fatal("the eks-signer rendering has no ClusterRole kube-apicache:approver")
	}
	role.Name = eksApproverRole
	rbac := c.Admin.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: eksApproverRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: eksApproverRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "kube-apicache-approver", Namespace: sandbox.AgentNamespace}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = rbac.ClusterRoleBindings().Delete(ctx, eksApproverRole, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, eksApproverRole, metav1.DeleteOptions{})
	})

	signerCtx, stopSigner := context.WithCancel(ctx)
	signerDone := make(chan error, 1)
	go func() { signerDone <- sandbox.NewEKSSigner(c.Admin, c.CA).Run(signerCtx) }()
	t.Cleanup(func() {
		stopSigner()
		if err := <-signerDone; err != nil && !t.Failed() {
			t.Errorf("EKS-like signer: %v", err)
		}
	})

	// No leader election: the scenario's approver decides at once, and
	// another scenario's Lease cannot hold it up.
	_, approverProc := startApproverReplica(t, ctx, c, signerFlag, "--leader-elect=false")
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if done, err := approverProc.Exited(); done {
			return false, fmt.Errorf("approver exited (%v): %s", err, approverProc.Log())
		}
		return strings.Contains(approverProc.Log(), "Approving kube-apicache serving certificates"), nil
	})
	if err != nil {
		t.Fatalf("approver did not start: %v", err)
	}

	client := newClientPod(t, ctx, c, "e2e-eks-signer", "client")
	pool := podCAPool(t, client)
	agentPod := newHostPod(t, ctx, c, "kube-apicache-eks", sandbox.AgentServiceAccount)
	started := time.Now()
	a, err := c.StartAgent(ctx, agentPod, agentBin, c.AgentArgs("", "", signerFlag, "--certificate-lifetime=10m")...)
	if err != nil {
		t.Fatalf("starting the agent with the EKS signer: %v", err)
	}
	stopOnCleanup(t, a.Process, "agent", 60, 40*time.Second)
	figuref(t, "agent ready with the EKS-like signer after %s", time.Since(started).Round(time.Millisecond))

	// 2. One CSR, as EKS takes it, approved by the approver.
	csrs := newAgentCSRs(t, ctx, c, before)
	if len(csrs) != 1 {
		t.Fatalf("agent CSRs = %d, want 1", len(csrs))
	}
	csr := csrs[0]
	if csr.Spec.SignerName != sandbox.EKSAppServingSignerName {
		t.Errorf("CSR %s signer %s, want %s", csr.Name, csr.Spec.SignerName, sandbox.EKSAppServingSignerName)
	}
	wantUsages := []certificatesv1.KeyUsage{certificatesv1.UsageKeyEncipherment, certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	if !slices.Equal(csr.Spec.Usages, wantUsages) || slices.Contains(csr.Spec.Usages, certificatesv1.UsageClientAuth) {
		t.Errorf("CSR %s usages %q, want exactly %q (no client auth)", csr.Name, csr.Spec.Usages, wantUsages)
	}
	if csr.Spec.ExpirationSeconds == nil || *csr.Spec.ExpirationSeconds != 600 {
		t.Errorf("CSR %s expirationSeconds %v, want 600 (the agent's --certificate-lifetime)", csr.Name, csr.Spec.ExpirationSeconds)
	}
	if cond := csrCondition(&csr, certificatesv1.CertificateApproved); cond == nil || cond.Reason != approver.ReasonApproved {
		t.Errorf("CSR %s conditions %+v, want Approved by the approver", csr.Name, csr.Status.Conditions)
	}
	if cond := csrCondition(&csr, certificatesv1.CertificateFailed); cond != nil {
		t.Errorf("CSR %s failed at the signer: %s: %s", csr.Name, cond.Reason, cond.Message)
	}
	block, _ := pem.Decode(csr.Status.Certificate)
	if block == nil {
		t.Fatalf("CSR %s carries no certificate", csr.Name)
	}
	issued, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := issued.CheckSignatureFrom(c.CA.Cert); err != nil {
		t.Errorf("issued certificate is not signed by the cluster CA: %v", err)
	}
	if got := issued.NotAfter.Sub(issued.NotBefore); got != sandbox.EKSAppServingLifetime {
		t.Errorf("issued for %s, want one year (%s) although the agent asked for 10m", got, sandbox.EKSAppServingLifetime)
	}
	if slices.Contains(issued.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("issued certificate allows client auth")
	}
	if log := a.Process.Log(); !strings.Contains(log, "Serving certificate issued") || !strings.Contains(log, "8760h0m0s") {
		t.Errorf("agent log lacks the issued certificate's one-year lifetime:\n%s", grepLines(log, "Serving certificate"))
	}

	// 3. Pods verify the agent with their ca.crt, and work through it.
	for _, name := range append(sandbox.KubernetesServiceNames(), sandbox.ServiceVIP) {
		served, err := servedLeaf(ctx, client, pool, name)
		if err != nil {
			t.Fatalf("TLS to the VIP as %s with the pod's ca.crt: %v", name, err)
		}
		if served.SerialNumber.Cmp(issued.SerialNumber) != 0 {
			t.Errorf("served serial %s as %s, want the issued %s", served.SerialNumber, name, issued.SerialNumber)
		}
	}
	reqBefore := agentRequests(t, ctx, a)
	mustKubectl(t, ctx, client, "get", "configmaps")
	if after := agentRequests(t, ctx, a); after["list"] <= reqBefore["list"] {
		t.Errorf("agent request counts before %v after %v: kubectl did not go through the agent", reqBefore, after)
	}
	figuref(t, "EKS-like signer: CSR %s approved, issued by the cluster CA for %s (10m asked), served to pods",
		csr.Name, issued.NotAfter.Sub(issued.NotBefore))
}
