package main

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// createWorkers is how many objects are created concurrently.
const createWorkers = 32

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// fastAdmin is the admin client with a rate limit fit for bulk creation.
func (b *bench) fastAdmin() (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(b.c.AdminConfig)
	cfg.QPS, cfg.Burst = 2000, 4000
	return kubernetes.NewForConfig(cfg)
}

// createPods creates onNode pods on the agent's node and others spread
// over the other nodes (which need no Node object: no controller of the
// sandbox acts on pods of missing nodes).
func (b *bench) createPods(ctx context.Context, onNode, others int) error {
	cs, err := b.fastAdmin()
	if err != nil {
		return err
	}
	b.firstNodePod = "bench-local-0000"
	var pods []*corev1.Pod
	for i := range onNode {
		pods = append(pods, benchPod(fmt.Sprintf("bench-local-%04d", i), sandboxNode()))
	}
	for i := range others {
		pods = append(pods, benchPod(fmt.Sprintf("bench-pod-%04d", i), fmt.Sprintf("bench-node-%02d", i%b.o.otherNode)))
	}
	return parallel(ctx, len(pods), func(ctx context.Context, i int) error {
		_, err := cs.CoreV1().Pods(benchNS).Create(ctx, pods[i], metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// createServices creates n ClusterIP services.
func (b *bench) createServices(ctx context.Context, n int) error {
	cs, err := b.fastAdmin()
	if err != nil {
		return err
	}
	return parallel(ctx, n, func(ctx context.Context, i int) error {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-svc-%04d", i), Labels: map[string]string{"app": "bench"}},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "bench"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80}},
			},
		}
		_, err := cs.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// parallel runs fn for 0..n-1 on createWorkers goroutines and returns the
// first error.
func parallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range createWorkers {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
