package main

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// errStepFailed is what run returns when a step failed; the step's FAIL
// line says why.
var errStepFailed = errors.New("a step failed")

// runner holds the clients of `widgetop run` and what its steps pass on
// to the later ones.
type runner struct {
	ns     string
	prefix string
	dyn    dynamic.Interface
	kube   kubernetes.Interface
	disc   discovery.CachedDiscoveryInterface

	// gvr is what the RESTMapper maps example.com Widget to; widgets is
	// the dynamic client of that resource in ns.
	gvr     schema.GroupVersionResource
	widgets dynamic.ResourceInterface
	ctrl    *controller
	// uidA is the UID of widget <prefix>-a; listRV the resourceVersion of
	// the last list.
	uidA   types.UID
	listRV string
}

// step is one named step of a run; do returns a short detail for the OK
// line.
type step struct {
	name string
	do   func(ctx context.Context) (string, error)
}

// steps returns the steps of a run, in order.
func (r *runner) steps() []step {
	return []step{
		{"restmapper", r.restMapper},
		{"controller", r.startController},
		{"create", r.create},
		{"get", r.get},
		{"list", r.list},
		{"watch", r.watch},
		{"watchlist", r.watchList},
		{"jsonpatch", r.jsonPatch},
		{"ownerref", r.ownerRef},
		{"strategic", r.strategic},
		{"apply", r.apply},
		{"status", r.status},
		{"v2", r.v2},
		{"denied", r.denied},
		{"delete", r.deleteA},
		{"cleanup", r.cleanup},
	}
}

// run is `widgetop run`: it runs the steps in order and stops at the
// first that fails. Each step prints `STEP <step>`, then `OK <step>
// <detail>` or `FAIL <step>: <error>`; the run ends with `RESULT ok` or
// `RESULT failed`. A failure before the first step prints `FAIL setup:
// <error>`.
func run(ctx context.Context, prefix string) error {
	r, err := newRunner(prefix)
	if err != nil {
		sayf("FAIL setup: %v", err)
		say("RESULT failed")
		return err
	}
	err = r.runSteps(ctx)
	if r.ctrl != nil {
		r.ctrl.stop()
	}
	if err != nil {
		say("RESULT failed")
		return err
	}
	say("RESULT ok")
	return nil
}

// runSteps runs the steps until one fails.
func (r *runner) runSteps(ctx context.Context) error {
	for _, s := range r.steps() {
		sayf("STEP %s", s.name)
		detail, err := s.do(ctx)
		if err != nil {
			sayf("FAIL %s: %v", s.name, err)
			return fmt.Errorf("%w: %s", errStepFailed, s.name)
		}
		sayf("OK %s %s", s.name, detail)
	}
	return nil
}

// newRunner creates the clients of a run from the in-cluster config.
func newRunner(prefix string) (*runner, error) {
	cfg, ns, err := inCluster()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the discovery client: %w", err)
	}
	return &runner{ns: ns, prefix: prefix, dyn: dyn, kube: kube, disc: memory.NewMemCacheClient(disc)}, nil
}

// name returns the name of the run's object with suffix.
func (r *runner) name(suffix string) string {
	return r.prefix + "-" + suffix
}

// startController is the step controller: it starts the operator on the
// mapped resource.
func (r *runner) startController(ctx context.Context) (string, error) {
	c, err := startController(ctx, r.dyn, r.gvr, r.ns)
	if err != nil {
		return "", err
	}
	r.ctrl = c
	return fmt.Sprintf("synced %d widgets in %s", len(c.informer.GetStore().List()), r.ns), nil
}
