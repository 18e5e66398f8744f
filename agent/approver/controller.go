package approver

import (
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Controller applies a Policy to pending CertificateSigningRequests: it
// watches every CSR, ignores those the policy does not own and those already
// decided, and records Approved or Denied (with the reason) on the others.
type Controller struct {
	policy  *Policy
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  certlisters.CertificateSigningRequestLister
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
}

// NewController returns a controller that decides with policy and writes
// through client.
func NewController(client kubernetes.Interface, policy *Policy) *Controller {
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Certificates().V1().CertificateSigningRequests()
	c := &Controller{
		policy:  policy,
		client:  client,
		factory: factory,
		lister:  inf.Lister(),
		synced:  inf.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csr-approver"}),
	}
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	return c
}

// Run decides CSRs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		return fmt.Errorf("waiting for the CertificateSigningRequest informer: %w", context.Cause(ctx))
	}
	logger.Info("Approving kube-apicache serving certificates", "agent", c.policy.AgentUser,
		"dnsNames", c.policy.SANs.DNSNames, "ips", c.policy.SANs.IPs)
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

// sync decides one CSR, if it is pending and the policy owns it.
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
	d := c.policy.Decide(csr)
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
		return fmt.Errorf("recording %s: %w", cond.Type, err)
	}
	if d.Approve {
		logger.Info("Approved serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "message", d.Message)
	} else {
		logger.Info("Denied certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", d.Reason, "message", d.Message)
	}
	return nil
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
