package interception

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
//   - An attempt with no answered flow one scan later went unanswered (a
//     local handshake takes microseconds). A filter that drops the first
//     packet does so before conntrack confirms the connection, so there
//     is no flow at all; a drop later on the path leaves a flow that was
//     never answered, which is deleted. Either way the attempt is
//     forgotten, so that the connection's next SYN is recorded, and
//     judged, afresh: TCP retries it after 1 s, then at 2, 3 and 4 s
//     (Linux 6.5 and later, tcp_syn_linear_timeouts) or at 3, 7 s...
//   - A source blockedAttempts of whose attempts went unanswered within
//     strikeTTL goes into the skip set, whose entries make the chain
//     return to kube-proxy's path for BypassDuration, so the connection's
//     next SYN is NATed afresh, to kube-apiserver. The agent logs and
//     counts it, and says so on /intercepting. A blocked pod's first
//     connection thus succeeds at TCP's second SYN retry: after 2 s, or
//     3 s before Linux 6.5.
//   - A new flow from a pod of this node (PodIPs mode) that was not
//     DNATed to the agent while the agent intercepted bypassed it: the
//     agent reports not intercepting, with the flow, until no such flow
//     is seen for bypassReportTTL.
//
// What conntrack shows of an attempt is all the check knows, and a forged
// packet shows the same: a pod with CAP_NET_RAW (containerd's default) can
// send a SYN to the VIP with anyone's source address, which the chain
// records and routing then drops (a source that is the node's own is a
// martian; another pod's fails strict reverse-path filtering on the
// sender's interface), before conntrack confirms it, exactly as a filter
// would: conntrack cannot tell the two apart. So the check sends to kube-proxy's path only what it is safe to
// send there on forged evidence:
//
//   - Never an address of the node itself: the node's own traffic, the
//     self-check's included, takes the same chain, so a skipped node
//     address fails the self-check and takes interception off for every
//     pod of the node. The node's own path is the self-check's to judge.
//   - Only a pod of this node, as the API places pods on it, whatever the
//     detect-local mode: no other source is the check's to fail open.
//   - Never on one packet: blockedAttempts unanswered attempts, each
//     recorded after the one before was judged and forgotten, so each a
//     packet of its own. A real blocked client keeps retrying its SYN; a
//     lost or forged packet does not, unless it is sent again.
//
// A spoofer on this node that keeps sending can still move another pod of
// the node to kube-proxy's path for BypassDuration at a time. That is the
// bound: the pod then reaches kube-apiserver as it would without the agent
// (fail-open), losing the cache, never the API; its established
// connections are untouched (only unanswered flows are deleted), and
// neither the node's own interception nor any other node's changes.

// bypassReportTTL is how long a seen bypass keeps the agent reporting not
// intercepting.
const bypassReportTTL = 5 * time.Minute

// blockedAttempts is how many of a pod's redirected connection attempts,
// each a packet of its own, must go unanswered before the pod goes to
// kube-proxy's path: two, so that no single packet, lost or forged,
// decides, while a blocked client's first SYN retry (after 1 s) already
// completes the evidence.
const blockedAttempts = 2

// strikeTTL is how long an unanswered attempt counts toward
// blockedAttempts: long enough for a client's SYN retries to follow at
// any scan interval, short enough that stray losses far apart never add
// up.
const strikeTTL = time.Minute

// Outcomes of an unanswered attempt, for kube_apicache_pod_path_unanswered_total.
const (
	// unansweredCounted: a pod's attempt, counted toward blockedAttempts.
	unansweredCounted = "counted"
	// unansweredNodeAddress: from an address of the node itself.
	unansweredNodeAddress = "node-address"
	// unansweredNotPod: from an address no pod of this node has.
	unansweredNotPod = "not-a-pod"
	// unansweredPodsUnknown: this node's pods are not listed yet.
	unansweredPodsUnknown = "pods-unknown"
)

// podPath is the pod-path check's state.
type podPath struct {
	ct netrules.Conntrack
	// nodeAddrs lists the node's own addresses (netrules.NodeAddresses; a fake in
	// tests).
	nodeAddrs func() (map[netip.Addr]bool, error)

	blocked, bypassed, unanswered *prometheus.CounterVec
	scans                         prometheus.Counter

	mu sync.Mutex // protects the fields below
	// pending holds the redirected connection attempts, by source, that
	// had no answered flow at the last scan; ignored those never judged
	// (there at the first scan, or judged but not forgotten); known the
	// flows seen then.
	pending, ignored map[netip.AddrPort]bool
	known            map[netrules.Flow]bool
	// strikes counts, by pod IP, the attempts judged unanswered toward
	// blockedAttempts, with when the latest was.
	strikes map[netip.Addr]strikes
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

// strikes are one source's unanswered attempts toward blockedAttempts.
type strikes struct {
	n    int
	last time.Time
}

func newPodPath(ct netrules.Conntrack, reg prometheus.Registerer) *podPath {
	p := &podPath{
		ct:        ct,
		nodeAddrs: netrules.NodeAddresses,
		pending:   map[netip.AddrPort]bool{},
		known:     map[netrules.Flow]bool{},
		strikes:   map[netip.Addr]strikes{},
		blocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_blocked_total",
			Help: "Pods sent to kube-proxy's path for --bypass-duration because their connection attempts to a Service VIP, DNATed to the agent, were dropped on the way (a NetworkPolicy or host firewall): two unanswered attempts each.",
		}, []string{"family"}),
		scans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_scans_total",
			Help: "Scans of the pod-path check.",
		}),
		bypassed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_bypassed_total",
			Help: "New pod connections to a Service VIP that did not reach the agent while it intercepted (a dataplane ahead of netfilter's nat).",
		}, []string{"family"}),
		unanswered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kube_apicache_pod_path_unanswered_total",
			Help: "Connection attempts DNATed to the agent that went unanswered, by outcome: counted (a pod of this node; its source goes to kube-proxy's path once two are), or never held against the source: node-address (one of the node's own addresses, whose path the self-check judges), not-a-pod (no pod of this node has it), pods-unknown (this node's pods are not listed yet). Sources that are no pod of this node point at forged packets.",
		}, []string{"family", "outcome"}),
	}
	reg.MustRegister(p.blocked, p.bypassed, p.unanswered, p.scans)
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
func (ic *Interceptor) runPodPath(ctx context.Context) {
	t := time.NewTicker(ic.cfg.PodPathCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ic.scanPodPath(klog.FromContext(ctx))
	}
}

// scanPodPath runs one scan of every intercepted family.
func (ic *Interceptor) scanPodPath(logger klog.Logger) {
	p := ic.podPath
	defer p.scans.Inc()
	ic.planeMu.Lock()
	type plane struct {
		d      *dataplane
		active bool
	}
	planes := make([]plane, len(ic.planes))
	for i, d := range ic.planes {
		planes[i] = plane{d, d.active}
	}
	ic.planeMu.Unlock()

	now := ic.now()
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
		lapsed := ic.lastLapse.Load() >= p.lastScanNanos()
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
			fs, err := p.ct.Flows(d.family, netip.AddrPortFrom(vip, ic.cfg.ServicePort))
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
		unanswered := map[netip.Addr][]netrules.Flow{}
		for _, src := range attempts {
			f, tracked := flows[src]
			switch {
			case p.wasIgnored(src):
				ignored[src] = true
			case tracked && (f.SeenReply || f.ReplySrc != d.listen):
				// Answered, or not ours to judge.
			case p.wasPending(src):
				// Still no confirmed flow (a filter dropped the first
				// packet before conntrack confirmed it), or a confirmed
				// one never answered, one scan later: unanswered. It is
				// forgotten, so that it counts once: the same connection's
				// next SYN is recorded afresh, a packet of its own.
				if err := d.seen.Forget(src); err != nil {
					// Still there next scan, it would count twice.
					logger.Error(err, "Pod-path check: forgetting a judged attempt", "source", src)
					ignored[src] = true
					continue
				}
				unanswered[src.Addr()] = append(unanswered[src.Addr()], f)
			default:
				pending[src] = true
			}
		}
		logger.V(5).Info("Pod-path scan", "family", familyName(d.family), "attempts", len(attempts), "flows", len(flows), "pending", len(pending), "unanswered", len(unanswered))
		if len(unanswered) > 0 {
			ic.judgeUnanswered(logger, d, unanswered, now)
		}
	}
	p.mu.Lock()
	for ip, s := range p.strikes {
		if now.Sub(s.last) > strikeTTL {
			delete(p.strikes, ip)
		}
	}
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
func (ic *Interceptor) baselinePodPath() {
	p := ic.podPath
	ignored := map[netip.AddrPort]bool{}
	for _, d := range ic.planes {
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

// wasIgnored reports whether the attempt from src is never judged: it was
// there at the first scan, or could not be forgotten once judged.
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

// judgeUnanswered weighs the attempts of d's family that went unanswered,
// by source (with the flow each left, or the zero Flow for none). Only a
// pod of this node that is no address of the node itself is held to
// them: its unanswered flows are deleted, so that their next SYN is NATed
// and recorded afresh, and once blockedAttempts of its attempts went
// unanswered within strikeTTL it goes to kube-proxy's path.
func (ic *Interceptor) judgeUnanswered(logger klog.Logger, d *dataplane, unanswered map[netip.Addr][]netrules.Flow, now time.Time) {
	p := ic.podPath
	family := familyName(d.family)
	nodeAddrs, err := p.nodeAddrs()
	if err != nil {
		// Without the node's addresses no source is safe to skip; the
		// attempts are not counted, the next ones will be.
		logger.Error(err, "Pod-path check: unanswered attempts not judged")
		return
	}
	ips, listed := ic.local.podIPs()
	pods := make(map[netip.Addr]bool, len(ips))
	for _, ip := range ips {
		pods[ip] = true
	}
	refused := map[string]int{}
	for src, flows := range unanswered {
		outcome := unansweredCounted
		switch {
		case nodeAddrs[src] || src.IsLoopback() || src.IsUnspecified():
			outcome = unansweredNodeAddress
		case !listed:
			outcome = unansweredPodsUnknown
		case !pods[src]:
			outcome = unansweredNotPod
		}
		p.unanswered.WithLabelValues(family, outcome).Add(float64(len(flows)))
		if outcome != unansweredCounted {
			refused[outcome] += len(flows)
			logger.V(4).Info("Pod-path check: unanswered attempts held against no one", "source", src, "attempts", len(flows), "reason", outcome)
			continue
		}
		for _, f := range flows {
			if !f.Src.IsValid() {
				continue
			}
			if err := p.ct.Delete(d.family, f); err != nil {
				logger.Error(err, "Pod-path check: deleting an unanswered flow", "source", f.Src)
			}
		}
		if n := p.strike(src, len(flows), now); n < blockedAttempts {
			logger.V(4).Info("Pod-path check: a pod's connection attempt went unanswered", "source", src,
				"unanswered", n, "skipAt", blockedAttempts)
			continue
		}
		ic.skipBlocked(logger, d, src, now)
	}
	if len(refused) > 0 {
		logger.V(2).Info("Pod-path check: unanswered attempts from sources it never sends to kube-proxy's path (forged packets look like this)",
			"family", family, "nodeAddress", refused[unansweredNodeAddress], "notAPod", refused[unansweredNotPod],
			"podsUnknown", refused[unansweredPodsUnknown])
	}
}

// strike adds n unanswered attempts to src's count, after dropping one
// older than strikeTTL, and returns the count.
func (p *podPath) strike(src netip.Addr, n int, now time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.strikes[src]
	if now.Sub(s.last) > strikeTTL {
		s.n = 0
	}
	s.n += n
	s.last = now
	p.strikes[src] = s
	return s.n
}

// skipBlocked sends src, blockedAttempts of whose redirected connection
// attempts went unanswered, to kube-proxy's path for BypassDuration. Its
// count starts again once it has been sent.
func (ic *Interceptor) skipBlocked(logger klog.Logger, d *dataplane, src netip.Addr, now time.Time) {
	p := ic.podPath
	ic.planeMu.Lock()
	err := d.skip.Refresh([]netip.Addr{src})
	ic.planeMu.Unlock()
	if err != nil {
		// Its count stands: the next unanswered attempt tries again.
		logger.Error(err, "Pod-path check: adding a blocked source to the skip set", "source", src)
		return
	}
	p.mu.Lock()
	delete(p.strikes, src)
	p.mu.Unlock()
	p.blocked.WithLabelValues(familyName(d.family)).Inc()
	msg := fmt.Sprintf("%s: %d connection attempts to the kubernetes Service were redirected to the agent and dropped on the way (a NetworkPolicy or host firewall must allow %s); that source goes to kube-proxy's path for %s",
		src, blockedAttempts, d.listen, ic.cfg.BypassDuration)
	p.mu.Lock()
	p.lastBlocked, p.lastBlockedAt = msg, now
	p.mu.Unlock()
	logger.Error(nil, "Pod traffic to the agent is dropped; failing open for its source", "source", src,
		"listen", d.listen, "unansweredAttempts", blockedAttempts, "bypassDuration", ic.cfg.BypassDuration)
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
