package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// rbacManifests are the project's own RBAC files. The sandbox applies them
// as they ship, so the e2e suite proves the agent works with exactly the
// rights the manifests grant.
var rbacManifests = []string{"rbac.yaml", "approver.yaml"}

// ApplyRBAC (re)creates the agent's RBAC from manifests/, as the sandbox
// does at start; a scenario that deleted the manifests calls it before it
// runs agents of its own.
func (c *Cluster) ApplyRBAC(ctx context.Context) error { return c.applyRBAC(ctx) }

// applyRBAC creates (or replaces) the RBAC objects in the project's
// manifests. Objects of other kinds in those files are ignored.
func (c *Cluster) applyRBAC(ctx context.Context) error {
	if c.Minor < ConstrainedImpersonationMinor {
		// Before 1.36 the agents run as docs/install/requirements.md says for such
		// clusters (AgentArgs: --cache-as-node=false), with this grant.
		rule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"list", "watch"}}
		for _, obj := range []runtime.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: CacheWithoutImpersonation}, Rules: []rbacv1.PolicyRule{rule}},
			&rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: CacheWithoutImpersonation},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: CacheWithoutImpersonation},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: AgentServiceAccount, Namespace: AgentNamespace}},
			},
		} {
			if err := c.applyRBACObject(ctx, obj); err != nil {
				return fmt.Errorf("%s: %w", CacheWithoutImpersonation, err)
			}
		}
	}
	for _, name := range rbacManifests {
		objs, err := decodeManifest(filepath.Join(RepoRoot(), "manifests", name))
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := c.applyRBACObject(ctx, obj); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	return nil
}

// ConstrainedImpersonationMinor is the first release whose kube-apiserver
// lets the agent impersonate its node (constrained impersonation).
const ConstrainedImpersonationMinor = 36

// CacheWithoutImpersonation names the ClusterRole and binding that give
// the agent list and watch of pods and nodes on a control plane older
// than ConstrainedImpersonationMinor, where it runs with
// --cache-as-node=false.
const CacheWithoutImpersonation = "kube-apicache:e2e-cache-without-impersonation"

func (c *Cluster) applyRBACObject(ctx context.Context, obj runtime.Object) error {
	rbac := c.Admin.RbacV1()
	var err error
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		_ = rbac.ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{})
		_, err = rbac.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.ClusterRoleBinding:
		_ = rbac.ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{})
		_, err = rbac.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.Role:
		if err = c.EnsureNamespace(ctx, o.Namespace); err != nil {
			return err
		}
		_ = rbac.Roles(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
		_, err = rbac.Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.RoleBinding:
		if err = c.EnsureNamespace(ctx, o.Namespace); err != nil {
			return err
		}
		_ = rbac.RoleBindings(o.Namespace).Delete(ctx, o.Name, metav1.DeleteOptions{})
		_, err = rbac.RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		return nil
	}
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// RenderComponent renders the shipped manifests with the kustomize
// component manifests/components/<name>, as an operator's overlay would
// (kustomize refuses an overlay inside its base's directory: the overlay
// is written to dir, and names the base by a relative path), with the
// machine's kubectl ($KUBECTL, or kubectl), and returns the objects.
func RenderComponent(ctx context.Context, dir, name string) ([]runtime.Object, error) {
	manifests := filepath.Join(RepoRoot(), "manifests")
	base, err := filepath.Rel(dir, manifests)
	if err != nil {
		return nil, err
	}
	component, err := filepath.Rel(dir, filepath.Join(manifests, "components", name))
	if err != nil {
		return nil, err
	}
	k := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", base, component)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	out, err := RenderOverlay(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("component %s: %w", name, err)
	}
	rendered := filepath.Join(dir, "rendered.yaml")
	if err := os.WriteFile(rendered, out, 0o644); err != nil {
		return nil, err
	}
	return decodeManifest(rendered)
}

// decodeManifest decodes every document of a multi-document YAML file into
// typed objects.
func decodeManifest(path string) ([]runtime.Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		out = append(out, obj)
	}
}
