// Command podclient is an ordinary in-cluster client-go program, run inside
// sandbox pods to exercise the API the way workloads do: it uses
// rest.InClusterConfig and nothing else.
//
//	podclient crud      create, get, list, update and delete a ConfigMap
//	podclient informer  run a ConfigMap informer; print SYNCED, then events
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podclient crud|informer [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	name := fs.String("name", "podclient", "ConfigMap name for crud")
	timeout := fs.Duration("timeout", 5*time.Minute, "exit after this long")
	_ = fs.Parse(os.Args[2:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()

	cfg, err := rest.InClusterConfig()
	if err != nil {
		fail(err)
	}
	cfg.UserAgent = "podclient"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "crud":
		err = crud(ctx, client, string(ns), *name)
	case "informer":
		err = informer(ctx, client, string(ns))
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "podclient: %v\n", err)
	os.Exit(1)
}

func crud(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	cms := client.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v1"}}
	cm, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	fmt.Println("created", cm.Name, cm.ResourceVersion)
	got, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	fmt.Println("listed", len(list.Items))
	got.Data["k"] = "v2"
	if got, err = cms.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	fmt.Println("updated", got.Name, got.Data["k"])
	if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	fmt.Println("deleted", name)
	return nil
}

func informer(ctx context.Context, client kubernetes.Interface, ns string) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().ConfigMaps().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { fmt.Println("ADDED", obj.(*corev1.ConfigMap).Name) },
		UpdateFunc: func(_, obj any) {
			fmt.Println("UPDATED", obj.(*corev1.ConfigMap).Name)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			fmt.Println("DELETED", obj.(*corev1.ConfigMap).Name)
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("informer did not sync")
	}
	fmt.Println("SYNCED", len(inf.GetStore().List()))
	<-ctx.Done()
	f.Shutdown()
	return nil
}
