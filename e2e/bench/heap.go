package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// heapResult is heap per cached pod, in bytes.
type heapResult struct {
	cachePerPod, informerPerPod float64
	pods                        int
}

// emptyNode has no pods: caches of it measure everything but the pods.
const emptyNode = "bench-empty-node"

// measureHeap builds copies of the agent's pod cache and of a plain typed
// pod informer, in this process, for the agent's node and for a node with
// no pods; the difference, per pod, is what each holds per cached pod.
// Fixed costs (clients, discovery, goroutines) cancel out.
func measureHeap(ctx context.Context, b *bench) (heapResult, error) {
	list, err := b.c.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + sandbox.NodeName})
	if err != nil {
		return heapResult{}, err
	}
	pods := len(list.Items)
	list = nil
	specs, err := cache.ParseResources("pods")
	if err != nil {
		return heapResult{}, err
	}
	buildCache := func(ctx context.Context, node string, want int) error {
		c, err := cache.New(cache.Config{NodeName: node, Resources: specs, RESTConfig: b.c.AdminConfig})
		if err != nil {
			return err
		}
		go c.Run(ctx)
		return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			st := c.Resources()
			return len(st) == 1 && st[0].Synced && st[0].Objects == want, nil
		})
	}
	cs, err := kubernetes.NewForConfig(b.c.AdminConfig)
	if err != nil {
		return heapResult{}, err
	}
	buildInformer := func(ctx context.Context, node string, want int) error {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + node
		}))
		inf := f.Core().V1().Pods().Informer()
		f.Start(ctx.Done())
		context.AfterFunc(ctx, f.Shutdown)
		return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return inf.HasSynced() && len(inf.GetStore().ListKeys()) == want, nil
		})
	}

	var r heapResult
	r.pods = pods
	for _, m := range []struct {
		build func(context.Context, string, int) error
		out   *float64
	}{{buildCache, &r.cachePerPod}, {buildInformer, &r.informerPerPod}} {
		full, err := heapOf(ctx, b.o.copies, sandbox.NodeName, pods, m.build)
		if err != nil {
			return r, err
		}
		empty, err := heapOf(ctx, b.o.copies, emptyNode, 0, m.build)
		if err != nil {
			return r, err
		}
		*m.out = float64(full-empty) / float64(b.o.copies*pods)
	}
	return r, nil
}

// heapOf returns how much live heap n copies built by build hold once
// synced.
func heapOf(ctx context.Context, n int, node string, want int, build func(context.Context, string, int) error) (int64, error) {
	before := liveHeap()
	ctx, cancel := context.WithCancel(ctx)
	for range n {
		if err := build(ctx, node, want); err != nil {
			cancel()
			return 0, fmt.Errorf("syncing a copy for %s: %w", node, err)
		}
	}
	after := liveHeap()
	cancel()
	// Let the copies stop before the next baseline.
	time.Sleep(time.Second)
	return after - before, nil
}

func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
