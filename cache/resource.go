package cache

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// resource is one configured resource: what requests it can answer, the
// read-your-writes barrier of the writes the agent relayed for it, and the
// informer that fills its Store while one runs (ondemand.go). One resource
// serves every client.
type resource struct {
	// Fixed at construction.
	spec ResourceSpec
	// scope is the field selector the watch uses; the cache holds exactly
	// the objects it selects. Empty for the whole resource.
	scope fields.Selector
	// scopeTerms are scope's requirements (label → value).
	scopeTerms map[string]string
	// scopeAttrs computes the field set scope is matched against; nil for
	// an unscoped resource.
	scopeAttrs store.AttrsFunc
	// label names the resource in metrics and logs.
	label string
	// crds follows CRDs (nil without custom resources).
	crds *crdIndex
	// pinned: the informer runs from Run until it ends.
	pinned bool
	// historyEvents and historyBytes bound each Store's event window.
	historyEvents, historyBytes int
	// metrics are the cache's; nil in tests that build resources alone.
	metrics *metrics
	// demand wakes the resource's manager when a read would start its
	// informer; it holds at most one wake-up.
	demand chan struct{}

	// current is the informer running now; nil while the resource is idle.
	current atomic.Pointer[informer]
	// lastUsed is when (UnixNano) an allowed caller last made a read the
	// informer answered or would have answered; watchers counts the
	// watches it serves now, which keep it in use.
	lastUsed atomic.Int64
	watchers atomic.Int64

	mu sync.Mutex // protects the fields below
	// barrier is the highest RV a forwarded write of this resource
	// returned; consistent reads wait for the Store to reach it. It
	// outlives informers: a restarted informer may list at an older RV.
	barrier uint64
	// barrierRaised is when barrier last went up.
	barrierRaised time.Time
	// unknownWriteUntil: a write whose RV could not be read was forwarded;
	// consistent reads are forwarded until then.
	unknownWriteUntil time.Time
}

func newResource(spec ResourceSpec, nodeName string) *resource {
	r := &resource{spec: spec, label: spec.GroupResource().String(), scope: fields.Everything(), demand: make(chan struct{}, 1)}
	if spec.Group == "" {
		switch spec.Resource {
		case "pods":
			r.scope = fields.OneTermEqualSelector("spec.nodeName", nodeName)
		case "nodes":
			r.scope = fields.OneTermEqualSelector("metadata.name", nodeName)
		}
	}
	r.scopeTerms = map[string]string{}
	for _, req := range r.scope.Requirements() {
		r.scopeTerms[req.Field] = req.Value
	}
	if !r.scope.Empty() {
		// Only core pods (namespaced) and nodes are scoped.
		namespaced := spec.Resource == "pods"
		r.scopeAttrs = store.AttrsFor(store.FieldLabelsFor(spec.GroupResource(), true, namespaced), namespaced)
	}
	return r
}

// noteWrite records a forwarded write's RV for the read-your-writes barrier.
func (r *resource) noteWrite(rv uint64, known bool, now, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !known {
		if until.After(r.unknownWriteUntil) {
			r.unknownWriteUntil = until
		}
		return
	}
	if rv > r.barrier {
		r.barrier = rv
		r.barrierRaised = now
	}
}

// maxBarrierAge is how long a barrier the Store has not reached is kept.
// A write the upstream really made reaches a healthy watch within
// milliseconds, and a scoped watch (this node's pods) within its next
// bookmark, which kube-apiserver sends every minute; a watch that breaks
// meanwhile relists at the current RV. A barrier still ahead of the Store
// after this long names an RV the upstream never reached, and is dropped
// rather than holding every consistent read back until the agent restarts.
const maxBarrierAge = 2 * time.Minute

// barrierState returns the RV consistent reads must wait for, whether a
// write of unknown RV is recent, and whether the barrier has been ahead of
// the Store for longer than a read may wait (so reads need not wait for it
// again).
func (r *informer) barrierState(now time.Time, wait time.Duration) (rv uint64, recent, overdue bool) {
	storeRV := r.store.ResourceVersion()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.barrier > storeRV && now.Sub(r.barrierRaised) > maxBarrierAge {
		klog.Background().V(2).Info("Dropping a read-your-writes barrier the cache never reached", "resource", r.label,
			"barrier", r.barrier, "resourceVersion", storeRV)
		r.barrier = storeRV
	}
	return r.barrier, now.Before(r.unknownWriteUntil), r.barrier > storeRV && now.Sub(r.barrierRaised) > wait
}
