package cache

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// TestWatchIdentity: with AsNode, the watches of this node's pods and Node
// send exactly one impersonation header, Impersonate-User:
// system:node:<node> (a group, UID or extra would take the request out of
// kube-apiserver's associated-node mode), and every other watch sends none;
// without AsNode no watch impersonates.
func TestWatchIdentity(t *testing.T) {
	for _, asNode := range []bool{true, false} {
		var mu sync.Mutex
		seen := map[string]map[string][]string{} // path → Impersonate-* headers
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			imp := map[string][]string{}
			for k, v := range r.Header {
				if strings.HasPrefix(k, "Impersonate-") {
					imp[k] = v
				}
			}
			mu.Lock()
			seen[r.URL.Path] = imp
			mu.Unlock()
			kind := map[string]string{
				"/api/v1/pods": "PodList", "/api/v1/nodes": "NodeList", "/api/v1/services": "ServiceList",
				"/apis/discovery.k8s.io/v1/endpointslices": "EndpointSliceList",
			}[r.URL.Path]
			gv := "v1"
			if strings.HasPrefix(r.URL.Path, "/apis/") {
				gv = "discovery.k8s.io/v1"
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"` + kind + `","apiVersion":"` + gv + `","metadata":{"resourceVersion":"1"},"items":[]}`))
		}))
		specs, err := ParseResources("pods,nodes,services,endpointslices.discovery.k8s.io")
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(Config{NodeName: "node-a", Resources: specs, RESTConfig: &rest.Config{Host: srv.URL}, AsNode: asNode})
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range c.resources {
			r := newInformer(res)
			// What resolve would find.
			gv := schema.GroupVersion{Group: r.spec.Group, Version: "v1"}
			kind := map[string]string{"pods": "Pod", "nodes": "Node", "services": "Service", "endpointslices": "EndpointSlice"}[r.spec.Resource]
			r.gvr, r.gvk, r.builtin = gv.WithResource(r.spec.Resource), gv.WithKind(kind), true
			lw, _, err := r.listerWatcher(c.watchConfig(res))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lw.List(metav1.ListOptions{}); err != nil {
				t.Fatalf("listing %s: %v", r.label, err)
			}
		}
		srv.Close()

		node := map[string][]string{}
		if asNode {
			node = map[string][]string{"Impersonate-User": {"system:node:node-a"}}
		}
		want := map[string]map[string][]string{
			"/api/v1/pods":     node,
			"/api/v1/nodes":    node,
			"/api/v1/services": {},
			"/apis/discovery.k8s.io/v1/endpointslices": {},
		}
		if diff := cmp.Diff(want, seen); diff != "" {
			t.Errorf("AsNode=%v: impersonation headers by path (-want +got):\n%s", asNode, diff)
		}
		if c.watchConfig(c.byGR[schema.GroupResource{Resource: "services"}]) != c.cfg.RESTConfig {
			t.Errorf("AsNode=%v: services do not use the agent's own configuration", asNode)
		}
	}
}

// TestExplainNodeRefusal: each 403 kube-apiserver v1.36 answers a list or
// watch made as the node (the messages as observed in the e2e sandbox, and
// the legacy impersonation filter's for a server without the gate) is
// explained by what to change.
func TestExplainNodeRefusal(t *testing.T) {
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
		why, ok := explainNodeRefusal(tc.err, user)
		if ok != (tc.want != "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: explained %v %q, want one with %q", tc.name, ok, why, tc.want)
		}
	}
}

// TestRefusalExplainerPassesThrough: the explaining wrapper returns the
// source's results and errors unchanged, and wraps only impersonating
// configurations.
func TestRefusalExplainerPassesThrough(t *testing.T) {
	if _, wrapped := explainRefusals(nil, &rest.Config{}, nullLogger()).(*refusalExplainer); wrapped {
		t.Errorf("a configuration without impersonation was wrapped")
	}
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil)
	e := explainRefusals(failingSource{err: refused}, &rest.Config{Impersonate: rest.ImpersonationConfig{UserName: "system:node:a"}}, nullLogger())
	if _, err := e.ListWithContext(context.Background(), metav1.ListOptions{}); err != refused {
		t.Errorf("list error %v, want the source's", err)
	}
	if _, err := e.WatchWithContext(context.Background(), metav1.ListOptions{}); err != refused {
		t.Errorf("watch error %v, want the source's", err)
	}
}

// nullLogger discards (a zero logr.Logger does).
func nullLogger() klog.Logger { return klog.Logger{} }

// failingSource is a watch source whose every call fails with err.
type failingSource struct{ err error }

func (f failingSource) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	return nil, f.err
}

func (f failingSource) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return nil, f.err
}
