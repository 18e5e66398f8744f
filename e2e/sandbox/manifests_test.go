package sandbox

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestEKSSignerComponent: manifests/components/eks-signer renders over the
// shipped manifests, gives the agents and the approver
// --signer-name=beta.eks.amazonaws.com/app-serving, and moves the
// approver's approve right from kubelet-serving to that signer alone.
func TestEKSSignerComponent(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil && os.Getenv("KUBECTL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl is needed to render the manifests")
		}
		t.Skip("no kubectl to render the manifests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := RenderComponent(ctx, t.TempDir(), "eks-signer")
	if err != nil {
		t.Fatal(err)
	}
	flag := "--signer-name=" + EKSAppServingSignerName
	seen := map[string]bool{}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			seen["daemonset"] = true
			if args := o.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, flag) {
				t.Errorf("DaemonSet %s args %q lack %s", o.Name, args, flag)
			}
		case *appsv1.Deployment:
			seen["deployment"] = true
			if args := o.Spec.Template.Spec.Containers[0].Args; o.Name != "kube-apicache-approver" || !slices.Contains(args, flag) {
				t.Errorf("Deployment %s args %q lack %s", o.Name, args, flag)
			}
		case *rbacv1.ClusterRole:
			for _, r := range o.Rules {
				if !slices.Contains(r.Resources, "signers") {
					continue
				}
				seen["signers"] = true
				if o.Name != "kube-apicache:approver" || !slices.Equal(r.ResourceNames, []string{EKSAppServingSignerName}) ||
					!slices.Equal(r.Verbs, []string{"approve"}) || !slices.Equal(r.APIGroups, []string{"certificates.k8s.io"}) {
					t.Errorf("ClusterRole %s grants %v on signers %q, want approve on %s alone", o.Name, r.Verbs, r.ResourceNames, EKSAppServingSignerName)
				}
			}
		}
	}
	for _, want := range []string{"daemonset", "deployment", "signers"} {
		if !seen[want] {
			t.Errorf("the rendering has no %s", want)
		}
	}
}
