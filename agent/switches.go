package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
)

// stepAside is an error that makes the agent leave the Service to
// kube-proxy on purpose (an operator's kill switch, a configuration that
// does not match the cluster), as opposed to an unhealthy agent.
type stepAside struct{ reason string }

func (s stepAside) Error() string { return s.reason }

// notInterceptingBecause words a health error as the reason the agent does
// not intercept.
func notInterceptingBecause(err error) error {
	if _, ok := errors.AsType[stepAside](err); ok {
		return err
	}
	return fmt.Errorf("unhealthy: %w", err)
}

// SetInterception turns interception on or off while the agent runs: the
// kill switch. Off, the agent keeps serving its listener, cache and metrics
// and stays ready, but hands the Service VIP to kube-proxy at once (the
// next liveness tick, well within a second) and does not take it back
// until it is turned on. reason is logged and reported on /intercepting.
func (a *Agent) SetInterception(enabled bool, reason string) {
	var next *string
	if !enabled {
		next = &reason
	}
	prev := a.disabled.Swap(next)
	if (prev == nil) == (next == nil) {
		return
	}
	logger := klog.Background().WithName("kube-apicache")
	if enabled {
		logger.Info("Interception turned on", "reason", reason)
	} else {
		logger.Info("Interception turned off; the kubernetes Service goes to kube-proxy's path", "reason", reason)
	}
	a.requestSync()
}

// InterceptionConfigMapKey is the key of InterceptionConfigMap that holds
// the AgentConfiguration, as in the shipped manifests.
const InterceptionConfigMapKey = "config.yaml"

// watchInterceptionConfigMap follows cfg.InterceptionConfigMap with the
// agent's own client until ctx ends, and sets interception from its
// configuration's interception.enabled on every change. One watch of one
// object per node (the kubelet already holds one for the mounted volume);
// an edit reaches every agent within about a second. A ConfigMap that is
// missing, deleted or does not hold a valid configuration changes nothing,
// so a typo cannot turn interception on or off.
func (a *Agent) watchInterceptionConfigMap(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ns, name, _ := strings.Cut(a.cfg.InterceptionConfigMap, "/")
	var lastErr string
	a.watchObject(ctx, ns, name, "the kill switch's ConfigMap "+a.cfg.InterceptionConfigMap,
		func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().ConfigMaps().Informer()
		},
		func(obj any) {
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok {
				return
			}
			c, err := configv1alpha1.Decode([]byte(cm.Data[InterceptionConfigMapKey]))
			if err != nil {
				if msg := err.Error(); msg != lastErr {
					logger.Error(err, "The kill switch's ConfigMap does not hold a valid configuration; interception stays as it is",
						"configMap", a.cfg.InterceptionConfigMap, "key", InterceptionConfigMapKey)
					lastErr = msg
				}
				return
			}
			lastErr = ""
			enabled := c.Interception.Enabled == nil || *c.Interception.Enabled
			a.SetInterception(enabled, fmt.Sprintf("interception.enabled: %t in ConfigMap %s", enabled, a.cfg.InterceptionConfigMap))
		})
}

// watchObject follows one object, namespace/name, with the agent's own
// client until ctx ends (one watch, by name, served from kube-apiserver's
// watch cache), and calls handle with it when it is added or changes.
// informer picks the object's informer from the factory; what names it in
// the log.
func (a *Agent) watchObject(ctx context.Context, namespace, name, what string,
	informer func(informers.SharedInformerFactory) cache.SharedIndexInformer, handle func(obj any)) {
	client, err := kubernetes.NewForConfig(a.restConfig())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot watch "+what)
		return
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 30*time.Minute,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	_, _ = informer(factory).AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	})
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// switchCollector exports the kill switch and the Service check as gauges,
// read at scrape time.
func (a *Agent) switchCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_interception_disabled",
		Help: "1 while interception is turned off on purpose (the kill switch), else 0.",
	}, func() float64 {
		if a.disabled.Load() != nil {
			return 1
		}
		return 0
	})
}

// serviceMismatchCollector is kube_apicache_service_mismatch.
func (a *Agent) serviceMismatchCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_service_mismatch",
		Help: "1 while the configured Service VIPs or port are not the kubernetes Service's (the agent is then not ready and does not intercept), else 0.",
	}, func() float64 {
		if a.serviceMismatch.Load() != nil {
			return 1
		}
		return 0
	})
}

// switchedOff returns why the agent must stand aside whatever its health:
// the kill switch, or Service VIPs that are not the kubernetes Service's.
func (a *Agent) switchedOff() error {
	if r := a.disabled.Load(); r != nil {
		return stepAside{"interception turned off (" + *r + ")"}
	}
	if p := a.serviceMismatch.Load(); p != nil {
		return stepAside{*p}
	}
	return nil
}

// serviceConfigErr returns the mismatch between the configured Service VIPs
// and port and the kubernetes Service, which keeps the agent not ready: a
// wrong VIP must stop a rollout rather than leave every node "ready" and
// intercepting nothing (or, worse, another Service's address).
func (a *Agent) serviceConfigErr() error {
	if p := a.serviceMismatch.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// watchService follows the default/kubernetes Service with the agent's
// own client until ctx ends, and checks the configured VIPs and port
// against it on every change. One watch of one object per node; it never
// blocks start-up: until the Service has been read (or if it cannot be),
// the configuration is trusted.
func (a *Agent) watchService(ctx context.Context) {
	logger := klog.FromContext(ctx)
	a.watchObject(ctx, kubernetesNamespace, kubernetesService, "the kubernetes Service; the Service VIPs are not verified",
		func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Services().Informer()
		},
		func(obj any) {
			if svc, ok := obj.(*corev1.Service); ok {
				a.checkService(logger, svc)
			}
		})
}

// checkService compares the configuration with svc and records the
// outcome; a change is logged and a sync requested.
func (a *Agent) checkService(logger klog.Logger, svc *corev1.Service) {
	msg := serviceMismatch(a.cfg.ServiceVIPs, a.cfg.ServicePort, svc)
	var next *string
	if msg != "" {
		next = &msg
	}
	prev := a.serviceMismatch.Swap(next)
	switch {
	case prev == nil && next == nil:
		return
	case next == nil:
		logger.Info("The Service VIPs match the kubernetes Service", "vips", a.cfg.ServiceVIPs, "port", a.cfg.ServicePort)
	case prev == nil || *prev != msg:
		logger.Error(nil, "Not intercepting and not ready: the configuration does not match the kubernetes Service", "reason", msg)
	}
	a.requestSync()
}

// serviceMismatch describes how vips and port differ from the kubernetes
// Service, or returns "". Every configured VIP must be one of the
// Service's cluster IPs, and port one of its ports. A Service IP the agent
// was not given (the second family of a dual-stack Service) is not an
// error: that family simply stays with kube-proxy.
func serviceMismatch(vips []netip.Addr, port uint16, svc *corev1.Service) string {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var have []netip.Addr
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			have = append(have, ip.Unmap())
		}
	}
	var problems []string
	for _, v := range vips {
		if !slices.Contains(have, v) {
			problems = append(problems, fmt.Sprintf("--service-vip %s is not a cluster IP of Service %s/%s (%s)",
				v, svc.Namespace, svc.Name, strings.Join(ips, ", ")))
		}
	}
	var ports []string
	found := false
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprint(p.Port))
		found = found || (p.Port == int32(port) && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP))
	}
	if !found {
		problems = append(problems, fmt.Sprintf("--service-port %d is not a port of Service %s/%s (%s)",
			port, svc.Namespace, svc.Name, strings.Join(ports, ", ")))
	}
	return strings.Join(problems, "; ")
}
