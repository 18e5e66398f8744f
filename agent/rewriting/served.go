package rewriting

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/apis/rewrite/v1alpha1"
)

// ClusterGroups finds out at start-up how the cluster serves the target
// groups of a rewrite configuration (v1alpha1.ServedGroups), so that
// v1alpha1.Validate can refuse a rename onto a group that is not the
// profile's to use.
//
// For each target group it asks: is the group served (discovery); is
// every resource of it a custom resource (a CustomResourceDefinition of
// that name exists, else kube-apiserver or an aggregated APIService
// serves it); and may one of the profile's callers read or write one of
// its resources (SubjectAccessReviews). Its cost per agent start with
// profiles: one discovery of /apis, one of each served target group, one
// CRD get per resource of it and up to four reviews per resource and
// selected ServiceAccount; nothing without profiles.
type ClusterGroups struct {
	served map[string]bool
	// answers are the checks made, by profile and group.
	answers map[[2]string]v1alpha1.GroupServing
}

var _ v1alpha1.ServedGroups = (*ClusterGroups)(nil)

// Serving implements v1alpha1.ServedGroups.
func (c *ClusterGroups) Serving(profile, group string) v1alpha1.GroupServing {
	return c.answers[[2]string{profile, group}]
}

// probeServiceAccount stands for "any ServiceAccount of the namespace"
// in the reviews of a namespace selector: grants to the namespace's
// ServiceAccount group are what such a review sees.
const probeServiceAccount = "kube-apicache-rewrite-probe"

// LookUpGroups asks the cluster, with cfg (the agent's own client), how
// it serves each target group of c's profiles.
func LookUpGroups(ctx context.Context, cfg *rest.Config, c *v1alpha1.RewriteConfiguration) (*ClusterGroups, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	crds, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	groups, err := dc.ServerGroups()
	if err != nil {
		return nil, fmt.Errorf("discovering the cluster's API groups: %w", err)
	}
	out := &ClusterGroups{served: map[string]bool{}, answers: map[[2]string]v1alpha1.GroupServing{}}
	versions := map[string]string{}
	for _, g := range groups.Groups {
		out.served[g.Name] = true
		versions[g.Name] = g.PreferredVersion.GroupVersion
	}
	for _, p := range c.Profiles {
		for _, g := range p.Groups {
			if !out.served[g.To] {
				continue
			}
			s, err := groupServing(ctx, dc, crds, kc, p, g.To, versions[g.To])
			if err != nil {
				return nil, fmt.Errorf("rewrite profile %s: looking up group %s: %w", p.Name, g.To, err)
			}
			out.answers[[2]string{p.Name, g.To}] = s
		}
	}
	return out, nil
}

// groupServing tells how group (served, preferred version gv) is served
// to the callers of p.
func groupServing(ctx context.Context, dc discovery.DiscoveryInterface, crds apiextensionsclient.Interface, kc kubernetes.Interface, p v1alpha1.RewriteProfile, group, gv string) (v1alpha1.GroupServing, error) {
	list, err := dc.ServerResourcesForGroupVersion(gv)
	if err != nil {
		return 0, err
	}
	var resources []string
	for _, r := range list.APIResources {
		if !strings.Contains(r.Name, "/") {
			resources = append(resources, r.Name)
		}
	}
	for _, r := range resources {
		if _, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, r+"."+group, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return v1alpha1.ServedByCluster, nil
			}
			return 0, err
		}
	}
	for _, subject := range reviewSubjects(p.Selector) {
		for _, r := range resources {
			for _, verb := range []string{"get", "list", "watch", "create"} {
				sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   subject.user,
					Groups: subject.groups,
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Namespace: subject.namespace, Verb: verb, Group: group, Resource: r,
					},
				}}
				res, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
				if err != nil {
					return 0, err
				}
				if res.Status.Allowed {
					return v1alpha1.ServedByCustomResources, nil
				}
			}
		}
	}
	return v1alpha1.ServedDenied, nil
}

// reviewSubject is who a SubjectAccessReview asks about, and where.
type reviewSubject struct {
	user      string
	groups    []string
	namespace string
}

// reviewSubjects are the callers a selector stands for: each
// ServiceAccount in its own namespace, and each namespace's
// ServiceAccounts as a group.
func reviewSubjects(sel v1alpha1.CallerSelector) []reviewSubject {
	var out []reviewSubject
	for _, sa := range sel.ServiceAccounts {
		ns, name, _ := strings.Cut(sa, "/")
		out = append(out, reviewSubject{
			user:      "system:serviceaccount:" + ns + ":" + name,
			groups:    []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			namespace: ns,
		})
	}
	for _, ns := range sel.Namespaces {
		if slices.ContainsFunc(out, func(s reviewSubject) bool { return s.namespace == ns }) {
			continue
		}
		out = append(out, reviewSubject{
			user:      "system:serviceaccount:" + ns + ":" + probeServiceAccount,
			groups:    []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			namespace: ns,
		})
	}
	return out
}
