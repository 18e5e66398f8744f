package interception

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/internal/nodeimpersonation"
)

// Whose identity lists and watches this node's pods for detect-local and
// the pod-path check (LocalPods.Source).
const (
	// PodsSourceNode: as the node (Impersonate-User: system:node:<node>,
	// --cache-as-node), which the Node authorizer limits to this node's
	// pods.
	PodsSourceNode = "node"
	// PodsSourceAgent: as the agent's own ServiceAccount, with the same
	// spec.nodeName field selector: with --cache-as-node=false, or as the
	// fallback while kube-apiserver refuses the node impersonation (before
	// Kubernetes 1.36, the ConstrainedImpersonation gate off, the binding
	// missing, a token not bound to this node) and the agent's RBAC allows
	// it. Only the pods' IPs are kept, for the agent's own sets: nothing
	// read this way is served to anyone.
	PodsSourceAgent = "agent"
	// PodsSourceNone: neither identity may list them, or they are not
	// listed yet. In PodIPs mode the redirect then matches no pod until
	// they are (LocalPods.HostNetworkOnly).
	PodsSourceNone = "none"
)

// PodsSources lists the values of LocalPods.Source, and of the source
// label of kube_apicache_local_pods_source.
var PodsSources = []string{PodsSourceNode, PodsSourceAgent, PodsSourceNone}

// LocalPods is where the agent learns this node's pod IPs from, and what
// that means for interception; the one answer /intercepting, the status,
// the metric and the log all give.
type LocalPods struct {
	// Source is one of PodsSources; "" when the agent does not follow this
	// node's pods (neither PodIPs mode nor the pod-path check).
	Source string
	// Reason says why the pods are not listed as the node: the refusal
	// with what to change (agent, none), or that they are not listed yet;
	// "" for node, and for agent with --cache-as-node=false.
	Reason string
	// HostNetworkOnly is set in PodIPs mode while this node's pods have
	// never been listed: the pods set is empty, so the redirect takes
	// host-network traffic only and every pod goes to kube-proxy's path.
	HostNetworkOnly bool
}

// How often podsSource tries the node again while the agent's identity
// works, and how it backs off while both are refused.
const (
	podsNodeRetryPeriod = 10 * time.Minute
	podsRefusedBackoff  = 10 * time.Second
	podsRefusedMaxWait  = 5 * time.Minute
)

// podsNotListedYet is the reason before the first list.
const podsNotListedYet = "this node's pods are not listed yet"

// podsSource is the source of the watch of this node's pods: each list
// and watch the reflector makes goes as the node first, and as the agent
// when kube-apiserver refuses the node impersonation. While the agent's
// identity serves, the node is tried again every podsNodeRetryPeriod at
// the next list or watch (a watch ends every 5 to 10 minutes), so a
// binding fixed later is picked up. While both are refused, no request
// is made before a jittered backoff of up to podsRefusedMaxWait has
// passed: a fleet of agents refused at once does not hammer
// kube-apiserver. Other errors (unreachable, 5xx) change nothing: the
// reflector retries them as it does any.
type podsSource struct {
	// Fixed at construction. asNode is nil without impersonation; user is
	// the impersonated node's user name.
	asNode, asAgent toolscache.ListerWatcherWithContext
	user            string
	now             func() time.Time
	gauge           *prometheus.GaugeVec

	mu sync.Mutex // protects the fields below
	// source and reason are what LocalPods reports.
	source, reason string
	// nodeRefusal explains the latest refusal of the node impersonation;
	// the node is tried again from retryNodeAt.
	nodeRefusal string
	retryNodeAt time.Time
	// refusedUntil: while both are refused, no request before it;
	// backoff paces it.
	refusedUntil time.Time
	backoff      wait.Backoff
}

// newPodsSource returns the source of the pods watch, reporting none
// (not listed yet) until its first list or watch.
func newPodsSource(asNode, asAgent toolscache.ListerWatcherWithContext, user string, now func() time.Time, gauge *prometheus.GaugeVec) *podsSource {
	s := &podsSource{asNode: asNode, asAgent: asAgent, user: user, now: now, gauge: gauge}
	s.resetBackoff()
	setPodsSourceGauge(s.gauge, PodsSourceNone)
	s.source, s.reason = PodsSourceNone, podsNotListedYet
	return s
}

func (s *podsSource) resetBackoff() {
	s.backoff = wait.Backoff{Duration: podsRefusedBackoff, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: podsRefusedMaxWait}
}

// setPodsSourceGauge sets g to 1 for source and 0 for the others.
func setPodsSourceGauge(g *prometheus.GaugeVec, source string) {
	if g == nil {
		return
	}
	for _, src := range PodsSources {
		v := 0.0
		if src == source {
			v = 1
		}
		g.WithLabelValues(src).Set(v)
	}
}

// state returns the source and its reason.
func (s *podsSource) state() (source, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.source, s.reason
}

func (s *podsSource) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return through(ctx, s, func(lw toolscache.ListerWatcherWithContext) (runtime.Object, error) {
		return lw.ListWithContext(ctx, opts)
	})
}

func (s *podsSource) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return through(ctx, s, func(lw toolscache.ListerWatcherWithContext) (watch.Interface, error) {
		return lw.WatchWithContext(ctx, opts)
	})
}

// List and Watch complete cache.ListerWatcher; the reflector calls the
// context variants.
func (s *podsSource) List(opts metav1.ListOptions) (runtime.Object, error) {
	return s.ListWithContext(context.Background(), opts)
}

func (s *podsSource) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return s.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported tells the reflector whether it may open
// watch-lists: as the agent's client says.
func (s *podsSource) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(s.asAgent)
}

// through makes one list or watch (call) with the identity the state
// picks, falls back to the agent's when the node's is refused, and
// records the outcome.
func through[T any](ctx context.Context, s *podsSource, call func(toolscache.ListerWatcherWithContext) (T, error)) (T, error) {
	var zero T
	now := s.now()
	s.mu.Lock()
	if s.source == PodsSourceNone && now.Before(s.refusedUntil) {
		wait := s.refusedUntil.Sub(now)
		s.mu.Unlock()
		return zero, fmt.Errorf("this node's pods may be listed neither as the node nor as the agent; next attempt in %s", wait.Round(time.Second))
	}
	tryNode := s.asNode != nil && (s.source != PodsSourceAgent || !now.Before(s.retryNodeAt))
	nodeWhy := s.nodeRefusal
	s.mu.Unlock()
	if tryNode {
		out, err := call(s.asNode)
		if err == nil {
			s.record(ctx, PodsSourceNode, "", nil)
			return out, nil
		}
		why, refused := nodeimpersonation.ExplainRefusal(err, s.user)
		if !refused {
			s.failed(ctx, err)
			return zero, err
		}
		nodeWhy = why
		s.mu.Lock()
		s.nodeRefusal, s.retryNodeAt = why, now.Add(podsNodeRetryPeriod)
		s.mu.Unlock()
	}
	out, err := call(s.asAgent)
	switch {
	case err == nil:
		// Without impersonation (--cache-as-node=false) the agent is the
		// source by choice: no reason to give.
		reason := ""
		if s.asNode != nil {
			reason = "kube-apiserver refused to list them as the node: " + nodeWhy
		}
		s.record(ctx, PodsSourceAgent, reason, nil)
		return out, nil
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		reason := "kube-apiserver refused to list them as the agent: " + err.Error()
		if s.asNode != nil {
			reason = "kube-apiserver refused to list them as the node (" + nodeWhy + ") and as the agent (" + err.Error() + ")"
		}
		s.record(ctx, PodsSourceNone, reason, err)
		return zero, err
	}
	s.failed(ctx, err)
	return zero, err
}

// record sets the source after an answer (err nil) or a refusal of both
// identities, logging each change.
func (s *podsSource) record(ctx context.Context, source, reason string, err error) {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	changed := source != s.source || reason != s.reason
	s.source, s.reason = source, reason
	wait := time.Duration(0)
	if source == PodsSourceNone {
		wait = s.backoff.Step()
		s.refusedUntil = s.now().Add(wait)
	} else {
		s.resetBackoff()
		s.refusedUntil = time.Time{}
	}
	s.mu.Unlock()
	if !changed {
		if source == PodsSourceNone {
			logger.V(2).Info("Still refused this node's pods", "podsSource", source, "reason", reason, "nextAttempt", wait.Round(time.Second))
		}
		return
	}
	setPodsSourceGauge(s.gauge, source)
	switch source {
	case PodsSourceNode:
		logger.Info("Listing this node's pods as the node", "podsSource", source, "as", s.user)
	case PodsSourceAgent:
		logger.Info("Listing this node's pods as the agent", "podsSource", source, "reason", reason)
	default:
		logger.Error(err, "Cannot list this node's pods; pods the redirect matches by IP are not intercepted until they are",
			"podsSource", source, "reason", reason, "nextAttempt", wait.Round(time.Second))
	}
}

// failed notes an error that is no refusal: the source stays, and before
// the first answer the reason says what failed.
func (s *podsSource) failed(ctx context.Context, err error) {
	s.mu.Lock()
	if s.source == PodsSourceNone {
		s.reason = "listing this node's pods: " + err.Error()
	}
	s.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Listing this node's pods failed; retrying", "err", err)
}
