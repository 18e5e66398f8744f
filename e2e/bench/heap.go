package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/cache/access"
	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// heapResult is heap per cached pod, in bytes: the agent's cache once
// synced (cold), and once it has answered a list of every pod in JSON and
// in protobuf (warm: it then holds both encodings of each pod); a typed
// informer.
type heapResult struct {
	coldPerPod, warmPerPod, informerPerPod float64
	pods                                   int
}

// heapRounds is how many times each heap variant is measured.
const heapRounds = 3

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
	buildCache := func(warm bool) func(ctx context.Context, node string, want int) error {
		return func(ctx context.Context, node string, want int) error {
			c, err := cache.New(cache.Config{NodeName: node, Resources: specs, RESTConfig: b.c.AdminConfig, Reviewer: allowAll{}})
			if err != nil {
				return err
			}
			go c.Run(ctx)
			err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				st := c.Resources()
				return len(st) == 1 && st[0].Synced && st[0].Objects == want, nil
			})
			if err != nil || !warm {
				return err
			}
			return warmCache(c, node, want)
		}
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

	// Each round measures every variant once, full then empty; the median
	// over the rounds is reported, so that connections and buffers the
	// client opens or frees between measurements do not decide the result.
	var r heapResult
	r.pods = pods
	variants := []struct {
		build func(context.Context, string, int) error
		out   *float64
		runs  []float64
	}{{build: buildCache(false), out: &r.coldPerPod}, {build: buildCache(true), out: &r.warmPerPod}, {build: buildInformer, out: &r.informerPerPod}}
	for range heapRounds {
		for i := range variants {
			m := &variants[i]
			full, err := heapOf(ctx, b.o.copies, sandbox.NodeName, pods, m.build)
			if err != nil {
				return r, err
			}
			empty, err := heapOf(ctx, b.o.copies, emptyNode, 0, m.build)
			if err != nil {
				return r, err
			}
			m.runs = append(m.runs, float64(full-empty)/float64(b.o.copies*pods))
		}
	}
	for _, m := range variants {
		slices.Sort(m.runs)
		*m.out = m.runs[len(m.runs)/2]
	}
	return r, nil
}

// allowAll lets every caller read the in-process caches.
type allowAll struct{}

func (allowAll) Review(*http.Request, *request.RequestInfo) access.Result {
	return access.Result{Verdict: access.Allowed}
}

// warmCache has c answer a list of node's pods in JSON and in protobuf,
// through its request handler, so that it holds both encodings of each.
func warmCache(c *cache.Cache, node string, want int) error {
	resolver := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	h := c.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "forwarded", http.StatusBadGateway)
	}), func(h http.Handler) http.Handler { return h })
	for _, accept := range []string{kruntime.ContentTypeJSON, kruntime.ContentTypeProtobuf} {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/pods?resourceVersion=0&fieldSelector="+url.QueryEscape("spec.nodeName="+node), nil)
		r.Header.Set("Accept", accept)
		r.Header.Set("Authorization", "Bearer bench")
		info, err := resolver.NewRequestInfo(r)
		if err != nil {
			return err
		}
		r = r.WithContext(request.WithRequestInfo(r.Context(), info))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != accept {
			return fmt.Errorf("warming the cache with a %s list: %d %s", accept, w.Code, w.Body.String())
		}
	}
	return nil
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
