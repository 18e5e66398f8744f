package cache

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/internal/nodeimpersonation"
)

// Which identity a watch runs as.
//
// The agent's ServiceAccount is the same on every node. Were it allowed to
// list and watch pods and nodes, a token stolen from any one node would read
// every pod in the cluster (environment values included), which is exactly
// what the Node authorizer denies that node's kubelet. With AsNode the
// watches of this node's pods and Node run as the node instead, through
// KEP-5284 constrained impersonation: the request carries only
// Impersonate-User: system:node:<node>; kube-apiserver accepts it only from a
// ServiceAccount whose token is bound to a pod on that node (the
// authentication.kubernetes.io/node-name extra), then gives the request the
// node's fixed groups and authorizes it as the node. What the agent gets is
// the overlap of its impersonate-on grants and what the Node authorizer
// allows that node: its own pods (spec.nodeName=<node>) and its own Node.

// NodeUsername is the user name kube-apiserver's Node authorizer knows a
// node by.
func NodeUsername(node string) string { return nodeimpersonation.Username(node) }

// nodeScoped reports whether r holds only this node's objects (newResource
// scopes pods by spec.nodeName and nodes by metadata.name and nothing
// else), which the node itself may list and watch.
func (r *resource) nodeScoped() bool { return !r.scope.Empty() }

// watchConfig returns the client configuration r's watch runs with: the
// agent's own, or for a node-scoped resource with AsNode a copy that
// impersonates the node. Only the user name is set: any group, UID or extra
// would take the request out of the associated-node mode.
func (c *Cache) watchConfig(r *resource) *rest.Config {
	if !c.cfg.AsNode || !r.nodeScoped() {
		return c.cfg.RESTConfig
	}
	cfg := rest.CopyConfig(c.cfg.RESTConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: NodeUsername(c.cfg.NodeName)}
	return cfg
}

// explainRefusals wraps the watch source of a resource watched as the node
// so that a 403 is explained in the log with what to change. The reflector
// logs the error and retries with backoff; meanwhile the resource stays
// unsynced and its reads are forwarded.
func explainRefusals(lw toolscache.ListerWatcherWithContext, cfg *rest.Config, logger klog.Logger) toolscache.ListerWatcherWithContext {
	if cfg.Impersonate.UserName == "" {
		return lw
	}
	return &refusalExplainer{lw: lw, user: cfg.Impersonate.UserName, logger: logger}
}

type refusalExplainer struct {
	// Fixed at construction.
	lw     toolscache.ListerWatcherWithContext
	user   string
	logger klog.Logger

	mu sync.Mutex // protects the field below
	// last is the last explanation logged at error level; a repeat is
	// logged at V(2).
	last string
}

func (e *refusalExplainer) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := e.lw.ListWithContext(ctx, opts)
	e.note("list", err)
	return obj, err
}

func (e *refusalExplainer) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := e.lw.WatchWithContext(ctx, opts)
	e.note("watch", err)
	return w, err
}

// List and Watch complete cache.ListerWatcher; the reflector calls the
// context variants.
func (e *refusalExplainer) List(opts metav1.ListOptions) (runtime.Object, error) {
	return e.ListWithContext(context.Background(), opts)
}

func (e *refusalExplainer) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return e.WatchWithContext(context.Background(), opts)
}

func (e *refusalExplainer) note(verb string, err error) {
	if err == nil {
		e.mu.Lock()
		e.last = ""
		e.mu.Unlock()
		return
	}
	why, ok := nodeimpersonation.ExplainRefusal(err, e.user)
	if !ok {
		return
	}
	e.mu.Lock()
	repeat := why == e.last
	e.last = why
	e.mu.Unlock()
	const msg = "kube-apiserver refused to let the agent read this node's objects as the node; they are not cached and their reads are forwarded"
	if repeat {
		e.logger.V(2).Info(msg, "verb", verb, "as", e.user, "reason", why, "err", err)
		return
	}
	e.logger.Error(err, msg, "verb", verb, "as", e.user, "reason", why)
}
