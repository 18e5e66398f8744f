package upstream

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// kubernetesService is the Service whose EndpointSlices list the
// kube-apiserver endpoints.
const (
	kubernetesNamespace = "default"
	kubernetesService   = "kubernetes"
)

// WatchEndpoints follows the default/kubernetes EndpointSlices with the
// agent's own client (config) until ctx ends, and makes their ready
// endpoints the set's. It starts from the --upstream bootstrap list and never
// blocks start-up: until the first list arrives (or if it cannot be read),
// the bootstrap endpoints stay in use.
func (u *Set) WatchEndpoints(ctx context.Context, config *rest.Config) {
	logger := klog.FromContext(ctx)
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		logger.Error(err, "Cannot watch apiserver endpoints; keeping --upstream")
		return
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithNamespace(kubernetesNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + kubernetesService
		}))
	inf := factory.Discovery().V1().EndpointSlices()
	lister := inf.Lister()
	update := func() {
		slices, err := lister.EndpointSlices(kubernetesNamespace).List(labels.Everything())
		if err != nil {
			return
		}
		urls := endpointURLs(slices)
		if len(urls) == 0 {
			logger.Info("The kubernetes EndpointSlices list no ready endpoint; keeping the current Set")
			return
		}
		u.SetEndpoints(urls)
		logger.V(2).Info("Upstream endpoints from EndpointSlices", "endpoints", hosts(urls))
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	})
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// endpointURLs returns https://IP:port for every ready endpoint of the
// slices' "https" port, sorted and without duplicates.
func endpointURLs(eps []*discoveryv1.EndpointSlice) []*url.URL {
	var hostports []string
	for _, s := range eps {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port int32
		for _, p := range s.Ports {
			if p.Port != nil && (p.Name == nil || *p.Name == "https") {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, addr := range e.Addresses {
				hostports = append(hostports, net.JoinHostPort(addr, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(hostports)
	hostports = slices.Compact(hostports)
	out := make([]*url.URL, 0, len(hostports))
	for _, hp := range hostports {
		out = append(out, &url.URL{Scheme: "https", Host: hp})
	}
	return out
}

func hosts(urls []*url.URL) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = u.Host
	}
	return out
}
