package nodeimpersonation

import (
	"net/http"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestExplainRefusal: each 403 kube-apiserver v1.36 answers a list or
// watch made as the node (the messages as observed in the e2e sandbox, and
// the legacy impersonation filter's for a server without the gate) is
// explained by what to change.
func TestExplainRefusal(t *testing.T) {
	const user = "system:node:node-a"
	forbidden := func(msg string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden, Message: msg}}
	}
	for _, tc := range []struct {
		name string
		err  error
		// want is a phrase the explanation must hold; empty: not explained.
		want string
	}{{
		// No impersonate-on grant for the verb: the binding is missing.
		name: "associated-node verb not granted",
		err:  forbidden(`pods is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate-on:associated-node:watch resource "pods" in API group "" at the cluster scope`),
		want: "kube-apicache:node-impersonation",
	}, {
		// The mode itself not granted.
		name: "associated-node mode not granted",
		err:  forbidden(`nodes.authentication.k8s.io "*" is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate:associated-node resource "nodes" in API group "authentication.k8s.io" at the cluster scope`),
		want: "kube-apicache:node-impersonation",
	}, {
		// The token is not bound to a pod on this node, so kube-apiserver
		// fell through to the arbitrary-node mode.
		name: "token not associated with the node",
		err:  forbidden(`pods is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate-on:arbitrary-node:list resource "pods" in API group "" at the cluster scope`),
		want: "not bound to a pod on node-a",
	}, {
		// Only legacy impersonation: the gate is off.
		name: "no constrained impersonation",
		err:  forbidden(`users "system:node:node-a" is forbidden: User "system:serviceaccount:kube-apicache:kube-apicache" cannot impersonate resource "users" in API group "" at the cluster scope`),
		want: "--cache-as-node=false",
	}, {
		// Impersonated, then refused as the node.
		name: "node authorizer",
		err:  forbidden(`pods is forbidden: User "system:node:node-a" cannot list resource "pods" in API group "" at the cluster scope: can only list/watch pods with spec.nodeName field selector`),
		want: "--authorization-mode must include Node",
	}, {
		name: "not a 403",
		err:  apierrors.NewServiceUnavailable("etcd is down"),
	}} {
		why, ok := ExplainRefusal(tc.err, user)
		if ok != (tc.want != "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: explained %v %q, want one with %q", tc.name, ok, why, tc.want)
		}
	}
}
