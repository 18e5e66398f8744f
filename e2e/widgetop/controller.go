package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// controller is the Widget operator: it copies spec.size to
// status.observedSize and, once a widget is being deleted, removes the
// finalizer example.com/cleanup. It prints
//
//	CONTROLLER status <name> observedSize=<n>
//	CONTROLLER finalized <name>
//	CONTROLLER error <namespace>/<name>: <error>
type controller struct {
	widgets  dynamic.ResourceInterface
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

// startController starts an informer on the widgets of ns (no resync)
// and one worker, and waits until the informer has synced.
func startController(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns string) (*controller, error) {
	ctx, cancel := context.WithCancel(ctx)
	c := &controller{
		widgets: dyn.Resource(gvr).Namespace(ns),
		factory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		cancel:  cancel,
	}
	c.informer = c.factory.ForResource(gvr).Informer()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if _, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		c.stop()
		return nil, fmt.Errorf("adding the event handler: %w", err)
	}
	c.factory.Start(ctx.Done())
	c.done.Go(func() { c.work(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		c.stop()
		return nil, fmt.Errorf("the widget informer did not sync: %w", context.Cause(ctx))
	}
	return c, nil
}

// stop ends the informer and the worker and waits for both.
func (c *controller) stop() {
	c.cancel()
	c.factory.Shutdown()
	c.queue.ShutDown()
	c.done.Wait()
}

// work reconciles queued widgets until the queue shuts down.
func (c *controller) work(ctx context.Context) {
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		err := c.reconcile(ctx, key)
		switch {
		case err == nil || ctx.Err() != nil:
			c.queue.Forget(key)
		case apierrors.IsConflict(err):
			// A newer version is on its way to the cache; try again.
			c.queue.AddRateLimited(key)
		default:
			sayf("CONTROLLER error %s: %v", key, err)
			c.queue.AddRateLimited(key)
		}
		c.queue.Done(key)
	}
}

// reconcile brings the widget of key, as the cache has it, to its wanted
// state.
func (c *controller) reconcile(ctx context.Context, key string) error {
	obj, exists, err := c.informer.GetIndexer().GetByKey(key)
	if err != nil {
		return fmt.Errorf("reading widget %s from the cache: %w", key, err)
	}
	if !exists {
		return nil
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("widget %s is a %T in the cache", key, obj)
	}
	if u.GetDeletionTimestamp() != nil {
		return c.finalize(ctx, u)
	}
	return c.syncStatus(ctx, u)
}

// finalize removes the finalizer example.com/cleanup from a widget being
// deleted, with a JSON merge patch of the remaining finalizers.
func (c *controller) finalize(ctx context.Context, u *unstructured.Unstructured) error {
	if !slices.Contains(u.GetFinalizers(), finalizer) {
		return nil
	}
	remaining := slices.DeleteFunc(slices.Clone(u.GetFinalizers()), func(f string) bool { return f == finalizer })
	if remaining == nil {
		remaining = []string{}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": remaining}})
	if err != nil {
		return fmt.Errorf("encoding the finalizer patch: %w", err)
	}
	_, err = c.widgets.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: controllerManager})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("removing finalizer %s from widget %s: %w", finalizer, u.GetName(), err)
	}
	sayf("CONTROLLER finalized %s", u.GetName())
	return nil
}

// syncStatus sets status.observedSize to spec.size when they differ.
func (c *controller) syncStatus(ctx context.Context, u *unstructured.Unstructured) error {
	size, found, err := unstructured.NestedInt64(u.Object, "spec", "size")
	if err != nil {
		return fmt.Errorf("reading spec.size of widget %s: %w", u.GetName(), err)
	}
	if !found {
		return nil
	}
	if observed, ok, _ := unstructured.NestedInt64(u.Object, "status", "observedSize"); ok && observed == size {
		return nil
	}
	w := u.DeepCopy()
	if err := unstructured.SetNestedField(w.Object, size, "status", "observedSize"); err != nil {
		return fmt.Errorf("setting status.observedSize of widget %s: %w", u.GetName(), err)
	}
	_, err = c.widgets.UpdateStatus(ctx, w, metav1.UpdateOptions{FieldManager: controllerManager})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		return err
	case err != nil:
		return fmt.Errorf("updating the status of widget %s: %w", u.GetName(), err)
	}
	sayf("CONTROLLER status %s observedSize=%d", u.GetName(), size)
	return nil
}
