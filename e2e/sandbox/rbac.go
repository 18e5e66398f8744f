package sandbox

import (
	"context"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Grant binds clusterRole to the pod's ServiceAccount in the pod's
// namespace.
func (p *Pod) Grant(ctx context.Context, clusterRole string) error {
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Spec.ServiceAccount + "-" + clusterRole, Namespace: p.Spec.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: p.Spec.ServiceAccount, Namespace: p.Spec.Namespace}},
	}
	_, err := p.cluster.Admin.RbacV1().RoleBindings(p.Spec.Namespace).Create(ctx, rb, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Username is the pod's identity as kube-apiserver sees it.
func (p *Pod) Username() string {
	return "system:serviceaccount:" + p.Spec.Namespace + ":" + p.Spec.ServiceAccount
}

// WaitAllowed waits until RBAC allows the pod's ServiceAccount verb on
// resource in its namespace (bindings and aggregated roles take effect
// asynchronously).
func (p *Pod) WaitAllowed(ctx context.Context, verb, resource string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   p.Username(),
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + p.Spec.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: p.Spec.Namespace, Verb: verb, Resource: resource,
			},
		}}
		res, err := p.cluster.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && res.Status.Allowed, nil
	})
}
