package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
	rewritev1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
	"github.com/kube-apicache/kube-apicache/agent/rewrite"
)

// TestEKSSignerComponent: manifests/components/eks-signer renders over the
// shipped manifests, gives the agents and the approver
// --signer-name=beta.eks.amazonaws.com/app-serving, and moves the
// approver's approve right from kubelet-serving to that signer alone.
func TestEKSSignerComponent(t *testing.T) {
	needKubectl(t)
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

// needKubectl skips the test where no kubectl renders the manifests
// (outside CI).
func needKubectl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil && os.Getenv("KUBECTL") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl is needed to render the manifests")
		}
		t.Skip("no kubectl to render the manifests")
	}
}

// TestRewritingComponent: manifests/components/rewriting renders over the
// shipped manifests into a configuration whose merged keys set
// rewriting.configFile, a DaemonSet that mounts the ConfigMap holding that
// file where the field points, and a RewriteConfiguration there that
// decodes, validates and builds the profiles' rewriters; the profiles are
// not in the configuration ConfigMap, whose keys are all
// AgentConfigurations.
func TestRewritingComponent(t *testing.T) {
	needKubectl(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := RenderComponent(ctx, t.TempDir(), "rewriting")
	if err != nil {
		t.Fatal(err)
	}
	configMaps := map[string]*corev1.ConfigMap{}
	var ds *appsv1.DaemonSet
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			configMaps[o.Namespace+"/"+o.Name] = o
		case *appsv1.DaemonSet:
			if o.Name == "kube-apicache" {
				ds = o
			}
		}
	}
	config := configMaps[AgentNamespace+"/kube-apicache-config"]
	if config == nil || ds == nil {
		t.Fatalf("the rendering lacks ConfigMap kube-apicache-config (%v) or DaemonSet kube-apicache (%v)", config != nil, ds != nil)
	}
	// As the agents' watch of the kill switch reads it, and as the mounted
	// directory merges: every .yaml key an AgentConfiguration.
	merged, err := configv1alpha1.MergeData(config.Data, "config.yaml")
	if err != nil {
		t.Fatalf("kube-apicache-config: %v", err)
	}
	file := merged.Rewriting.ConfigFile
	if file == nil || *file == "" {
		t.Fatal("the merged configuration sets no rewriting.configFile")
	}
	dir, key := path.Split(*file)
	c := ds.Spec.Template.Spec.Containers[0]
	var volume string
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) && m.SubPath == "" {
			volume = m.Name
			if !m.ReadOnly {
				t.Errorf("mount %s at %s is not read-only", m.Name, m.MountPath)
			}
		}
	}
	if volume == "" {
		t.Fatalf("no volume is mounted at %s, where rewriting.configFile %s lies", dir, *file)
	}
	var cmName string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	cm := configMaps[AgentNamespace+"/"+cmName]
	if cm == nil {
		t.Fatalf("volume %s is not a ConfigMap of the rendering (%q)", volume, cmName)
	}
	if cmName == "kube-apicache-config" {
		t.Fatal("the profiles are in kube-apicache-config, whose every key is read as an AgentConfiguration")
	}
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cmName, key)
	}
	rc, err := rewritev1alpha1.Decode([]byte(data))
	if err != nil {
		t.Fatalf("%s/%s: %v", cmName, key, err)
	}
	// As the agent loads it at start-up, short of the checks against the
	// cluster.
	if errs := rewritev1alpha1.Validate(rc, nil); len(errs) > 0 {
		t.Errorf("%s/%s is not valid: %v", cmName, key, errs.ToAggregate())
	} else if _, err := rewrite.NewProfiles(rc); err != nil {
		t.Errorf("%s/%s: %v", cmName, key, err)
	}
	if len(rc.Profiles) != 1 || rc.Profiles[0].Name != "widgets" || !slices.Equal(rc.Profiles[0].Selector.ServiceAccounts, []string{"widgets-system/widget-operator"}) {
		t.Errorf("profiles %+v, want the one example profile widgets for widgets-system/widget-operator", rc.Profiles)
	}
}
