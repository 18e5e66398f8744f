package interception

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

// StepAside returns an error that, returned by Deps.Health, makes the
// agent leave the Service to kube-proxy on purpose: not a failure to
// alert on.
func StepAside(reason string) error { return stepAside{reason} }

// IsStepAside reports whether err leaves the Service to kube-proxy on
// purpose (StepAside).
func IsStepAside(err error) bool {
	_, ok := errors.AsType[stepAside](err)
	return ok
}

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
func (ic *Interceptor) SetInterception(enabled bool, reason string) {
	var next *string
	if !enabled {
		next = &reason
	}
	prev := ic.disabled.Swap(next)
	if (prev == nil) == (next == nil) {
		return
	}
	logger := klog.Background().WithName("kube-apicache")
	if enabled {
		logger.Info("Interception turned on", "reason", reason)
	} else {
		logger.Info("Interception turned off; the kubernetes Service goes to kube-proxy's path", "reason", reason)
	}
	ic.RequestSync()
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
func (ic *Interceptor) watchInterceptionConfigMap(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ns, name, _ := strings.Cut(ic.cfg.InterceptionConfigMap, "/")
	var lastErr string
	ic.watchObject(ctx, ns, name, "the kill switch's ConfigMap "+ic.cfg.InterceptionConfigMap,
		func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().ConfigMaps().Informer()
		},
		objectHandlers{changed: func(obj any) {
			cm, ok := obj.(*corev1.ConfigMap)
			if !ok {
				return
			}
			c, err := configv1alpha1.MergeData(cm.Data, InterceptionConfigMapKey)
			if err != nil {
				if msg := err.Error(); msg != lastErr {
					logger.Error(err, "The kill switch's ConfigMap does not hold a valid configuration; interception stays as it is",
						"configMap", ic.cfg.InterceptionConfigMap, "key", InterceptionConfigMapKey)
					lastErr = msg
				}
				return
			}
			lastErr = ""
			enabled := c.Interception.Enabled == nil || *c.Interception.Enabled
			ic.SetInterception(enabled, fmt.Sprintf("interception.enabled: %t in ConfigMap %s", enabled, ic.cfg.InterceptionConfigMap))
		}})
}

// objectHandlers are what watchObject tells of the object it follows.
type objectHandlers struct {
	// changed gets the object when it is added or changes.
	changed func(obj any)
	// failed, if set, gets every error of the list or watch, which the
	// informer retries with backoff (and logs, as it always does).
	failed func(err error)
	// synced, if set, is called once the first list has been handled
	// (changed has had the object, if there is one), with whether the
	// object exists.
	synced func(found bool)
}

// watchObject follows one object, namespace/name, with the agent's own
// client until ctx ends (one watch, by name, served from kube-apiserver's
// watch cache), and tells h of it. informer picks the object's informer
// from the factory; what names it in the log.
func (ic *Interceptor) watchObject(ctx context.Context, namespace, name, what string,
	informer func(informers.SharedInformerFactory) cache.SharedIndexInformer, h objectHandlers) {
	logger := klog.FromContext(ctx)
	client, err := kubernetes.NewForConfig(ic.deps.RESTConfig())
	if err != nil {
		logger.Error(err, "Cannot watch "+what)
		if h.failed != nil {
			h.failed(err)
		}
		return
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 30*time.Minute,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := informer(factory)
	if h.failed != nil {
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			h.failed(err)
		}); err != nil {
			logger.Error(err, "Cannot follow the errors of the watch of "+what)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.changed,
		UpdateFunc: func(_, obj any) { h.changed(obj) },
	})
	if err != nil {
		logger.Error(err, "Cannot watch "+what)
		if h.failed != nil {
			h.failed(err)
		}
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if h.synced != nil && cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		h.synced(len(inf.GetStore().List()) > 0)
	}
	<-ctx.Done()
}

// switchCollector exports the kill switch and the Service check as gauges,
// read at scrape time.
func (ic *Interceptor) switchCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_interception_disabled",
		Help: "1 while interception is turned off on purpose (the kill switch), else 0.",
	}, func() float64 {
		if ic.disabled.Load() != nil {
			return 1
		}
		return 0
	})
}

// serviceMismatchCollector is kube_apicache_service_mismatch.
func (ic *Interceptor) serviceMismatchCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kube_apicache_service_mismatch",
		Help: "1 while the configured Service VIPs or port are not the kubernetes Service's (the agent is then not ready and does not intercept), else 0.",
	}, func() float64 {
		if s := ic.service.Load(); s != nil && s.mismatch != "" {
			return 1
		}
		return 0
	})
}

// switchedOff returns why the agent must stand aside whatever its health:
// the kill switch, or Service VIPs that are not known to be the kubernetes
// Service's.
func (ic *Interceptor) switchedOff() error {
	if r := ic.disabled.Load(); r != nil {
		return stepAside{"interception turned off (" + *r + ")"}
	}
	if err := ic.serviceErr(); err != nil {
		return stepAside{err.Error()}
	}
	return nil
}

// serviceCheck is what the agent knows of the kubernetes Service, against
// which it checks the configured Service VIPs and port. The zero value (and
// a nil *serviceCheck) is "not read yet".
type serviceCheck struct {
	// read is set once the Service has been read; mismatch is then how the
	// configuration differs from it, "" while it matches.
	read     bool
	mismatch string
	// unread is, until the first read, why there has been none (a list or
	// watch that failed, no such Service); "" while it is under way.
	unread string
}

// serviceErr returns nil once the kubernetes Service has been read and the
// configured VIPs and port are among its own, else why not. Either way
// the agent does not intercept (a wrong VIP might be another Service's
// address) and is not ready: a wrong or unverifiable configuration must
// Stop a rollout rather than leave every node "ready" and intercepting
// nothing. Once read, the Service is checked against its last known state
// (the informer's): a watch that fails later changes nothing.
func (ic *Interceptor) serviceErr() error {
	s := ic.service.Load()
	switch {
	case s != nil && s.read && s.mismatch == "":
		return nil
	case s != nil && s.read:
		return errors.New(s.mismatch)
	}
	what := fmt.Sprintf("the Service VIPs %s and port %d are not verified against Service %s/%s",
		joinAddrs(ic.cfg.ServiceVIPs), ic.cfg.ServicePort, kubernetesNamespace, kubernetesService)
	if s != nil && s.unread != "" {
		return fmt.Errorf("%s: %s", what, s.unread)
	}
	return fmt.Errorf("%s yet: waiting for its first read", what)
}

// joinAddrs lists addrs for messages.
func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// watchService follows the default/kubernetes Service with the agent's
// own client until ctx ends, and checks the configured VIPs and port
// against it on every change. One watch of one object per node. It does
// not block start-up, but until the Service has been read and matches,
// the agent does not intercept; while it cannot be read (RBAC, an
// apiserver that fails the list), the reason is reported and the informer
// retries with backoff.
func (ic *Interceptor) watchService(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ic.watchObject(ctx, kubernetesNamespace, kubernetesService, "the kubernetes Service; the Service VIPs are not verified",
		func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Services().Informer()
		},
		objectHandlers{
			changed: func(obj any) {
				if svc, ok := obj.(*corev1.Service); ok {
					ic.checkService(logger, svc)
				}
			},
			failed: func(err error) {
				ic.serviceNotRead(logger, "cannot read it (retrying): "+err.Error())
			},
			synced: func(found bool) {
				if !found {
					ic.serviceNotRead(logger, "it does not exist (watching for it)")
				}
			},
		})
}

// checkService compares the configuration with svc and records the
// outcome; a change is logged and a sync requested.
func (ic *Interceptor) checkService(logger klog.Logger, svc *corev1.Service) {
	msg := serviceMismatch(ic.cfg.ServiceVIPs, ic.cfg.ServicePort, svc)
	prev := ic.service.Swap(&serviceCheck{read: true, mismatch: msg})
	switch {
	case prev != nil && prev.read && prev.mismatch == msg:
		return
	case msg == "":
		logger.Info("The Service VIPs match the kubernetes Service", "vips", ic.cfg.ServiceVIPs, "port", ic.cfg.ServicePort)
	default:
		logger.Error(nil, "Not intercepting and not ready: the configuration does not match the kubernetes Service", "reason", msg)
	}
	ic.RequestSync()
}

// serviceNotRead records why the kubernetes Service could not be read, as
// long as it never has been; a change is logged and a sync requested.
func (ic *Interceptor) serviceNotRead(logger klog.Logger, why string) {
	for {
		prev := ic.service.Load()
		if prev != nil && (prev.read || prev.unread == why) {
			return
		}
		if ic.service.CompareAndSwap(prev, &serviceCheck{unread: why}) {
			break
		}
	}
	logger.Error(nil, "Not intercepting and not ready: the configured Service VIPs cannot be checked against the kubernetes Service",
		"service", kubernetesNamespace+"/"+kubernetesService, "reason", why)
	ic.RequestSync()
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
