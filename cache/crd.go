package cache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/client-go/kubernetes/scheme"
	restclient "k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/jsonpath"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// crdIndex follows the CustomResourceDefinitions of the custom resources
// the cache is configured for. A custom resource is answered from the
// cache only while its CRD exists, is established and serves the version
// the cache holds; its Tables use that version's printer columns.
//
// Its watch runs only while an informer of a custom resource runs: each
// such informer acquires the index when it starts and releases it when it
// stops.
type crdIndex struct {
	// Fixed at construction: the group resources to follow.
	wanted map[schema.GroupResource]bool

	runMu sync.Mutex // protects the fields below
	// users are the informers holding the index.
	users int
	// stop ends the running watch and waits for it; nil while none runs.
	stop func()

	mu sync.RWMutex // protects the fields below
	// gen numbers the watches; events of an earlier one are ignored.
	gen uint64
	// synced is true once the first list of CRDs is in.
	synced bool
	byGR   map[schema.GroupResource]*crdState
}

// crdLabel names the CRD index's informer in metrics.
const crdLabel = "customresourcedefinitions.apiextensions.k8s.io"

// crdState is what the cache uses of one CRD.
type crdState struct {
	established bool
	// versions are the served versions.
	versions map[string]*crdVersion
}

// crdVersion is one served version of a CRD.
type crdVersion struct {
	table      rest.TableConvertor
	selectable []apiextensionsv1.SelectableField
}

// newCRDIndex returns an index following the CRDs of specs' resources
// whose group is not a built-in API group, or nil if there are none.
func newCRDIndex(specs []ResourceSpec) *crdIndex {
	wanted := map[schema.GroupResource]bool{}
	for _, s := range specs {
		if s.Group != "" && !scheme.Scheme.IsGroupRegistered(s.Group) {
			wanted[s.GroupResource()] = true
		}
	}
	if len(wanted) == 0 {
		return nil
	}
	return &crdIndex{wanted: wanted, byGR: map[schema.GroupResource]*crdState{}}
}

// acquire starts the index's watch unless it runs already, and reports
// whether it started it. The watch runs, at most until ctx ends, until
// every acquire has been released.
func (x *crdIndex) acquire(ctx context.Context, cfg *restclient.Config) bool {
	x.runMu.Lock()
	defer x.runMu.Unlock()
	x.users++
	if x.users > 1 {
		return false
	}
	x.mu.Lock()
	x.gen++
	gen := x.gen
	x.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		x.run(ctx, cfg, gen)
	}()
	x.stop = func() {
		cancel()
		<-done
	}
	return true
}

// release gives back one acquire, and stops the watch (forgetting what it
// knew) when it was the last; it reports whether it stopped it.
func (x *crdIndex) release() bool {
	x.runMu.Lock()
	defer x.runMu.Unlock()
	x.users--
	if x.users > 0 {
		return false
	}
	x.stop()
	x.stop = nil
	x.mu.Lock()
	x.gen++
	x.synced = false
	x.byGR = map[schema.GroupResource]*crdState{}
	x.mu.Unlock()
	return true
}

// running reports whether the index's watch runs.
func (x *crdIndex) running() bool {
	x.runMu.Lock()
	defer x.runMu.Unlock()
	return x.stop != nil
}

// hasSynced reports whether the running watch has listed the CRDs.
func (x *crdIndex) hasSynced() bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.synced
}

// run watches CRDs until ctx ends; gen is the watch's generation.
func (x *crdIndex) run(ctx context.Context, cfg *restclient.Config, gen uint64) {
	logger := klog.FromContext(ctx)
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		logger.Error(err, "Cannot watch CustomResourceDefinitions; custom resources are forwarded")
		return
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return crds.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return crds.Watch(ctx, opts)
		},
	}
	inf := toolscache.NewSharedIndexInformer(lw, &apiextensionsv1.CustomResourceDefinition{}, 0, toolscache.Indexers{})
	_, err = inf.AddEventHandlerWithOptions(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { x.update(gen, obj) },
		UpdateFunc: func(_, obj any) { x.update(gen, obj) },
		DeleteFunc: func(obj any) { x.remove(gen, obj) },
	}, toolscache.HandlerOptions{Logger: &logger})
	if err != nil {
		logger.Error(err, "Cannot watch CustomResourceDefinitions; custom resources are forwarded")
		return
	}
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			x.mu.Lock()
			if x.gen == gen {
				x.synced = true
			}
			x.mu.Unlock()
		}
	}()
	inf.RunWithContext(ctx)
}

func crdOf(obj any) *apiextensionsv1.CustomResourceDefinition {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	crd, _ := obj.(*apiextensionsv1.CustomResourceDefinition)
	return crd
}

func crdGroupResource(crd *apiextensionsv1.CustomResourceDefinition) schema.GroupResource {
	return schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}
}

func (x *crdIndex) update(gen uint64, obj any) {
	crd := crdOf(obj)
	if crd == nil || !x.wanted[crdGroupResource(crd)] {
		return
	}
	st := &crdState{versions: map[string]*crdVersion{}}
	for _, c := range crd.Status.Conditions {
		// A CRD being deleted no longer serves its objects as they were.
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue && crd.DeletionTimestamp == nil {
			st.established = true
		}
	}
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		// As kube-apiserver does, an unparsable column falls back to the
		// columns parsed so far.
		table, _ := tableconvertor.New(columnsOrDefault(v.AdditionalPrinterColumns))
		st.versions[v.Name] = &crdVersion{table: table, selectable: v.SelectableFields}
	}
	x.mu.Lock()
	if x.gen == gen {
		x.byGR[crdGroupResource(crd)] = st
	}
	x.mu.Unlock()
}

func (x *crdIndex) remove(gen uint64, obj any) {
	crd := crdOf(obj)
	if crd == nil {
		return
	}
	x.mu.Lock()
	if x.gen == gen {
		delete(x.byGR, crdGroupResource(crd))
	}
	x.mu.Unlock()
}

// version returns the CRD version serving gvr, or nil if the cache must
// not answer for it: the CRDs are not listed yet, or gvr's CRD is missing,
// not established or does not serve that version.
func (x *crdIndex) version(gvr schema.GroupVersionResource) *crdVersion {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if !x.synced {
		return nil
	}
	st := x.byGR[gvr.GroupResource()]
	if st == nil || !st.established {
		return nil
	}
	return st.versions[gvr.Version]
}

// serves reports whether the cache may answer for gvr, a custom resource
// whose store was built with the selectable fields selectable.
func (x *crdIndex) serves(gvr schema.GroupVersionResource, selectable []apiextensionsv1.SelectableField) bool {
	v := x.version(gvr)
	return v != nil && slices.Equal(v.selectable, selectable)
}

// columnsOrDefault returns the printer columns kube-apiserver uses for a
// CRD version: its own, or the creation timestamp as "Age" if it has none.
func columnsOrDefault(cols []apiextensionsv1.CustomResourceColumnDefinition) []apiextensionsv1.CustomResourceColumnDefinition {
	if len(cols) > 0 {
		return cols
	}
	return []apiextensionsv1.CustomResourceColumnDefinition{{
		Name:        "Age",
		Type:        "date",
		Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"],
		JSONPath:    ".metadata.creationTimestamp",
	}}
}

// crdFieldLabels are the field labels of a custom resource version, as
// kube-apiserver's custom resource handler supports them: metadata.name,
// metadata.namespace for namespaced resources, and the version's
// selectableFields, whose values are read with their JSONPath and printed
// as fmt.Sprint does (empty when absent).
func crdFieldLabels(namespaced bool, selectable []apiextensionsv1.SelectableField) (store.FieldLabels, error) {
	type field struct {
		name string
		path *jsonpath.JSONPath
	}
	paths := make([]field, 0, len(selectable))
	names := map[string]bool{}
	for _, sf := range selectable {
		name := strings.TrimPrefix(sf.JSONPath, ".")
		p := jsonpath.New("selectableField")
		p.AllowMissingKeys(true)
		if err := p.Parse("{" + sf.JSONPath + "}"); err != nil {
			return store.FieldLabels{}, fmt.Errorf("selectable field %q: %w", sf.JSONPath, err)
		}
		paths = append(paths, field{name: name, path: p})
		names[name] = true
	}
	fl := store.FieldLabelsFor(schema.GroupResource{}, false, namespaced)
	for name := range names {
		fl.Labels[name] = name
	}
	if len(paths) > 0 {
		fl.Set = func(obj runtime.Object) fields.Set {
			set := fields.Set{}
			us, ok := obj.(runtime.Unstructured)
			if !ok {
				return set
			}
			content := us.UnstructuredContent()
			for _, f := range paths {
				set[f.name] = ""
				results, err := f.path.FindResults(content)
				if err != nil || len(results) == 0 || len(results[0]) == 0 {
					continue
				}
				if v := results[0][0].Interface(); v != nil {
					set[f.name] = fmt.Sprint(v)
				}
			}
			return set
		}
	}
	return fl, nil
}

// resolveCRD completes the resolution of a custom resource with its CRD
// version's field labels, selectable fields included.
func (r *informer) resolveCRD() error {
	var v *crdVersion
	if r.crds != nil {
		v = r.crds.version(r.gvr)
	}
	if v == nil {
		return fmt.Errorf("no established CustomResourceDefinition serves %s", r.gvr)
	}
	fl, err := crdFieldLabels(r.namespaced, v.selectable)
	if err != nil {
		return err
	}
	r.fields, r.selectable = fl, v.selectable
	return nil
}
