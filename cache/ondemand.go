package cache

import (
	"context"
	"net/http"
	"strings"
	"time"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
)

// Caching on demand.
//
// A resource that is not pinned starts idle: no discovery, list or watch.
// The first read the cache would answer for it, from a caller the access
// review allows, wakes its manager, which starts an informer; that read
// and every read until the Store has synced are forwarded. A caller who
// may not read the resource cannot make the agent watch it. Once the
// informer has run for IdleTimeout without a read it answered or would
// have answered for an allowed caller, it stops and its Store is dropped;
// the next such read starts a new one, from a new list.
//
// Restarts are bounded by the idle timeout itself: an informer lives at
// least IdleTimeout (starting counts as a read), so a resource is listed at
// most once per IdleTimeout per node, whatever its readers do.
//
// Races. A request holds the informer its plan was made with: an informer
// that stops under it leaves it a Store that no longer changes but is
// consistent at its resourceVersion, and stopping marks the informer
// unhealthy and closes its Store, so consistent reads and resourceVersion
// waits still in progress are forwarded instead. A watch-list writes its
// initial events from a snapshot taken before, and continues from an
// upstream watch that does not involve the informer. The read-your-writes
// barrier belongs to the resource, not the informer, so a restarted
// informer (whose first list may be older than a write relayed while the
// resource was idle) answers consistent reads only once it has reached it.

// State names of a resource's informer.
const (
	// StateIdle: no informer runs; reads are forwarded.
	StateIdle = "idle"
	// StateStarting: an informer runs but its Store has not synced.
	StateStarting = "starting"
	// StateSynced: the Store has synced; reads may be answered.
	StateSynced = "synced"
)

// reasonIdle is why the read that woke an idle resource was forwarded.
const reasonIdle = "idle"

// manage runs r's informers until ctx ends: one for the whole time if r is
// pinned or the cache is not on demand, else one per demand until it has
// been idle for IdleTimeout.
func (c *Cache) manage(ctx context.Context, r *resource, dc discovery.DiscoveryInterface) {
	always := r.pinned || !c.cfg.OnDemand
	for {
		if !always {
			select {
			case <-ctx.Done():
				return
			case <-r.demand:
			}
		}
		stop := c.start(ctx, r, dc)
		if always || c.cfg.IdleTimeout <= 0 {
			<-ctx.Done()
			stop("shutdown")
			return
		}
		if !c.waitIdle(ctx, r) {
			stop("shutdown")
			return
		}
		// A wake-up sent while the informer ran is stale.
		select {
		case <-r.demand:
		default:
		}
		stop("idle")
	}
}

// start starts an informer for r and returns the function that stops it.
func (c *Cache) start(ctx context.Context, r *resource, dc discovery.DiscoveryInterface) func(why string) {
	logger := klog.FromContext(ctx).WithValues("resource", r.label)
	inf := newInformer(r)
	inf.started = c.clock.Now()
	r.lastUsed.Store(inf.started.UnixNano())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	custom := c.crds != nil && c.crds.wanted[r.spec.GroupResource()]
	if custom && c.crds.acquire(ctx, c.cfg.RESTConfig) {
		c.metrics.started(crdLabel)
	}
	r.current.Store(inf)
	c.metrics.started(r.label)
	logger.V(2).Info("Starting informer", "pinned", r.pinned || !c.cfg.OnDemand)
	go func() {
		defer close(done)
		inf.run(runCtx, c.watchConfig(r), dc, nil)
	}()
	return func(why string) {
		// New requests stop finding the informer before it stops, and
		// requests that still hold it see it stopped.
		r.current.CompareAndSwap(inf, nil)
		inf.stop()
		cancel()
		<-done
		if custom && c.crds.release() {
			c.metrics.stopped(crdLabel)
		}
		c.metrics.stopped(r.label)
		logger.V(2).Info("Stopped informer", "reason", why)
	}
}

// stop marks the informer stopped: not healthy, its Store closed to
// waiters, its compressed lists dropped. The caller cancels its run.
func (r *informer) stop() {
	r.stopped.Store(true)
	if r.ready.Load() {
		r.store.Close()
	}
	r.gzipped.clear()
}

// waitIdle waits until r has had no read for IdleTimeout (true) or ctx
// ends (false).
func (c *Cache) waitIdle(ctx context.Context, r *resource) bool {
	for {
		if r.watchers.Load() > 0 {
			// A watch it serves is a read that lasts.
			c.touch(r)
		}
		left := time.Duration(r.lastUsed.Load()) + c.cfg.IdleTimeout - time.Duration(c.clock.Now().UnixNano())
		if left <= 0 {
			return true
		}
		t := c.clock.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
}

// touch records a read r's informer answered or would have answered.
func (c *Cache) touch(r *resource) {
	r.lastUsed.Store(c.clock.Now().UnixNano())
}

// wake asks r's manager to start an informer; it never blocks.
func (c *Cache) wake(r *resource) {
	c.touch(r)
	select {
	case r.demand <- struct{}{}:
	default:
	}
}

// state returns r's informer state.
func (r *resource) informerState() (string, *informer) {
	inf := r.current.Load()
	switch {
	case inf == nil:
		return StateIdle, nil
	case inf.ready.Load() && inf.store.Synced():
		return StateSynced, inf
	}
	return StateStarting, inf
}

// wouldServe reports whether the cache would answer r for res, an idle
// resource, once its informer has synced: the checks of classify that
// need no discovery. It errs towards yes (a read of another version than
// the preferred one, or a get of a pod on another node, which the
// informer then forwards), which costs at most one informer start per idle
// timeout; never towards no for a read the cache answers. The request has
// passed classify's checks of verb and subresource.
func (c *Cache) wouldServe(r *http.Request, info *request.RequestInfo, res *resource) bool {
	if res.spec.Version != "" && info.APIVersion != res.spec.Version {
		return false
	}
	for k := range r.Header {
		if strings.HasPrefix(k, "Impersonate-") {
			return false
		}
	}
	if auth := r.Header.Get("Authorization"); len(auth) < 7 || !strings.EqualFold(auth[:7], "bearer ") {
		return false
	}
	builtin := res.spec.Group == "" || scheme.Scheme.IsGroupRegistered(res.spec.Group)
	if _, _, reason := negotiateShape(r, builtin, info.Verb); reason != "" {
		return false
	}
	query := r.URL.Query()
	allowed := getParams
	switch info.Verb {
	case "list":
		allowed = listParams
	case "watch":
		allowed = watchParams
	}
	for k := range query {
		if !allowed[k] && k != "includeObject" {
			return false
		}
	}
	if info.Verb == "get" {
		var opts metav1.GetOptions
		if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &opts); err != nil {
			return false
		}
		if _, _, reason := c.rvModeOf(opts.ResourceVersion, "", 0); reason != "" {
			return false
		}
		// A get of the Node answers only this node's; a pod's get may be
		// of a pod on this node.
		if v, ok := res.scopeTerms["metadata.name"]; ok && v != info.Name {
			return false
		}
		return true
	}
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &opts); err != nil {
		return len(res.scopeTerms) == 0
	}
	metainternalversion.SetListOptionsDefaults(&opts, true)
	if errs := metainternalversionvalidation.ValidateListOptions(&opts, true); len(errs) > 0 {
		return false
	}
	if (opts.Watch || opts.SendInitialEvents != nil) != (info.Verb == "watch") {
		return false
	}
	if info.Verb == "watch" && (opts.SendInitialEvents == nil || !*opts.SendInitialEvents || info.Name != "") {
		return false
	}
	for k, v := range res.scopeTerms {
		if opts.FieldSelector == nil {
			return false
		}
		if got, ok := opts.FieldSelector.RequiresExactMatch(k); !ok || got != v {
			return false
		}
	}
	_, _, reason := c.rvModeOf(opts.ResourceVersion, opts.ResourceVersionMatch, opts.Limit)
	return reason == ""
}
