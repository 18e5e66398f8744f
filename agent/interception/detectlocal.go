package interception

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// How the agent tells this node's own pod traffic from VIP traffic routed
// in from elsewhere (a BGP-advertised Service CIDR, a gateway), which it
// must leave to kube-proxy. Host-network traffic (nat OUTPUT) is always
// local; the mode restricts the PREROUTING jump only. The names follow
// kube-proxy's --detect-local-mode, plus PodIPs and None.
const (
	// DetectLocalPodIPs matches the IPs of the pods the API places on this
	// node, kept in an ipset from a watch of those pods: it works with
	// every CNI and IPAM. A new pod's traffic goes to kube-proxy's path
	// until its IP reaches the set (about a second after the kubelet
	// reports it), which costs nothing but the cache.
	DetectLocalPodIPs = "PodIPs"
	// DetectLocalClusterCIDR matches --cluster-cidr sources.
	DetectLocalClusterCIDR = "ClusterCIDR"
	// DetectLocalNodeCIDR matches the Node's spec.podCIDRs, for IPAMs that
	// allocate them (the kube-controller-manager's, host-local).
	DetectLocalNodeCIDR = "NodeCIDR"
	// DetectLocalBridgeInterface matches packets from
	// --pod-bridge-interface.
	DetectLocalBridgeInterface = "BridgeInterface"
	// DetectLocalInterfaceNamePrefix matches packets from interfaces named
	// --pod-interface-name-prefix*.
	DetectLocalInterfaceNamePrefix = "InterfaceNamePrefix"
	// DetectLocalNone intercepts VIP traffic from any source.
	DetectLocalNone = "None"
)

// DetectLocalModes lists the --detect-local-mode values.
var DetectLocalModes = []string{DetectLocalPodIPs, DetectLocalClusterCIDR, DetectLocalNodeCIDR,
	DetectLocalBridgeInterface, DetectLocalInterfaceNamePrefix, DetectLocalNone}

// ValidateDetectLocal checks the detect-local settings.
func (c *Config) ValidateDetectLocal() error {
	switch c.DetectLocalMode {
	case DetectLocalPodIPs, DetectLocalNodeCIDR, DetectLocalNone:
	case DetectLocalClusterCIDR:
		if len(c.ClusterCIDRs) == 0 {
			return errors.New("--detect-local-mode=ClusterCIDR needs --cluster-cidr")
		}
		seen := map[netrules.Family]bool{}
		for _, p := range c.ClusterCIDRs {
			f := netrules.FamilyOf(p.Addr())
			if seen[f] {
				return errors.New("--cluster-cidr takes at most one CIDR per IP family")
			}
			seen[f] = true
		}
	case DetectLocalBridgeInterface:
		if !validInterface(c.PodBridgeInterface) {
			return errors.New("--detect-local-mode=BridgeInterface needs --pod-bridge-interface, a link name of 1-15 characters")
		}
	case DetectLocalInterfaceNamePrefix:
		if !validInterface(c.PodInterfaceNamePrefix) || len(c.PodInterfaceNamePrefix) > 14 {
			return errors.New("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix, 1-14 characters")
		}
	default:
		return fmt.Errorf("--detect-local-mode %q must be one of %s", c.DetectLocalMode, strings.Join(DetectLocalModes, ", "))
	}
	return nil
}

func validInterface(s string) bool {
	return s != "" && len(s) <= 15 && !strings.ContainsAny(s, "/ \t\"'+!")
}

// setNameWithSuffix derives one of the agent's sets from --liveness-set,
// within ipset's 31 characters (with the IPv6 "6" suffix).
func setNameWithSuffix(c *Config, suffix string, f netrules.Family) string {
	base := c.LivenessSet
	if len(base)+len(suffix) > 30 {
		base = base[:30-len(suffix)]
	}
	name := base + suffix
	if f == netrules.IPv6 {
		name += "6"
	}
	return name
}

// localPodsSetName is the set of this node's pod IPs of family f.
func localPodsSetName(c *Config, f netrules.Family) string {
	return setNameWithSuffix(c, "-PODS", f)
}

// localMatch is what the prerouting entry of the redirect matches so that
// only this node's own pod traffic takes it; the zero value matches every
// source (None). Each dataplane renders it in its own terms.
type localMatch struct {
	// pods: the source is in the pods set (PodIPs).
	pods bool
	// cidr: the source is in this prefix (ClusterCIDR, NodeCIDR).
	cidr netip.Prefix
	// iface: the packet came in on this interface, or on any whose name
	// starts with it when prefix is set.
	iface  string
	prefix bool
}

// iptables renders m as iptables match arguments; podsSet names the pods
// ipset.
func (m localMatch) iptables(podsSet string) []string {
	switch {
	case m.pods:
		return []string{"-m", "set", "--match-set", podsSet, "src"}
	case m.cidr.IsValid():
		return []string{"-s", m.cidr.String()}
	case m.iface != "" && m.prefix:
		return []string{"-i", m.iface + "+"}
	case m.iface != "":
		return []string{"-i", m.iface}
	}
	return nil
}

// nft renders m as the match fields of an nftables rule; podsSet names
// the pods set in the agent's table.
func (m localMatch) nft(podsSet string) netrules.NFTRule {
	switch {
	case m.pods:
		return netrules.NFTRule{SrcSet: podsSet}
	case m.cidr.IsValid():
		return netrules.NFTRule{SrcPrefix: m.cidr}
	case m.iface != "" && m.prefix:
		return netrules.NFTRule{InIface: m.iface + "*"}
	case m.iface != "":
		return netrules.NFTRule{InIface: m.iface}
	}
	return netrules.NFTRule{}
}

// localMatch returns the match the prerouting entry carries for family f
// so that only this node's own pod traffic takes it, or an error saying
// why it cannot be built yet (a Node without podCIDRs in NodeCIDR mode).
func (ic *Interceptor) localMatch(f netrules.Family) (localMatch, error) {
	c := ic.cfg
	switch c.DetectLocalMode {
	case DetectLocalPodIPs:
		return localMatch{pods: true}, nil
	case DetectLocalClusterCIDR:
		for _, p := range c.ClusterCIDRs {
			if netrules.FamilyOf(p.Addr()) == f {
				return localMatch{cidr: p.Masked()}, nil
			}
		}
		return localMatch{}, fmt.Errorf("detect-local: no %s --cluster-cidr", familyName(f))
	case DetectLocalNodeCIDR:
		cidrs, err := ic.local.nodeCIDRs()
		if err != nil {
			return localMatch{}, err
		}
		for _, p := range cidrs {
			if netrules.FamilyOf(p.Addr()) == f {
				return localMatch{cidr: p.Masked()}, nil
			}
		}
		return localMatch{}, fmt.Errorf("detect-local: Node %s has no %s spec.podCIDRs (choose another --detect-local-mode for this IPAM)", c.NodeName, familyName(f))
	case DetectLocalBridgeInterface:
		return localMatch{iface: c.PodBridgeInterface}, nil
	case DetectLocalInterfaceNamePrefix:
		return localMatch{iface: c.PodInterfaceNamePrefix, prefix: true}, nil
	}
	return localMatch{}, nil
}

// ExcludePodLabel, set to "true" on a pod, sends that pod's traffic to the
// Service VIP to kube-proxy's path instead of the agent: in PodIPs
// detect-local mode its IPs never enter the pods set, from the pod's
// start on. In the other modes the redirect matches sources by CIDR or
// interface, which cannot leave one pod out, so the label is not honoured
// there (the pod is only left out of the pod-path check). Host-network
// pods share the node's address and cannot opt out one by one.
const ExcludePodLabel = "kube-apicache.io/exclude"

// excludedPod reports whether pod opted out with ExcludePodLabel.
func excludedPod(pod *corev1.Pod) bool { return pod.Labels[ExcludePodLabel] == "true" }

// localPods follows what detect-local needs from the API: the IPs of this
// node's pods (PodIPs mode, and for the pod-path check in every mode) or
// the Node's podCIDRs (NodeCIDR mode).
type localPods struct {
	mu sync.Mutex // protects the fields below
	// ips holds each pod's IPs by namespace/name, nil until synced. A pod
	// that opted out (ExcludePodLabel) has none here.
	ips map[string][]netip.Addr
	// excluded holds the pods that opted out, by namespace/name.
	excluded map[string]bool
	// cidrs and cidrErr are the Node's podCIDRs, or why they are unknown.
	cidrs   []netip.Prefix
	cidrErr error
}

func newLocalPods() *localPods {
	return &localPods{cidrErr: errors.New("detect-local: the Node's podCIDRs are not read yet")}
}

// nodeCIDRs returns the Node's podCIDRs.
func (l *localPods) nodeCIDRs() ([]netip.Prefix, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cidrs, l.cidrErr
}

// podIPs returns the IPs of this node's pods, sorted, and whether the
// first list has arrived.
func (l *localPods) podIPs() ([]netip.Addr, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ips == nil {
		return nil, false
	}
	var out []netip.Addr
	for _, ips := range l.ips {
		out = append(out, ips...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), true
}

// listed reports whether the first list of this node's pods has arrived.
func (l *localPods) listed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ips != nil
}

// excludedCount is the number of this node's pods that opted out.
func (l *localPods) excludedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.excluded)
}

// set records one pod's IPs (none: forget the pod), and whether it opted
// out, in which case its IPs are not kept. It reports whether the IPs
// changed.
func (l *localPods) set(key string, ips []netip.Addr, excluded bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ips == nil {
		l.ips = map[string][]netip.Addr{}
	}
	if excluded && len(ips) > 0 {
		if l.excluded == nil {
			l.excluded = map[string]bool{}
		}
		l.excluded[key] = true
		ips = nil
	} else {
		delete(l.excluded, key)
	}
	if slices.Equal(l.ips[key], ips) {
		return false
	}
	if len(ips) == 0 {
		delete(l.ips, key)
	} else {
		l.ips[key] = ips
	}
	return true
}

// followsLocal reports whether runDetectLocal has anything to follow: the
// Node's podCIDRs in NodeCIDR mode, this node's pods in PodIPs mode and
// for the pod-path check, which sends only those pods to kube-proxy's path
// (podpath.go), in every mode.
func (ic *Interceptor) followsLocal() bool {
	if ic.cfg.external() {
		// The agent sees no pod packet before the platform's translation.
		return false
	}
	return ic.cfg.DetectLocalMode == DetectLocalNodeCIDR || ic.followsLocalPods()
}

// followsLocalPods reports whether runDetectLocal watches this node's
// pods.
func (ic *Interceptor) followsLocalPods() bool {
	return ic.cfg.DetectLocalMode == DetectLocalPodIPs || ic.podPath != nil
}

// runDetectLocal feeds localPods until ctx ends: from a watch of this
// node's pods (only their IPs are kept), and in NodeCIDR mode from the
// Node, read until it names its podCIDRs. Each change the kernel holds
// (the pods set of PodIPs mode, the podCIDRs) asks for a sync, which puts
// it there.
func (ic *Interceptor) runDetectLocal(ctx context.Context) {
	logger := klog.FromContext(ctx)
	client, err := kubernetes.NewForConfig(ic.deps.LocalRESTConfig())
	if err != nil {
		logger.Error(err, "Cannot follow this node's pods for detect-local")
		return
	}
	var wg sync.WaitGroup
	if ic.cfg.DetectLocalMode == DetectLocalNodeCIDR {
		wg.Go(func() { ic.readNodeCIDRs(ctx, client) })
	}
	if ic.followsLocalPods() {
		src, err := ic.newPodsSource(ic.deps.LocalRESTConfig())
		if err != nil {
			logger.Error(err, "Cannot follow this node's pods for detect-local")
		} else {
			wg.Go(func() { ic.watchLocalPods(ctx, src) })
		}
	}
	wg.Wait()
}

// newPodsSource builds the source of the watch of this node's pods from
// cfg, the local configuration: as the node when cfg impersonates it,
// with the agent's own identity (cfg without the impersonation) as the
// fallback; as the agent alone otherwise. It becomes the one LocalPods
// reports.
func (ic *Interceptor) newPodsSource(cfg *rest.Config) (*podsSource, error) {
	listWatch := func(cfg *rest.Config) (cache.ListerWatcherWithContext, error) {
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		return cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", ic.cfg.NodeName).String()
		}), nil
	}
	var asNode cache.ListerWatcherWithContext
	user := cfg.Impersonate.UserName
	agentCfg := cfg
	if user != "" {
		var err error
		if asNode, err = listWatch(cfg); err != nil {
			return nil, err
		}
		agentCfg = rest.CopyConfig(cfg)
		agentCfg.Impersonate = rest.ImpersonationConfig{}
	}
	asAgent, err := listWatch(agentCfg)
	if err != nil {
		return nil, err
	}
	src := newPodsSource(asNode, asAgent, user, ic.now, ic.metrics.localPodsSource)
	ic.pods.Store(src)
	return src, nil
}

// LocalPods says where the agent learns this node's pod IPs from, and
// whether the redirect can match them yet.
func (ic *Interceptor) LocalPods() LocalPods {
	if !ic.followsLocalPods() {
		return LocalPods{}
	}
	lp := LocalPods{Source: PodsSourceNone, Reason: podsNotListedYet}
	if src := ic.pods.Load(); src != nil {
		lp.Source, lp.Reason = src.state()
	}
	listed := ic.local.listed()
	lp.HostNetworkOnly = ic.cfg.DetectLocalMode == DetectLocalPodIPs && !listed
	if lp.Source == PodsSourceNone && listed {
		lp.Reason += "; the pod IPs of the last list are kept"
	}
	return lp
}

// readNodeCIDRs reads the Node until it has podCIDRs (they never change
// once set) or ctx ends.
func (ic *Interceptor) readNodeCIDRs(ctx context.Context, client kubernetes.Interface) {
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, ic.cfg.NodeName, metav1.GetOptions{})
		var cidrs []netip.Prefix
		if err == nil {
			for _, s := range node.Spec.PodCIDRs {
				if p, perr := netip.ParsePrefix(s); perr == nil {
					cidrs = append(cidrs, p)
				}
			}
			if len(cidrs) == 0 {
				err = fmt.Errorf("detect-local: Node %s has no spec.podCIDRs (choose another --detect-local-mode for this IPAM)", ic.cfg.NodeName)
			}
		} else {
			err = fmt.Errorf("detect-local: reading Node %s: %w", ic.cfg.NodeName, err)
		}
		ic.local.mu.Lock()
		ic.local.cidrs, ic.local.cidrErr = cidrs, err
		ic.local.mu.Unlock()
		if err == nil {
			ic.RequestSync()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

// watchLocalPods follows the pods bound to this node, as the kubelet does
// (fieldSelector spec.nodeName), through lw (podsSource: as the node, or
// as the agent when that is refused), keeping only their IPs. Host-network
// pods are skipped: their traffic leaves through nat OUTPUT, which is
// always intercepted, and their IPs are the node's. Only in PodIPs mode
// does a change ask for a sync: in the other modes the kernel holds no
// pods set, and the pod-path check reads the IPs as it scans.
func (ic *Interceptor) watchLocalPods(ctx context.Context, lw cache.ListerWatcher) {
	requestSync := func() {
		if ic.cfg.DetectLocalMode == DetectLocalPodIPs {
			ic.RequestSync()
		}
	}
	update := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		var ips []netip.Addr
		if !pod.Spec.HostNetwork && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			for _, ip := range pod.Status.PodIPs {
				if addr, err := netip.ParseAddr(ip.IP); err == nil {
					ips = append(ips, addr.Unmap())
				}
			}
		}
		slices.SortFunc(ips, netip.Addr.Compare)
		if ic.local.set(pod.Namespace+"/"+pod.Name, ips, excludedPod(pod)) {
			requestSync()
		}
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	// Only what detect-local reads is kept.
	_ = inf.SetTransform(func(obj any) (any, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		var labels map[string]string
		if v, ok := pod.Labels[ExcludePodLabel]; ok {
			labels = map[string]string{ExcludePodLabel: v}
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, ResourceVersion: pod.ResourceVersion, Labels: labels},
			Spec:       corev1.PodSpec{HostNetwork: pod.Spec.HostNetwork},
			Status:     corev1.PodStatus{Phase: pod.Status.Phase, PodIPs: pod.Status.PodIPs},
		}, nil
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok && ic.local.set(pod.Namespace+"/"+pod.Name, nil, false) {
				requestSync()
			}
		},
	})
	// podsSource logs each change of identity and refusal; the reflector's
	// own report of every retry adds nothing at the default level.
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		klog.FromContext(ctx).V(2).Info("Watch of this node's pods failed", "err", err)
	})
	go inf.RunWithContext(ctx)
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		// An empty node has no events: mark the first list as arrived.
		ic.local.mu.Lock()
		if ic.local.ips == nil {
			ic.local.ips = map[string][]netip.Addr{}
		}
		ic.local.mu.Unlock()
		requestSync()
	}
	<-ctx.Done()
}
