package cache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/cache/store"
)

// Cache answers covered get and list requests from one shared watch per
// resource, and forwards everything else.
type Cache struct {
	// Fixed at construction.
	cfg       Config
	resources []*resource
	// byGR finds a resource by group and resource.
	byGR map[schema.GroupResource]*resource
	// crds follows the CRDs of cached custom resources; nil if none are
	// configured.
	crds    *crdIndex
	metrics *metrics
	now     func() time.Time
	// clock times informers' idleness (ondemand.go).
	clock clock.Clock
	// observing is the bytes of write answers being read (write.go).
	observing atomic.Int64
	// sources bounds each source's requests in the cache's hands.
	sources *sourceLimiter
	// probes bounds what consistent-read probes list (probebudget.go).
	probes *probeBudget
}

// New returns a Cache for cfg. It starts nothing; Run does.
func New(cfg Config) (*Cache, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("cache: node name is required")
	}
	if cfg.RESTConfig == nil {
		return nil, errors.New("cache: a client configuration is required")
	}
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	switch cfg.ConsistentReads {
	case "":
		cfg.ConsistentReads = ConsistentProbe
	case ConsistentProbe, ConsistentLocalWrites, ConsistentForward:
	default:
		return nil, fmt.Errorf("cache: consistent reads %q: must be one of %s", cfg.ConsistentReads, strings.Join(ConsistentReadModes, ", "))
	}
	if cfg.ProbeMaxObjects == 0 {
		cfg.ProbeMaxObjects = DefaultProbeMaxObjects
	}
	if cfg.MaxInFlightPerSource == 0 {
		cfg.MaxInFlightPerSource = DefaultMaxInFlightPerSource
	}
	if cfg.IdleTimeout < 0 {
		return nil, errors.New("cache: the idle timeout must not be negative")
	}
	if err := CheckPinned(cfg.Pinned, cfg.Resources); err != nil {
		return nil, err
	}
	c := &Cache{cfg: cfg, byGR: map[schema.GroupResource]*resource{}, now: time.Now, clock: clock.RealClock{},
		crds: newCRDIndex(cfg.Resources), sources: newSourceLimiter(cfg.MaxInFlightPerSource), probes: newProbeBudget(cfg.ProbeBudget)}
	pinned := map[schema.GroupResource]bool{}
	for _, p := range cfg.Pinned {
		pinned[p.GroupResource()] = true
	}
	for _, spec := range cfg.Resources {
		r := newResource(spec, cfg.NodeName)
		r.historyEvents, r.historyBytes = cfg.HistoryEvents, cfg.HistoryBytes
		r.crds = c.crds
		r.pinned = pinned[spec.GroupResource()]
		c.resources = append(c.resources, r)
		c.byGR[spec.GroupResource()] = r
	}
	c.metrics = newMetrics(c)
	for _, r := range c.resources {
		r.metrics = c.metrics
	}
	if cfg.Registerer != nil {
		if err := c.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("registering cache metrics: %w", err)
		}
	}
	return c, nil
}

// Run resolves and watches the resources until ctx ends: each pinned
// resource (every resource, without OnDemand) from the start, the others
// while they are read (ondemand.go). It returns once every informer has
// stopped.
func (c *Cache) Run(ctx context.Context) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.cfg.RESTConfig)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cache disabled: cannot build a discovery client")
		return
	}
	var wg sync.WaitGroup
	for _, r := range c.resources {
		wg.Go(func() { c.manage(ctx, r, dc) })
	}
	wg.Wait()
}

// Resources returns the cached resources' state, for status and tests.
func (c *Cache) Resources() []ResourceState {
	out := make([]ResourceState, 0, len(c.resources))
	for _, r := range c.resources {
		out = append(out, c.state(r))
	}
	return out
}

// PinnedUnsynced returns the labels of the resources watched from
// start-up (pinned, or all of them without OnDemand) whose Stores have
// not synced yet, in configuration order.
func (c *Cache) PinnedUnsynced() []string {
	var out []string
	for _, r := range c.resources {
		if st := c.state(r); st.Pinned && !st.Synced {
			out = append(out, st.Resource)
		}
	}
	return out
}

// ResourceState is one resource's cache state.
type ResourceState struct {
	Resource string
	// State is StateIdle, StateStarting or StateSynced.
	State string
	// Pinned: the informer always runs.
	Pinned          bool
	Synced          bool
	Healthy         bool
	Objects         int
	ResourceVersion uint64
	// Watching: the informer holds its watch open upstream.
	Watching bool
	// History is the event window watches are served from.
	History store.HistoryStats
	// Lists counts the running informer's lists: the first, and a relist
	// each time its watch could not resume from its resourceVersion.
	Lists uint64
}

func (c *Cache) state(r *resource) ResourceState {
	st, inf := r.informerState()
	s := ResourceState{Resource: r.label, State: st, Pinned: r.pinned || !c.cfg.OnDemand}
	if inf != nil {
		s.Watching = inf.watchOpen()
	}
	if inf != nil && inf.ready.Load() {
		s.Synced = inf.store.Synced()
		s.Healthy = inf.healthy()
		s.Objects = inf.store.Len()
		s.ResourceVersion = inf.store.ResourceVersion()
		s.History = inf.store.History()
		s.Lists = inf.store.Replaces()
	}
	return s
}

// Informers returns how many informers run, each holding one list or
// watch open upstream: those of resources not idle, and the watch of
// CustomResourceDefinitions while a custom resource's informer runs.
func (c *Cache) Informers() int {
	n := 0
	for _, r := range c.resources {
		if r.current.Load() != nil {
			n++
		}
	}
	if c.crds != nil && c.crds.running() {
		n++
	}
	return n
}

// lookup returns the informer serving gvr, once it is resolved.
func (c *Cache) lookup(gvr schema.GroupVersionResource) *informer {
	e := c.byGR[gvr.GroupResource()]
	if e == nil {
		return nil
	}
	r := e.current.Load()
	if r == nil || !r.ready.Load() || r.gvr != gvr {
		return nil
	}
	if !r.builtin && (c.crds == nil || !c.crds.serves(gvr, r.selectable)) {
		// The CRD is gone, changed its served versions or selectable
		// fields, or is not listed yet.
		return nil
	}
	return r
}

type planKey struct{}

// Handler returns the request path: requests the cache can answer for an
// authorized caller are served by hit (wrapped by wrapHit, for the agent's
// request metrics); all others go to forward unchanged, but for the
// timeoutSeconds of a watch the cache will serve soon (forwarded.go). The
// request must carry its RequestInfo in the context.
func (c *Cache) Handler(forward http.Handler, wrapHit func(http.Handler) http.Handler) http.Handler {
	hit := wrapHit(http.HandlerFunc(c.serve))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := request.RequestInfoFrom(r.Context())
		p, reason := c.classify(r, info)
		if p == nil {
			c.forward(w, r, info, reason, forward)
			return
		}
		if c.cfg.Reviewer == nil {
			c.forward(w, r, info, reasonNoReviewer, forward)
			return
		}
		release, ok := c.sources.acquire(r)
		if !ok {
			c.forward(w, r, info, reasonSourceShare, forward)
			return
		}
		// The source's slot is held while the cache decides (the review
		// and the resourceVersion wait, which a caller can make long),
		// not while it answers: answers have the in-flight bound of
		// wrapHit, which answers 429 past it as kube-apiserver does.
		defer release()
		fwd := func(reason string) {
			release()
			c.forward(w, r, info, reason, forward)
		}
		res := c.cfg.Reviewer.Review(r, info)
		switch res.Verdict {
		case access.Allowed:
			if p.idle != nil {
				// The read would be answered once the resource's
				// informer has synced; an allowed caller starts it.
				c.wake(p.idle)
				fwd(reasonIdle)
				return
			}
			r = r.WithContext(access.WithResult(r.Context(), res))
		case access.Denied:
			r = r.WithContext(access.WithResult(r.Context(), res))
			c.metrics.outcome(info, "denied", "")
			err := res.Err
			if err == nil {
				err = apierrors.NewForbidden(schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}, info.Name, errors.New("access denied"))
			}
			release()
			hit.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), planKey{}, err)))
			return
		default:
			fwd("review-" + res.Reason)
			return
		}
		if reason := c.await(r.Context(), p, sourceOf(r)); reason != "" {
			// Answered once the cache catches up: the informer is in use.
			c.touch(p.res.resource)
			fwd(reason)
			return
		}
		if p.fromRV && p.badRequest == nil {
			// Decided, and the watch's place in the history taken, before
			// anything of the answer is written.
			if reason := c.placeWatch(r.Context(), p); reason != "" {
				fwd(reason)
				return
			}
		}
		if p.verb == "get" && p.badRequest == nil && !p.mayBeAbsent {
			if _, _, ok := p.res.store.Get(p.namespace, p.name); !ok {
				fwd(reasonOutOfScope)
				return
			}
		}
		if p.verb == "list" && p.badRequest == nil && p.mode != rvAny && p.limit > 0 {
			if objs, _ := p.snapshot(); int64(len(objs)) > p.limit {
				// kube-apiserver would paginate; continue tokens are its own.
				fwd(reasonPaginated)
				return
			}
		}
		c.touch(p.res.resource)
		c.metrics.outcome(info, "hit", "")
		release()
		hit.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), planKey{}, p)))
	})
}

// await waits (bounded) until the cache may answer p's resourceVersion
// semantics for a read from src, and returns a reason to forward if it
// may not.
func (c *Cache) await(ctx context.Context, p *plan, src string) string {
	if p.badRequest != nil {
		return ""
	}
	if p.verb == "watch" && !degraded(ctx) && !c.awaitHealthy(ctx, p.res) {
		// The Store's own watch is broken (an apiserver restarted, etcd
		// compacted) and did not come back within the wait: its events
		// stopped, and a relist will end the watches it serves.
		// kube-apiserver answers the watch instead.
		return reasonUnhealthy
	}
	var want uint64
	switch {
	case p.fromRV:
		return ""
	case p.mode == rvAny:
		return ""
	case p.mode == rvNotOlderThan:
		want = p.minRV
	case p.mode == rvConsistent && c.cfg.ConsistentReads == ConsistentProbe && (p.verb != "watch" || p.streaming):
		// A watch with sendInitialEvents (given, or defaulted for a watch
		// from "" as kube-apiserver defaults it) starts at
		// kube-apiserver's current state, with its initial events or
		// without: a consistent read too.
		if !p.res.healthy() {
			return reasonUnhealthy
		}
		return c.awaitProbe(ctx, p, src)
	case p.mode == rvConsistent:
		if !p.res.healthy() {
			return reasonUnhealthy
		}
		barrier, recent, overdue := p.res.barrierState(c.now(), c.cfg.WaitTimeout)
		switch {
		case recent:
			return reasonRecentWrite
		case overdue:
			// Earlier reads waited for this barrier in vain.
			return reasonBarrier
		}
		want = barrier
	}
	if p.res.store.ResourceVersion() >= want {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WaitTimeout)
	defer cancel()
	if err := p.res.store.WaitForResourceVersion(ctx, want); err != nil {
		if errors.Is(err, store.ErrStoreClosed) {
			// The informer stopped meanwhile.
			return reasonNotSynced
		}
		if p.mode == rvConsistent {
			return reasonBarrier
		}
		return reasonTooNew
	}
	return ""
}

// awaitProbe waits (bounded) for a probe of res that started after the
// read from src arrived, then for the Store to hold at least the probed
// state (probe.go), and returns a reason to forward if it does not. A
// read that would start a probe pays for it first (probebudget.go).
func (c *Cache) awaitProbe(ctx context.Context, p *plan, src string) string {
	res := p.res
	if res.prober == nil {
		return reasonConsistent
	}
	n := res.store.Len()
	if limit := c.cfg.ProbeMaxObjects; limit > 0 && n > limit {
		return reasonProbeTooLarge
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WaitTimeout)
	defer cancel()
	start := c.now()
	refused := ""
	result, err := res.prober.await(ctx, func() bool {
		refused = c.probes.take(start, src, probeCost(n, p))
		return refused == ""
	})
	if errors.Is(err, errProbeBudget) {
		c.metrics.probeRefused(res.label, refused)
		return reasonProbeBudget
	}
	if err != nil {
		c.metrics.probeWait(res.label, "probe-failed", c.now().Sub(start))
		return reasonProbeFailed
	}
	if !awaitCurrent(ctx, res.store, result) {
		c.metrics.probeWait(res.label, "behind", c.now().Sub(start))
		if res.stopped.Load() {
			return reasonNotSynced
		}
		return reasonProbeBehind
	}
	c.metrics.probeWait(res.label, "current", c.now().Sub(start))
	return ""
}

// healthPoll is how often a watch waiting for its resource's own watch to
// reopen checks it.
const healthPoll = 20 * time.Millisecond

// awaitHealthy waits, at most WaitTimeout, for res's own watch to be open
// and synced. The clients of the watches a relist ended come back at once,
// before the informer's next watch has opened: were they forwarded, each
// would hold a watch upstream for its whole life.
func (c *Cache) awaitHealthy(ctx context.Context, res *informer) bool {
	if res.healthy() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WaitTimeout)
	defer cancel()
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			if res.stopped.Load() {
				return false
			}
			if res.healthy() {
				return true
			}
		}
	}
}

// serve writes the answer planned by Handler.
func (c *Cache) serve(w http.ResponseWriter, r *http.Request) {
	switch v := r.Context().Value(planKey{}).(type) {
	case error:
		writeStatus(w, r, v)
	case *plan:
		c.servePlan(w, r, v)
	}
}

func (c *Cache) servePlan(w http.ResponseWriter, r *http.Request, p *plan) {
	if p.badRequest != nil {
		writeStatus(w, r, p.badRequest)
		return
	}
	switch {
	case p.verb == "watch":
		c.serveWatch(w, r, p)
		return
	case p.as == asTable:
		c.serveTable(w, r, p)
		return
	case p.as == asMetadata:
		c.serveMetadata(w, r, p)
		return
	}
	res := p.res
	enc := res.encoder
	h := w.Header()
	h.Set("Content-Type", p.media.ContentType())
	h.Set("Cache-Control", "no-cache, private")
	if p.verb == "get" {
		o, _, ok := res.store.Get(p.namespace, p.name)
		if !ok {
			writeStatus(w, r, apierrors.NewNotFound(res.gvr.GroupResource(), p.name))
			return
		}
		body, err := enc.Object(p.media, o)
		if err != nil {
			c.encodingFailed(w, r, res, err)
			return
		}
		_ = body.WriteAll(w)
		return
	}
	// Read before the snapshot, unless the handler took it already (the
	// Store's resourceVersion is checked too).
	gen := res.gzipped.generation()
	objs, rv := p.snapshot()
	gzipOK := acceptsGzip(r)
	if gzipOK {
		if gz, ok := res.gzipped.lookup(p.media, objs, rv); ok {
			writeGzip(w, gz)
			return
		}
	}
	body, err := enc.List(p.media, objs, rv)
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	if gzipOK && body.Size() > gzipThreshold {
		if gz, err := res.gzipped.compress(gen, res.store.ResourceVersion, p.media, objs, rv, body); err == nil {
			writeGzip(w, gz)
			return
		}
	}
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := body.WriteAll(bw); err == nil {
		_ = bw.Flush()
	}
}

// newline ends a JSON answer.
var newline = []byte("\n")

// serveMetadata answers a metadata-only get or list.
func (c *Cache) serveMetadata(w http.ResponseWriter, r *http.Request, p *plan) {
	res := p.res
	var b *store.Body
	var err error
	if p.verb == "get" {
		o, _, ok := res.store.Get(p.namespace, p.name)
		if !ok {
			writeStatus(w, r, apierrors.NewNotFound(res.gvr.GroupResource(), p.name))
			return
		}
		if b, err = res.encoder.MetadataObject(p.media, o); err == nil && p.media == store.MediaJSON {
			b.Add(newline)
		}
	} else {
		objs, rv := p.snapshot()
		b, err = res.encoder.MetadataList(p.media, objs, rv)
	}
	if err != nil {
		c.encodingFailed(w, r, res, err)
		return
	}
	w.Header().Set("Content-Type", p.media.ContentType())
	w.Header().Set("Cache-Control", "no-cache, private")
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := b.WriteAll(bw); err == nil {
		_ = bw.Flush()
	}
}

// encodingFailed answers 500 for an object the cache could not encode; it
// is a bug, never expected.
func (c *Cache) encodingFailed(w http.ResponseWriter, r *http.Request, res *informer, err error) {
	klog.FromContext(r.Context()).Error(err, "Encoding cached objects failed", "resource", res.label)
	w.Header().Del("Content-Type")
	writeStatus(w, r, apierrors.NewInternalError(err))
}

// writeStatus writes err as kube-apiserver does, in the media type the
// client negotiated.
func writeStatus(w http.ResponseWriter, r *http.Request, err error) {
	responsewriters.ErrorNegotiated(err, scheme.Codecs.WithoutConversion(), schema.GroupVersion{Version: "v1"}, w, r)
}

// probeCost is what a probe of a scope of n objects is charged to the
// read p that starts it (probebudget.go): the objects it lists beyond
// what the read would cost kube-apiserver forwarded (the objects it
// returns, and at least probeMinCost); zero when it lists no more.
func probeCost(n int, p *plan) int {
	read := 1
	switch {
	case p.verb == "watch" && !p.initialEvents:
		// It starts with no object: the probe is all it costs.
		read = 0
	case p.verb != "get":
		read = p.res.store.Count(p.pred)
		if p.limit > 0 && int64(read) > p.limit {
			read = int(p.limit)
		}
	}
	return max(n-max(read, probeMinCost), 0)
}
