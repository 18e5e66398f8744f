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
