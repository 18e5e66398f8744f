package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// nodeInformers runs the informers a node-local controller typically has:
// this node's pods (typed, and metadata-only), the cluster's services, its
// EndpointSlices if endpointSlices is set and,
// if cr is set (GROUP/VERSION/RESOURCE), a custom resource through the
// dynamic client. Whether they start with a watch-list or a list and a
// watch is client-go's WatchListClient feature gate (KUBE_FEATURE_WatchListClient).
//
// It prints "WATCHLIST <gate>" and "SYNCED" once every informer has
// synced, then, for every "dump" line on stdin, one "OBJ <informer>
// <namespace>/<name> <resourceVersion>" line per object, sorted, and "END".
func nodeInformers(ctx context.Context, cfg *rest.Config, cr string, protobuf, endpointSlices bool) error {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 100, 200
	if protobuf {
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	node := os.Getenv("NODE_NAME")
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	onNode := func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + node }
	stores := map[string]cache.Store{}
	var synced []cache.InformerSynced

	pods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(onNode))
	stores["pods"] = pods.Core().V1().Pods().Informer().GetStore()
	synced = append(synced, pods.Core().V1().Pods().Informer().HasSynced)
	all := informers.NewSharedInformerFactory(client, 0)
	stores["services"] = all.Core().V1().Services().Informer().GetStore()
	synced = append(synced, all.Core().V1().Services().Informer().HasSynced)
	if endpointSlices {
		stores["endpointslices"] = all.Discovery().V1().EndpointSlices().Informer().GetStore()
		synced = append(synced, all.Discovery().V1().EndpointSlices().Informer().HasSynced)
	}

	mc, err := metadata.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return err
	}
	meta := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, metav1.NamespaceAll, onNode)
	podsMeta := meta.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	stores["pods-metadata"] = podsMeta.GetStore()
	synced = append(synced, podsMeta.HasSynced)

	var dyn dynamicinformer.DynamicSharedInformerFactory
	if cr != "" {
		parts := strings.Split(cr, "/")
		if len(parts) != 3 {
			return fmt.Errorf("--cr %q is not GROUP/VERSION/RESOURCE", cr)
		}
		jsonCfg := rest.CopyConfig(cfg)
		jsonCfg.ContentType, jsonCfg.AcceptContentTypes = "", ""
		dc, err := dynamic.NewForConfig(jsonCfg)
		if err != nil {
			return err
		}
		dyn = dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
		inf := dyn.ForResource(schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}).Informer()
		stores[parts[2]] = inf.GetStore()
		synced = append(synced, inf.HasSynced)
	}

	pods.Start(ctx.Done())
	all.Start(ctx.Done())
	meta.Start(ctx.Done())
	if dyn != nil {
		dyn.Start(ctx.Done())
	}
	fmt.Println("WATCHLIST", clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient))
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync")
	}
	fmt.Println("SYNCED")

	var mu sync.Mutex // one dump at a time
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() && ctx.Err() == nil {
		if strings.TrimSpace(lines.Text()) != "dump" {
			continue
		}
		mu.Lock()
		var out []string
		for name, st := range stores {
			for _, obj := range st.List() {
				m, err := apimeta(obj)
				if err != nil {
					return err
				}
				out = append(out, fmt.Sprintf("OBJ %s %s/%s %s", name, m.GetNamespace(), m.GetName(), m.GetResourceVersion()))
			}
		}
		sort.Strings(out)
		w := bufio.NewWriter(os.Stdout)
		for _, l := range out {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintln(w, "END")
		_ = w.Flush()
		mu.Unlock()
	}
	pods.Shutdown()
	all.Shutdown()
	meta.Shutdown()
	if dyn != nil {
		dyn.Shutdown()
	}
	return nil
}

func apimeta(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("unexpected object %T", obj)
	}
	return m, nil
}
