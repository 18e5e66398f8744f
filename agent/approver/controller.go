package approver

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ControllerOptions tune a Controller.
type ControllerOptions struct {
	// MaxAge is the age past which a pending CSR is left alone: the agent
	// that sent it has given up on it (identity.PendingCSRTimeout) or is
	// gone. Zero decides CSRs of any age.
	MaxAge time.Duration
	// Metrics receives the controller's metrics; nil keeps them unexported.
	Metrics *Metrics
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
}

// nodeIndex indexes the agents' CSRs by the node their requester's token
// is bound to.
const nodeIndex = "node"

// Controller applies a Policy to pending CertificateSigningRequests: it
// watches the CSRs for the policy's signer, ignores those it does not own,
// those already decided and those no agent waits for any more (older than
// MaxAge; or, where it would approve, superseded by a newer CSR from the
// same node), and records Approved or Denied (with the reason) on the
// others.
//
// Its informer holds only the CSRs for the policy's signer (a field
// selector on spec.signerName), and of those only what the decisions
// read: a CSR that needs no decision (decided, not the policy's, stale)
// keeps only its name, age, requester, node and condition types; the
// others lose their managed fields.
type Controller struct {
	// Fixed at construction.
	policy  *Policy
	opts    ControllerOptions
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  certlisters.CertificateSigningRequestLister
	indexer cache.Indexer
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
	metrics *Metrics
	clock   clock.PassiveClock

	// running is true once the informer has synced.
	running atomic.Bool
}

// NewController returns a controller that decides with policy and writes
// through client. policy.SignerName should pass
// identity.ValidateSignerName: the informer's field selector names it, and
// no CSR can carry a name that does not, so the controller would wait for
// CSRs that never come.
func NewController(client kubernetes.Interface, policy *Policy, opts ControllerOptions) *Controller {
	c := &Controller{
		policy:  policy,
		opts:    opts,
		client:  client,
		metrics: opts.Metrics,
		clock:   opts.Clock,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csr-approver"}),
	}
	if c.metrics == nil {
		c.metrics = NewMetrics()
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	c.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", policy.Signer()).String()
		}),
		informers.WithTransform(c.trim))
	inf := c.factory.Certificates().V1().CertificateSigningRequests()
	informer := inf.Informer()
	_ = informer.AddIndexers(cache.Indexers{nodeIndex: c.nodeOf})
	c.lister, c.indexer, c.synced = inf.Lister(), informer.GetIndexer(), informer.HasSynced
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	_ = c.metrics.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_approver_cached_csrs",
		Help: "CSRs for the approver's signer held by the leader's informer.",
	}, func() float64 { return float64(len(c.indexer.ListKeys())) }))
	return c
}

// Synced reports whether Run has filled its cache and decides CSRs.
func (c *Controller) Synced() bool { return c.running.Load() }

// Run decides CSRs with workers in parallel until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		return fmt.Errorf("waiting for the CertificateSigningRequest informer: %w", context.Cause(ctx))
	}
	c.running.Store(true)
	defer c.running.Store(false)
	logger.Info("Approving kube-apicache serving certificates", "signer", c.policy.Signer(), "agent", c.policy.AgentUser,
		"dnsNames", c.policy.SANs.DNSNames, "ips", c.policy.SANs.IPs, "workers", workers, "maxAge", c.opts.MaxAge)
	for range workers {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Deciding CertificateSigningRequest", "csr", key)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// sync decides one CSR, if it is pending, the policy owns it and an agent
// still waits for it.
func (c *Controller) sync(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx)
	csr, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if decided(csr) || !c.policy.Owns(csr) {
		return nil
	}
	if c.stale(csr) {
		c.metrics.ignored.WithLabelValues("stale").Inc()
		logger.V(2).Info("Ignoring a stale certificate request", "csr", csr.Name, "requester", csr.Spec.Username,
			"age", c.clock.Since(csr.CreationTimestamp.Time).Round(time.Second), "maxAge", c.opts.MaxAge)
		return nil
	}
	d := c.policy.Decide(csr)
	// Denials go out whatever their age order: each tells an operator
	// something. An approval of a request its agent no longer waits for
	// would only cost a write and a signature.
	if newer := c.newerFromSameNode(csr); d.Approve && newer != "" {
		c.metrics.ignored.WithLabelValues("superseded").Inc()
		logger.V(2).Info("Ignoring a superseded certificate request", "csr", csr.Name, "newer", newer)
		return nil
	}
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type:           certificatesv1.CertificateDenied,
		Status:         corev1.ConditionTrue,
		Reason:         d.Reason,
		Message:        d.Message,
		LastUpdateTime: metav1.Now(),
	}
	if d.Approve {
		cond.Type = certificatesv1.CertificateApproved
	}
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	if _, err := c.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		c.metrics.updateErrors.Inc()
		return fmt.Errorf("recording %s: %w", cond.Type, err)
	}
	c.metrics.latency.Observe(c.clock.Since(csr.CreationTimestamp.Time).Seconds())
	if d.Approve {
		c.metrics.decisions.WithLabelValues("approved", d.Reason).Inc()
		logger.Info("Approved serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "message", d.Message)
	} else {
		c.metrics.decisions.WithLabelValues("denied", d.Reason).Inc()
		logger.Info("Denied certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", d.Reason, "message", d.Message)
	}
	return nil
}

// stale reports whether csr is older than MaxAge.
func (c *Controller) stale(csr *certificatesv1.CertificateSigningRequest) bool {
	return c.opts.MaxAge > 0 && c.clock.Since(csr.CreationTimestamp.Time) > c.opts.MaxAge
}

// newerFromSameNode returns the name of a CSR the agents' ServiceAccount
// sent from csr's node after csr, if there is one: an agent has one request
// outstanding at a time, so the older one's key is gone (a replaced pod)
// or given up.
func (c *Controller) newerFromSameNode(csr *certificatesv1.CertificateSigningRequest) string {
	nodes, _ := c.nodeOf(csr)
	if len(nodes) != 1 {
		return ""
	}
	objs, err := c.indexer.ByIndex(nodeIndex, nodes[0])
	if err != nil {
		return ""
	}
	for _, obj := range objs {
		o, ok := obj.(*certificatesv1.CertificateSigningRequest)
		if !ok || o.Name == csr.Name {
			continue
		}
		t, ot := csr.CreationTimestamp.Time, o.CreationTimestamp.Time
		if ot.After(t) || (ot.Equal(t) && o.Name > csr.Name) {
			return o.Name
		}
	}
	return ""
}

// nodeOf is the node index function: the node of a CSR from the agents'
// ServiceAccount for the policy's signer. The field selector keeps other
// signers' CSRs out of the informer; should one get in anyway, it must not
// supersede an agent's request.
func (c *Controller) nodeOf(obj any) ([]string, error) {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok || csr.Spec.Username != c.policy.AgentUser || csr.Spec.SignerName != c.policy.Signer() {
		return nil, nil
	}
	if nodes := csr.Spec.Extra[NodeNameExtra]; len(nodes) == 1 && nodes[0] != "" {
		return []string{nodes[0]}, nil
	}
	return nil, nil
}

// trim is the informer's transform: from a CSR that needs no decision
// (decided, not the policy's, stale) it keeps only its name, age,
// requester, node and condition types; from the others it drops the
// managed fields. It is idempotent: a trimmed CSR trims to itself.
func (c *Controller) trim(obj any) (any, error) {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return obj, nil
	}
	if !decided(csr) && c.policy.Owns(csr) && !c.stale(csr) {
		// The approval update sends this object back: keep its metadata
		// but the managed fields (an update without them keeps the
		// stored ones).
		csr.ManagedFields = nil
		return csr, nil
	}
	var node certificatesv1.ExtraValue
	if csr.Spec.Username == c.policy.AgentUser {
		node = csr.Spec.Extra[NodeNameExtra]
	}
	spec := certificatesv1.CertificateSigningRequestSpec{SignerName: csr.Spec.SignerName, Username: csr.Spec.Username}
	if node != nil {
		spec.Extra = map[string]certificatesv1.ExtraValue{NodeNameExtra: node}
	}
	var conds []certificatesv1.CertificateSigningRequestCondition
	for _, cond := range csr.Status.Conditions {
		conds = append(conds, certificatesv1.CertificateSigningRequestCondition{Type: cond.Type, Status: cond.Status})
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name: csr.Name, UID: csr.UID, ResourceVersion: csr.ResourceVersion, CreationTimestamp: csr.CreationTimestamp,
		},
		Spec:   spec,
		Status: certificatesv1.CertificateSigningRequestStatus{Conditions: conds},
	}, nil
}

// decided reports whether csr was approved, denied or failed already.
func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return true
		}
	}
	return false
}
