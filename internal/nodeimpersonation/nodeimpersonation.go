// Package nodeimpersonation holds what the agent's parts that act as the
// node (KEP-5284 constrained impersonation: the cache's watches of this
// node's pods and Node, detect-local's watch of its pods) share: the node's
// user name and the reading of kube-apiserver's refusals.
package nodeimpersonation

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Username is the user name kube-apiserver's Node authorizer knows a node
// by.
func Username(node string) string { return "system:node:" + node }

// ExplainRefusal says, from kube-apiserver's 403 message, why a request
// impersonating user (system:node:<node>) was refused and what to change.
// ok is false for errors that are not a 403.
func ExplainRefusal(err error, user string) (why string, ok bool) {
	if !apierrors.IsForbidden(err) {
		return "", false
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "impersonate-on:associated-node:") || strings.Contains(msg, "impersonate:associated-node"):
		// The associated-node mode applied (a pod-bound token of this
		// node) but RBAC lacks one of its two grants.
		return "the agent's ServiceAccount may not impersonate its node: bind it to the kube-apicache:node-impersonation ClusterRole " +
			"(impersonate:associated-node on nodes.authentication.k8s.io; impersonate-on:associated-node:list and :watch on pods and nodes), " +
			"see manifests/rbac.yaml", true
	case strings.Contains(msg, "impersonate-on:arbitrary-node:") || strings.Contains(msg, "impersonate:arbitrary-node"):
		// The associated-node mode did not apply, so kube-apiserver tried
		// the next one: the token is not bound to a pod on this node.
		return "the agent's token is not bound to a pod on " + strings.TrimPrefix(user, "system:node:") +
			": run the agent with its pod's projected ServiceAccount token and --node-name set to the pod's spec.nodeName", true
	case strings.Contains(msg, `cannot impersonate resource "users"`):
		// Only legacy impersonation ran: no constrained impersonation.
		return "kube-apiserver does not offer constrained impersonation (feature gate ConstrainedImpersonation, on by default from Kubernetes 1.36): " +
			"enable it, or run the agent with --cache-as-node=false and grant its ServiceAccount list and watch of pods and nodes cluster-wide", true
	case strings.Contains(msg, "User "+`"`+user+`"`):
		// Impersonation was allowed; the node itself may not read this.
		return "the node may not read this: kube-apiserver's --authorization-mode must include Node", true
	}
	return "unrecognized refusal; see err", true
}
