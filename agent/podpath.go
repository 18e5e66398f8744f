package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// The pod-path check: interception as pods get it.
//
// The self-check dials the VIP from the node itself, so it tests nat
// OUTPUT and the loopback path only. Pod traffic takes nat PREROUTING and
// then filter INPUT on the pod's interface, where a pod's egress
// NetworkPolicy (Calico applies it to pod-to-host traffic) or a host
// firewall that drops INPUT except on lo can drop it while the self-check
// passes: those pods would lose the API, a fail-closed outage. A dataplane
// that rewrites pod traffic ahead of netfilter's nat does the opposite: it
// bypasses the agent while the host path passes.
//
// The kernel sees what pods get. The chain records every connection
// attempt it redirects in the seen set (a SET rule ahead of the DNAT: source
// address and port, for a few seconds), and every scan compares those
// attempts with the kernel's connection tracking (a dump of the flows to
// each VIP, which the kernel filters by destination):
//
//   - An attempt with no answered flow one scan later was dropped on its
//     way (a local handshake takes microseconds). A filter that drops the
//     first packet does so before conntrack confirms the connection, so
//     there is no flow at all; a drop later on the path leaves a flow
//     that was never answered, which is deleted. Either way the source
//     goes into the skip set, whose entries make the chain return to
//     kube-proxy's path for BypassDuration, so the connection's next SYN
//     (TCP retries after one second) is NATed afresh, to kube-apiserver.
//     The agent logs and counts it, and says so on /intercepting.
//   - A new flow from a pod of this node (PodIPs mode) that was not
//     DNATed to the agent while the agent intercepted bypassed it: the
//     agent reports not intercepting, with the flow, until no such flow
//     is seen for bypassReportTTL.

// bypassReportTTL is how long a seen bypass keeps the agent reporting not
// intercepting.
const bypassReportTTL = 5 * time.Minute

// podPath is the pod-path check's state.
type podPath struct {
	ct netrules.Conntrack

	blocked, bypassed *prometheus.CounterVec
	scans             prometheus.Counter

	mu sync.Mutex // protects the fields below
	// pending holds the redirected connection attempts, by source, that
	// had no answered flow at the last scan; ignored those never judged
	// (there at the first scan); known the flows seen then.
	pending, ignored map[netip.AddrPort]bool
	known            map[netrules.Flow]bool
	// scanned is set after the first scan: flows of that scan predate the
	// check and are not taken as bypasses. active says which dataplanes
	// were intercepted at the last scan, and pods which of this node's pod
	// IPs their pods sets held then.
	scanned  bool
	active   map[*dataplane]bool
	pods     map[*dataplane]map[netip.Addr]bool
	lastScan time.Time
	// lastBlocked and lastBypass describe the latest of each, with when.
	lastBlocked, lastBypass     string
	lastBlockedAt, lastBypassAt time.Time
}

func newPodPath(ct netrules.Conntrack, reg prometheus.Registerer) *podPath {
	p := &podPath{
		ct:      ct,
		pending: map[netip.AddrPort]bool{},
		known:   map[netrules.Flow]bool{},
		blocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_blocked_total",
			Help: "Pod connections to a Service VIP that were DNATed to the agent and dropped on the way (a NetworkPolicy or host firewall); their sources go to kube-proxy's path for --bypass-duration.",
		}, []string{"family"}),
		scans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_scans_total",
			Help: "Scans of the pod-path check.",
		}),
		bypassed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_bypassed_total",
			Help: "New pod connections to a Service VIP that did not reach the agent while it intercepted (a dataplane ahead of netfilter's nat).",
		}, []string{"family"}),
	}
	reg.MustRegister(p.blocked, p.bypassed, p.scans)
	return p
}

// bypassErr returns the latest bypass seen within bypassReportTTL of now.
func (p *podPath) bypassErr(now time.Time) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastBypass == "" || now.Sub(p.lastBypassAt) > bypassReportTTL {
		return nil
	}
	return fmt.Errorf("pod traffic bypasses the agent: %s (seen %s ago)", p.lastBypass, now.Sub(p.lastBypassAt).Round(time.Second))
}

// status returns a line on the latest block, for /intercepting.
func (p *podPath) status(now time.Time) string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastBlocked == "" {
		return ""
	}
	return fmt.Sprintf("%s (%s ago)", p.lastBlocked, now.Sub(p.lastBlockedAt).Round(time.Second))
}

// runPodPath scans every PodPathCheckInterval until ctx ends.
func (a *Agent) runPodPath(ctx context.Context) {
	t := time.NewTicker(a.cfg.PodPathCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.scanPodPath(klog.FromContext(ctx))
	}
}

// scanPodPath runs one scan of every intercepted family.
func (a *Agent) scanPodPath(logger klog.Logger) {
	p := a.podPath
	defer p.scans.Inc()
	a.planeMu.Lock()
	type plane struct {
		d      *dataplane
		active bool
	}
	planes := make([]plane, len(a.planes))
	for i, d := range a.planes {
		planes[i] = plane{d, d.active}
	}
	a.planeMu.Unlock()

	now := a.now()
	ignored := map[netip.AddrPort]bool{}
	pods := map[*dataplane]map[netip.Addr]bool{}
	seen := map[netrules.Flow]bool{}
	pending := map[netip.AddrPort]bool{}
	for _, pl := range planes {
		d := pl.d
		if d.skip == nil || !pl.active {
			continue
		}
		// A new flow (one that started since the last scan) bypassed the
		// agent only if its source was one of this node's pods in the
		// kernel's own set already at the last scan, so before the flow
		// began (a new pod's first connections, before its IP reached the
		// set, rightly go to kube-proxy), and was not sent to kube-proxy's
		// path on purpose.
		if d.podsSet != nil {
			pods[d] = addrSet(d.podsSet.Entries())
		}
		// Nor while the liveness entry may have lapsed since the last
		// scan, which sent connections to kube-proxy's path for a moment.
		lapsed := a.lastLapse.Load() >= p.lastScanNanos()
		var skipped map[netip.Addr]bool
		bypassCandidate := func(src netip.Addr) bool {
			if d.podsSet == nil || lapsed || !p.wasActive(d) || !p.hadPod(d, src) || !pods[d][src] {
				return false
			}
			if skipped == nil {
				skipped = addrSet(d.skip.Entries())
			}
			return !skipped[src]
		}
		// The connection attempts the chain redirected (recorded by its
		// SET rule), and what conntrack knows of them.
		attempts, err := d.seen.Entries()
		if err != nil {
			logger.Error(err, "Pod-path check: listing redirected connection attempts")
			continue
		}
		flows := map[netip.AddrPort]netrules.Flow{}
		for _, vip := range d.vips {
			fs, err := p.ct.Flows(d.family, netip.AddrPortFrom(vip, a.cfg.ServicePort))
			if err != nil {
				logger.Error(err, "Pod-path check: listing conntrack flows")
				continue
			}
			for _, f := range fs {
				flows[f.Src] = f
				// Flows are keyed without their reply state.
				key := f
				key.SeenReply = false
				seen[key] = true
				if f.ReplySrc != d.listen && p.isNew(key) && bypassCandidate(f.Src.Addr()) {
					d.bypassedBy(p, f, now)
				}
			}
		}
		blocked := map[netip.Addr][]netrules.Flow{}
		var judged []netip.AddrPort
		for _, src := range attempts {
			f, tracked := flows[src]
			switch {
			case p.wasIgnored(src):
				ignored[src] = true
			case tracked && (f.SeenReply || f.ReplySrc != d.listen):
				// Answered, or not ours to judge.
			case p.wasPending(src):
				// Still no confirmed flow (the filter dropped the first
				// packet before conntrack confirmed it), or a confirmed
				// one never answered, one scan later: blocked.
				if tracked {
					blocked[src.Addr()] = append(blocked[src.Addr()], f)
				} else if _, ok := blocked[src.Addr()]; !ok {
					blocked[src.Addr()] = nil
				}
				judged = append(judged, src)
			default:
				pending[src] = true
			}
		}
		logger.V(5).Info("Pod-path scan", "family", familyName(d.family), "attempts", len(attempts), "flows", len(flows), "pending", len(pending), "blocked", len(blocked))
		for ip, fs := range blocked {
			a.skipBlocked(logger, d, ip, fs, now)
		}
		for _, src := range judged {
			// Judged: the attempt is not counted again.
			if err := d.seen.Forget(src); err != nil {
				logger.Error(err, "Pod-path check: forgetting a judged attempt", "source", src)
			}
		}
	}
	p.mu.Lock()
	p.pending, p.known, p.ignored, p.scanned = pending, seen, ignored, true
	p.pods, p.lastScan = pods, now
	p.active = map[*dataplane]bool{}
	for _, pl := range planes {
		p.active[pl.d] = pl.active
	}
	p.mu.Unlock()
}

// lastScanNanos returns when the last scan ran, in Unix nanoseconds.
func (p *podPath) lastScanNanos() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastScan.UnixNano()
}

// hadPod reports whether d's pods set held ip at the last scan.
func (p *podPath) hadPod(d *dataplane, ip netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[d][ip]
}

// wasActive reports whether d was intercepted at the last scan too: a flow
// new since then started while it was.
func (p *podPath) wasActive(d *dataplane) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active[d]
}

// addrSet turns a set's entries into a lookup; a set it cannot read is
// empty.
func addrSet(ips []netip.Addr, err error) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	if err != nil {
		return out
	}
	for _, ip := range ips {
		out[ip] = true
	}
	return out
}

// baselinePodPath records, before the agent first intercepts, the
// connection attempts already in the seen sets: a predecessor killed
// meanwhile refused them, which is no filter's doing, so they are never
// judged. Flows are known from the first scan on.
func (a *Agent) baselinePodPath() {
	p := a.podPath
	ignored := map[netip.AddrPort]bool{}
	for _, d := range a.planes {
		if d.seen == nil {
			continue
		}
		// A set that does not exist yet holds nothing to ignore.
		attempts, _ := d.seen.Entries()
		for _, src := range attempts {
			ignored[src] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ignored = ignored
}

// wasIgnored reports whether the attempt from src was there at the first
// scan.
func (p *podPath) wasIgnored(src netip.AddrPort) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ignored[src]
}

func (p *podPath) wasPending(f netip.AddrPort) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending[f]
}

// isNew reports whether f appeared since the last scan, after the first.
func (p *podPath) isNew(f netrules.Flow) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.scanned && !p.known[f]
}

// skipBlocked sends src, whose redirected connection attempts were
// dropped on their way to the agent, to kube-proxy's path for
// BypassDuration. Confirmed flows of those attempts (never answered) are
// deleted, so that their next SYN is NATed afresh; a dropped first packet
// left none.
func (a *Agent) skipBlocked(logger klog.Logger, d *dataplane, src netip.Addr, flows []netrules.Flow, now time.Time) {
	p := a.podPath
	a.planeMu.Lock()
	err := d.skip.Refresh([]netip.Addr{src})
	a.planeMu.Unlock()
	if err != nil {
		logger.Error(err, "Pod-path check: adding a blocked source to the skip set", "source", src)
		return
	}
	for _, f := range flows {
		if err := p.ct.Delete(d.family, f); err != nil {
			logger.Error(err, "Pod-path check: deleting the blocked flow", "source", f.Src)
		}
	}
	p.blocked.WithLabelValues(familyName(d.family)).Inc()
	msg := fmt.Sprintf("%s: a connection to the kubernetes Service was redirected to the agent and dropped on the way (a NetworkPolicy or host firewall must allow %s); that source goes to kube-proxy's path for %s",
		src, d.listen, a.cfg.BypassDuration)
	p.mu.Lock()
	p.lastBlocked, p.lastBlockedAt = msg, now
	p.mu.Unlock()
	logger.Error(nil, "Pod traffic to the agent is dropped; failing open for its source", "source", src,
		"listen", d.listen, "bypassDuration", a.cfg.BypassDuration)
}

// bypassedBy records the new flow f from a pod of this node that reached
// something other than the agent while d was intercepted.
func (d *dataplane) bypassedBy(p *podPath, f netrules.Flow, now time.Time) {
	p.bypassed.WithLabelValues(familyName(d.family)).Inc()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastBypass = fmt.Sprintf("%s to %s went to %s, not to the agent at %s (a dataplane ahead of netfilter's nat, or a rule ahead of the agent's)",
		f.Src.Addr(), f.Dst, f.ReplySrc, d.listen)
	p.lastBypassAt = now
}

// attemptTTL is how long a redirected connection attempt stays in the seen
// set after its last packet: several scans.
const attemptTTL = 5 * time.Second

// seenSetName is the set of redirected connection attempts.
func seenSetName(c *Config, f netrules.Family) string {
	return setNameWithSuffix(c, "-SEEN", f)
}

// skipSetName is the set of sources sent back to kube-proxy's path.
func skipSetName(c *Config, f netrules.Family) string {
	return setNameWithSuffix(c, "-SKIP", f)
}
