package cache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// informer is one run of a resource's watch: its resolved kind, its Store
// and the watch's health. A plan holds the informer it was made with, so
// a request keeps one consistent Store even if the informer stops or a new
// one starts meanwhile.
type informer struct {
	*resource

	// Set once, before ready is stored true, by resolve.
	gvk        schema.GroupVersionKind
	gvr        schema.GroupVersionResource
	namespaced bool
	builtin    bool
	fields     store.FieldLabels
	// selectable are a custom resource's selectable fields, as its CRD
	// version had them when the Store was built.
	selectable []apiextensionsv1.SelectableField
	store      *store.Store
	encoder    *store.Encoder
	ready      atomic.Bool
	// stopped is set when the informer stops: its Store is no longer
	// kept current.
	stopped atomic.Bool
	// gzipped keeps recent compressed list bodies (response.go).
	gzipped compressedLists

	// watchState is the generation of the latest watch shifted left by
	// one, with the low bit set while that watch is open. needReplaces is
	// the Store replace count that a watch-list's initial events reach.
	watchState   atomic.Uint64
	needReplaces atomic.Uint64
	// watchOpened: a watch of this informer has opened at least once.
	watchOpened atomic.Bool
	// downSince is when (UnixNano) the latest open watch ended; zero
	// while none has ended.
	downSince atomic.Int64
	// started is when the informer started; fixed by its starter.
	started time.Time
	// prober probes kube-apiserver for consistent reads (probe.go); set
	// before ready, nil if the probe client could not be made.
	prober *prober
}

func newInformer(r *resource) *informer {
	return &informer{resource: r}
}

// watchOpen reports whether the informer holds its watch open upstream.
func (r *informer) watchOpen() bool {
	return r.watchState.Load()&1 == 1
}

// healthy reports whether the Store is synced, kept current and its watch
// open: the condition for answering consistent reads.
func (r *informer) healthy() bool {
	return r.ready.Load() && !r.stopped.Load() && r.store.Synced() && r.watchState.Load()&1 == 1 && r.store.Replaces() >= r.needReplaces.Load()
}

// serverMinor returns kube-apiserver's minor release, or 0 when it cannot
// be read (ForServer then answers none of the labels that depend on it).
func serverMinor(dc discovery.DiscoveryInterface) int {
	info, err := dc.ServerVersion()
	if err != nil {
		return 0
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil || v.Major() != 1 {
		return 0
	}
	return int(v.Minor())
}

// resolve finds the resource's version, kind and scope with discovery.
// Without a version in the spec it takes the group's preferred version, or,
// for a resource that version does not serve (a beta resource of a group
// whose preferred version is GA, such as certificates.k8s.io's
// clustertrustbundles), the first version in the server's order of
// preference that serves it, as kubectl and ServerPreferredResources do.
func (r *informer) resolve(dc discovery.DiscoveryInterface) error {
	versions := []string{r.spec.Version}
	if r.spec.Version == "" {
		groups, err := dc.ServerGroups()
		if err != nil {
			return fmt.Errorf("discovering API groups: %w", err)
		}
		versions = nil
		for _, g := range groups.Groups {
			if g.Name != r.spec.Group {
				continue
			}
			versions = append(versions, g.PreferredVersion.Version)
			for _, v := range g.Versions {
				if v.Version != g.PreferredVersion.Version {
					versions = append(versions, v.Version)
				}
			}
		}
		if len(versions) == 0 {
			return fmt.Errorf("API group %q is not served", r.spec.Group)
		}
	}
	for _, version := range versions {
		gv := schema.GroupVersion{Group: r.spec.Group, Version: version}
		list, err := dc.ServerResourcesForGroupVersion(gv.String())
		if err != nil {
			return fmt.Errorf("discovering %s: %w", gv, err)
		}
		for _, ar := range list.APIResources {
			if ar.Name != r.spec.Resource {
				continue
			}
			if !hasVerbs(ar.Verbs, "get", "list", "watch") {
				return fmt.Errorf("%s %s does not support get, list and watch", gv, ar.Name)
			}
			r.gvr = gv.WithResource(ar.Name)
			r.gvk = gv.WithKind(ar.Kind)
			r.namespaced = ar.Namespaced
			r.builtin = scheme.Scheme.Recognizes(r.gvk)
			r.fields = store.FieldLabelsFor(r.gvr.GroupResource(), r.builtin, r.namespaced)
			if r.builtin && store.VersionGated(r.gvr.GroupResource()) {
				// Asked only for the few resources whose labels depend
				// on the release, once per resolve: one GET /version.
				r.fields = store.ForServer(r.gvr.GroupResource(), r.fields, serverMinor(dc))
			}
			if !r.builtin {
				return r.resolveCRD()
			}
			return nil
		}
	}
	gvs := make([]string, len(versions))
	for i, v := range versions {
		gvs[i] = schema.GroupVersion{Group: r.spec.Group, Version: v}.String()
	}
	return fmt.Errorf("%s does not serve %s", strings.Join(gvs, ", "), r.spec.Resource)
}

func hasVerbs(have metav1.Verbs, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// listerWatcher returns the watch source: protobuf through a typed REST
// client for built-in types, JSON through the dynamic client otherwise.
func (r *informer) listerWatcher(cfg *rest.Config) (toolscache.ListerWatcher, runtime.Object, error) {
	scope := r.scope.String()
	if r.builtin {
		c := rest.CopyConfig(cfg)
		gv := r.gvr.GroupVersion()
		c.GroupVersion = &gv
		c.APIPath = "/apis"
		if gv.Group == "" {
			c.APIPath = "/api"
		}
		c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
		c.ContentType = runtime.ContentTypeProtobuf
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		rc, err := rest.RESTClientFor(c)
		if err != nil {
			return nil, nil, err
		}
		obj, err := scheme.Scheme.New(r.gvk)
		if err != nil {
			return nil, nil, err
		}
		return toolscache.NewListWatchFromClient(rc, r.gvr.Resource, metav1.NamespaceAll, r.scope), obj, nil
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	ri := dc.Resource(r.gvr)
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = scope
			return ri.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = scope
			return ri.Watch(ctx, opts)
		},
	}, &unstructured.Unstructured{}, nil
}

// run resolves the resource (retrying until it is served) and keeps its
// Store filled until ctx ends.
func (r *informer) run(ctx context.Context, cfg *rest.Config, dc discovery.DiscoveryInterface, onChange func()) {
	// Resolved fields are written before ready is set and read only after.
	logger := klog.FromContext(ctx).WithValues("resource", r.label)
	if r.crds != nil && r.crds.wanted[r.spec.GroupResource()] {
		// The CRD watch may have just started with this informer: give
		// it its first list before resolving, rather than a retry later.
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return r.crds.hasSynced(), nil
		})
	}
	err := wait.PollUntilContextCancel(ctx, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := r.resolve(dc); err != nil {
			logger.V(2).Info("Resource not cached yet", "err", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return
	}
	lw, expected, err := r.listerWatcher(cfg)
	if err != nil {
		logger.Error(err, "Cannot watch resource; its requests are forwarded")
		return
	}
	if list, err := r.metadataProbe(cfg); err != nil {
		logger.Error(err, "Cannot probe resource; its consistent reads are forwarded")
	} else {
		r.prober = &prober{list: list}
		if r.metrics != nil {
			r.prober.observe = r.metrics.probeDone(r.label)
		}
	}
	r.store = store.NewStore(store.AttrsFor(r.fields, r.namespaced), r.prepare, r.changed(onChange))
	r.store.SetHistoryBounds(r.historyEvents, r.historyBytes)
	r.encoder = store.NewEncoder(r.gvk, r.builtin)
	r.ready.Store(true)
	logger.V(2).Info("Caching resource", "gvr", r.gvr, "scope", r.scope.String(), "as", cfg.Impersonate.UserName)
	source := explainRefusals(toolscache.ToListerWatcherWithContext(lw), cfg, logger)
	refl := toolscache.NewReflectorWithOptions(&healthListerWatcher{lw: source, r: r},
		expected, reflectorStore{r.store}, toolscache.ReflectorOptions{Name: "cache/" + r.label, TypeDescription: r.gvk.String()})
	refl.RunWithContext(ctx)
}

// reflectorStore is a Store as client-go's Reflector fills it. The Store
// takes runtime.Objects; the tombstones client-go may hand a store (a
// DeletedFinalStateUnknown) are unwrapped here, so that the Store needs
// nothing of client-go's tools.
type reflectorStore struct{ *store.Store }

var (
	_ toolscache.ReflectorStore         = reflectorStore{}
	_ toolscache.ResourceVersionUpdater = reflectorStore{}
)

// untomb returns the object of a tombstone, or item as it is.
func untomb(item any) any {
	if d, ok := item.(toolscache.DeletedFinalStateUnknown); ok {
		if obj, ok := d.Obj.(runtime.Object); ok {
			return obj
		}
	}
	return item
}

// Add implements cache.ReflectorStore.
func (s reflectorStore) Add(obj any) error { return s.Store.Add(untomb(obj)) }

// Update implements cache.ReflectorStore.
func (s reflectorStore) Update(obj any) error { return s.Store.Update(untomb(obj)) }

// Delete implements cache.ReflectorStore.
func (s reflectorStore) Delete(obj any) error { return s.Store.Delete(untomb(obj)) }

// Replace implements cache.ReflectorStore.
func (s reflectorStore) Replace(items []any, resourceVersion string) error {
	var unwrapped []any
	for i, item := range items {
		if _, ok := item.(toolscache.DeletedFinalStateUnknown); ok {
			if unwrapped == nil {
				unwrapped = slices.Clone(items)
			}
			unwrapped[i] = untomb(item)
		}
	}
	if unwrapped != nil {
		items = unwrapped
	}
	return s.Store.Replace(items, resourceVersion)
}

// changed returns the Store's change hook: it drops the kept compressed
// lists, which are of an older resourceVersion now (never to be reused, and
// they must not keep replaced objects alive), then calls onChange.
func (r *informer) changed(onChange func()) func() {
	return func() {
		r.gzipped.clear()
		if onChange != nil {
			onChange()
		}
	}
}

// prepare sets apiVersion and kind on typed objects, which decoding
// strips, so that encoding needs no conversion and never mutates a shared
// object.
func (r *informer) prepare(obj runtime.Object) runtime.Object {
	if _, ok := obj.(*unstructured.Unstructured); !ok {
		obj.GetObjectKind().SetGroupVersionKind(r.gvk)
	}
	return obj
}

// healthListerWatcher tracks whether a watch is open and past its initial
// events: a plain watch counts from when it opens, a watch-list once the
// reflector has replaced the Store with its initial events; any watch counts
// no more once it ends.
type healthListerWatcher struct {
	lw toolscache.ListerWatcherWithContext
	r  *informer
}

func (h *healthListerWatcher) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return h.lw.ListWithContext(ctx, opts)
}

// List and Watch complete cache.ListerWatcher; the reflector calls the
// context variants.
func (h *healthListerWatcher) List(opts metav1.ListOptions) (runtime.Object, error) {
	return h.ListWithContext(context.Background(), opts)
}

func (h *healthListerWatcher) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return h.WatchWithContext(context.Background(), opts)
}

func (h *healthListerWatcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	gen := h.r.watchState.Load()>>1 + 1
	if h.r.watchState.Swap(gen<<1)&1 == 1 {
		h.r.downSince.Store(time.Now().UnixNano())
	}
	w, err := h.lw.WatchWithContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if initial {
		h.r.needReplaces.Store(h.r.store.Replaces() + 1)
	}
	h.r.watchState.Store(gen<<1 | 1)
	h.r.watchOpened.Store(true)
	hw := &healthWatch{inner: w, out: make(chan watch.Event), done: make(chan struct{}),
		initial: initial, logger: klog.FromContext(ctx).WithValues("resource", h.r.label)}
	if !initial {
		// A watch from N gets the events after N; from "0" or "" (which
		// the reflector does not make after a list), synthetic ADDED
		// events first, in no RV order: those are not checked.
		if rv, err := store.ParseResourceVersion(opts.ResourceVersion); err == nil && rv > 0 {
			hw.from = rv
		}
	}
	go hw.relay(h.r, gen)
	return hw, nil
}

type healthWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	done     chan struct{}
	stopOnce sync.Once
	// from is the RV the watch started from (0: none to check against);
	// initial: it starts with initial events (a watch-list), in key
	// order, not RV order, ended by a bookmark at the RV they are at.
	from    uint64
	initial bool
	logger  klog.Logger
}

// relay passes events on and marks the watch closed (unless a newer one
// has opened) on an error event or when the watch ends.
//
// An object event whose resourceVersion is not after the RV the watch
// started from, nor after the events and bookmarks before it, means the
// upstream's history went back (its etcd was restored from a backup): the
// Store holds objects of a history that no longer exists, and only a list
// can tell which. So the event is not passed on; the reflector gets a 410
// Expired ERROR instead, which makes it relist (from its RV, which the
// upstream answers "too large resource version", then from the latest).
// A watch-list's initial events are not checked: they come in key order,
// and the initial-events-end bookmark gives the RV they are at.
func (w *healthWatch) relay(r *informer, gen uint64) {
	closed := func() {
		if r.watchState.CompareAndSwap(gen<<1|1, gen<<1) {
			r.downSince.Store(time.Now().UnixNano())
		}
	}
	defer close(w.out)
	defer closed()
	last, checking := w.from, w.from > 0
	for ev := range w.inner.ResultChan() {
		if ev.Type == watch.Error {
			closed()
		} else if rv, ok := objectRV(ev.Object); ok {
			switch {
			case ev.Type == watch.Bookmark:
				if w.initial && isInitialEventsEnd(ev.Object) {
					checking = true
				}
				last = max(last, rv)
			case checking:
				if rv <= last {
					w.logger.Info("The upstream's resourceVersion went back; relisting", "resourceVersion", last, "event", rv)
					closed()
					ev = watch.Event{Type: watch.Error, Object: statusOf(apierrors.NewResourceExpired(
						fmt.Sprintf("resourceVersion went back from %d to %d", last, rv)))}
					select {
					case w.out <- ev:
					case <-w.done:
					}
					return
				}
				last = rv
			}
		}
		select {
		case w.out <- ev:
		case <-w.done:
			return
		}
	}
}

// objectRV returns obj's resourceVersion, if it has one (kube-apiserver
// issues none below 1).
func objectRV(obj runtime.Object) (uint64, bool) {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetResourceVersion() == "" {
		return 0, false
	}
	rv, err := store.ParseResourceVersion(m.GetResourceVersion())
	return rv, err == nil && rv > 0
}

// isInitialEventsEnd reports whether obj is the bookmark that ends a
// watch-list's initial events.
func isInitialEventsEnd(obj runtime.Object) bool {
	m, err := meta.Accessor(obj)
	return err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
}

func (w *healthWatch) Stop() {
	w.stopOnce.Do(func() { close(w.done) })
	w.inner.Stop()
}

func (w *healthWatch) ResultChan() <-chan watch.Event { return w.out }
