package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// cachedReads reads one Service by name and lists Services by a label
// selector in a loop until ctx ends, alternating resourceVersion="0" and
// resourceVersion=N (N from an earlier answer). Each read is bounded by 3
// seconds and not retried, so every failure shows. It prints READY, a FAIL
// line per failure and, at the end, RESULT with the counts.
func cachedReads(ctx context.Context, cfg *rest.Config, ns, name string, interval time.Duration) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 3 * time.Second
	cfg.QPS, cfg.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	svcs := client.CoreV1().Services(ns)
	first, err := svcs.Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("first read: %w", err)
	}
	lastRV := first.ResourceVersion
	selector := "app=" + first.Labels["app"]
	fmt.Println("READY")
	counts := map[string]int{}
	fails := map[string]int{}
	for i := 0; ctx.Err() == nil; i++ {
		rv := "0"
		if i%4 >= 2 {
			rv = lastRV
		}
		kind := "rv0"
		if rv != "0" {
			kind = "rvN"
		}
		start := time.Now()
		var gotRV string
		if i%2 == 0 {
			var s *corev1.Service
			s, err = svcs.Get(ctx, name, metav1.GetOptions{ResourceVersion: rv})
			if err == nil {
				gotRV = s.ResourceVersion
			}
		} else {
			var l *corev1.ServiceList
			l, err = svcs.List(ctx, metav1.ListOptions{ResourceVersion: rv, LabelSelector: selector})
			if err == nil {
				gotRV = l.ResourceVersion
				if len(l.Items) != 1 {
					err = fmt.Errorf("list returned %d items, want 1", len(l.Items))
				}
			}
		}
		switch {
		case err != nil && ctx.Err() != nil:
			// Stopped mid-request.
		case err != nil:
			counts[kind]++
			fails[kind]++
			fmt.Printf("FAIL kind=%s at=%s after=%s err=%v\n", kind, start.Format(time.RFC3339Nano), time.Since(start).Round(time.Millisecond), err)
		default:
			counts[kind]++
			if gotRV != "" {
				lastRV = gotRV
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
	fmt.Printf("RESULT rv0=%d rv0Failed=%d rvN=%d rvNFailed=%d\n", counts["rv0"], fails["rv0"], counts["rvN"], fails["rvN"])
	return nil
}

// countingInformer runs an informer on resource ("services" or
// "configmaps") in ns whose list and watch calls are printed: LIST for a
// list, WATCH initial=true for a watch-list (client-go's default way to
// fill an informer, so also a relist) and WATCH initial=false rv=N for a
// watch resumed from where the last one ended; WATCHFAILED, EVENTERROR and
// WATCHERR for a watch call that failed, an ERROR event, and an error that
// ended a list and watch cycle. It prints SYNCED once synced and ADDED
// <name> for every object added after that.
func countingInformer(ctx context.Context, client kubernetes.Interface, ns, resource string) error {
	var obj runtime.Object
	var list func(context.Context, metav1.ListOptions) (runtime.Object, error)
	var watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)
	switch resource {
	case "services":
		obj = &corev1.Service{}
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Services(ns).List(ctx, o)
		}
		watchFn = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().Services(ns).Watch(ctx, o)
		}
	case "configmaps":
		obj = &corev1.ConfigMap{}
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().ConfigMaps(ns).List(ctx, o)
		}
		watchFn = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().ConfigMaps(ns).Watch(ctx, o)
		}
	default:
		return fmt.Errorf("unknown resource %q", resource)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			fmt.Printf("LIST rv=%q\n", o.ResourceVersion)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			initial := o.SendInitialEvents != nil && *o.SendInitialEvents
			fmt.Printf("WATCH initial=%v rv=%q\n", initial, o.ResourceVersion)
			w, err := watchFn(ctx, o)
			if err != nil {
				fmt.Printf("WATCHFAILED %v\n", err)
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if e.Type == watch.Error {
					fmt.Printf("EVENTERROR %v\n", apierrors.FromObject(e.Object))
				}
				return e, true
			}), nil
		},
	}
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		fmt.Printf("WATCHERR %v\n", err)
	}); err != nil {
		return err
	}
	synced := make(chan struct{})
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			select {
			case <-synced:
				m, _ := meta(o)
				fmt.Println("ADDED", m)
			default:
			}
		},
	})
	if err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("informer did not sync")
	}
	close(synced)
	fmt.Println("SYNCED", len(inf.GetStore().List()))
	<-ctx.Done()
	return nil
}

func meta(o any) (string, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return "", fmt.Errorf("%T has no metadata", o)
	}
	return m.GetName(), nil
}
