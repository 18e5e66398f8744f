package interception

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// The external dataplane: someone else redirects the Service VIP.
//
// Where the platform translates ClusterIP traffic before the host's
// netfilter sees it (Cilium's kube-proxy replacement, GKE Dataplane V2,
// Azure CNI powered by Cilium, Calico's eBPF dataplane), the agent's nat
// rules never match: the pods' packets already carry an apiserver's
// address. Such a platform can send the Service to a node-local backend
// itself (a Cilium Local Redirect Policy). With --dataplane=external the
// agent is that backend and nothing more:
//
//   - it programs no netfilter: no chain, no set, no nftables table, no
//     address on a link. It only removes the redirect an agent of another
//     dataplane left on the node (removeOthers), so that two redirects
//     never stay.
//   - it listens on every address of its network namespace, on the listen
//     addresses' ports (BindAddresses), for the platform to send the VIP's
//     traffic to.
//   - its readiness is the switch: Ready is nil only while it would
//     intercept in the other dataplanes (the kill switch and the Service
//     check let it, its certificate is ready, an upstream is healthy or
//     degraded mode covers, the cache has warmed up, the listener
//     answers). The platform takes a not-ready pod out of the redirect;
//     how fast, and whether the VIP then reaches kube-apiserver, is the
//     platform's business (docs/install/platforms/cilium-local-redirect.md).
//
// Nothing the agent does by source address works here: there is no skip
// set (a client-certificate caller gets the 401 a host-network caller
// gets) and no pod-path check or detect-local (the agent sees no packet
// before the platform's translation).

// external reports whether another component redirects the VIP.
func (c *Config) external() bool { return c.Dataplane == DataplaneExternal }

// External reports whether the dataplane is external: another component
// redirects the VIP to the agent, and the agent programs no netfilter.
func (c *Config) External() bool { return c.external() }

// BindAddresses returns the addresses the agent's listeners bind. With a
// dataplane of the agent's own these are ListenAddresses. With the
// external dataplane the platform sends the VIP's traffic to the agent's
// own (pod) address, which the agent does not know in advance: one
// wildcard listener per distinct port of ListenAddresses, IPv4 wildcard
// first (Go's listener on it is dual-stack where the kernel has IPv6).
func (c *Config) BindAddresses() []netip.AddrPort {
	listen := c.ListenAddresses()
	if !c.external() {
		return listen
	}
	var out []netip.AddrPort
	var ports []uint16
	for _, ap := range listen {
		if slices.Contains(ports, ap.Port()) {
			continue
		}
		ports = append(ports, ap.Port())
		wild := netip.IPv4Unspecified()
		if ap.Addr().Is6() {
			wild = netip.IPv6Unspecified()
		}
		out = append(out, netip.AddrPortFrom(wild, ap.Port()))
	}
	return out
}

// probeAddress is where a handshake with the listener bound at ap is
// checked from inside the agent: loopback of ap's family on its port for
// a wildcard bind, ap itself otherwise.
func probeAddress(ap netip.AddrPort) netip.AddrPort {
	switch {
	case ap.Addr() == netip.IPv4Unspecified():
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port())
	case ap.Addr() == netip.IPv6Unspecified():
		return netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
	}
	return ap
}

// buildExternal sets up the external dataplane: no redirect of the
// agent's own, and the redirects of both backends, as an agent that
// programmed the node left them, to be removed where found. A backend
// that cannot be driven here (no iptables, no nftables, no NET_ADMIN in a
// pod's namespace) holds nothing of the agent's.
func (ic *Interceptor) buildExternal(k Kernel) {
	ic.dataplane, ic.dataplaneReason = DataplaneExternal,
		"--dataplane=external: another component (such as a Cilium Local Redirect Policy) redirects the Service VIP to this agent; readiness is the switch"
	ic.planes = nil
	ic.others = nil
	for _, b := range []string{DataplaneIPTables, DataplaneNFTables} {
		if b == DataplaneNFTables && k.NFTables == nil {
			continue
		}
		planes, err := newDataplanes(ic.cfg, b, k)
		if err != nil {
			klog.Background().V(2).Info("A dataplane is not available to look for leftovers", "dataplane", b, "err", err)
			continue
		}
		ic.others = append(ic.others, planes...)
	}
}

// syncExternal is sync for the external dataplane: it removes what an
// agent of another dataplane left on the node, then decides whether the
// agent is fit to be the redirect's backend. notReady says why not; the
// agent is then not ready (Ready), and the platform's redirect should
// leave it. ic.syncMu must be held.
func (ic *Interceptor) syncExternal(ctx context.Context) (notReady error) {
	logger := klog.FromContext(ctx)
	start := ic.now()
	defer func() {
		ic.metrics.syncDuration.Observe(ic.now().Sub(start).Seconds())
		ic.deps.RuleSyncs.WithLabelValues("unchanged").Inc()
	}()
	ic.removeOthers(logger)
	if err := ic.health(); err != nil {
		ic.syncSawUnhealthy.Store(true)
		return notInterceptingBecause(err)
	}
	ic.syncSawUnhealthy.Store(false)
	for _, ap := range ic.cfg.BindAddresses() {
		if err := checkListener(ctx, probeAddress(ap), ic.cfg.ProbeTimeout()); err != nil {
			return fmt.Errorf("unhealthy: listener %s not serving: %w", ap, err)
		}
	}
	return nil
}

// externalVIPs lists the Service VIPs by family, IPv4 first, as VIPs does
// for the dataplanes of the agent's own.
func (c *Config) externalVIPs() []netip.Addr {
	var out []netip.Addr
	for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
		for _, vip := range c.ServiceVIPs {
			if netrules.FamilyOf(vip) == f {
				out = append(out, vip.Unmap())
			}
		}
	}
	return out
}
