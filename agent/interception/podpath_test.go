package interception

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// TestPodPath drives the pod-path check over a fake conntrack table: a pod
// connection redirected to the agent and left unanswered over two scans,
// twice (its SYN and the retry after it), sends its source to kube-proxy's
// path, and its unanswered flows are deleted from conntrack; one
// unanswered attempt alone, an answered one and flows older than the
// check change nothing; a new flow of a pod of this node that did not
// reach the agent while it intercepted makes the agent report not
// intercepting, with the flow; a source sent to kube-proxy's path on
// purpose, or a new pod's connection that may have begun before its IP
// reached the pods set, is no such bypass.
func TestPodPath(t *testing.T) {
	k := newFakeKernel(t)
	ep := newTestEndpoint(t, ok)
	a, vip := newSyncTestAgentWith(t, k, ep, func(c *Config) {
		c.DetectLocalMode = DetectLocalPodIPs
		c.PodPathCheckInterval = 250 * time.Millisecond
		c.BypassDuration = 10 * time.Minute
	})
	ctx := context.Background()
	logger := klog.Background()
	pod := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}) }
	a.icpt.local.set("default/a", []netip.Addr{pod(5)}, false)
	a.icpt.local.set("default/b", []netip.Addr{pod(6)}, false)
	a.icpt.local.set("default/c", []netip.Addr{pod(7)}, false)
	if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("sync = %v, %v", notReady, err)
	}
	apiserver := netip.MustParseAddrPort("10.250.0.2:6443")
	flow := func(src netip.Addr, port uint16, to netip.AddrPort, replied bool) netrules.Flow {
		return netrules.Flow{Src: netip.AddrPortFrom(src, port), Dst: vip, ReplySrc: to, SeenReply: replied}
	}
	// attempt records a connection attempt the chain redirected, as its
	// SET rule does.
	attempt := func(src netip.Addr, port uint16) {
		t.Helper()
		proto := uint8(6)
		mustDo(t, k.ipset.IpsetAdd(seenSetName(a.cfg, netrules.IPv4), &netlink.IPSetEntry{IP: src.AsSlice(), Port: &port, Protocol: &proto, Replace: true}))
	}
	// Given a watch that predates the check, sent to kube-apiserver, and an
	// attempt a killed predecessor refused (no flow left), there before
	// the agent first intercepted (baselinePodPath),
	k.ct.Add(flow(pod(5), 30000, apiserver, true))
	attempt(pod(6), 39999)
	a.icpt.baselinePodPath()
	a.icpt.scanPodPath(logger)
	a.icpt.scanPodPath(logger)
	if got := testutil.ToFloat64(a.icpt.podPath.blocked.WithLabelValues("IPv4")); got != 0 {
		t.Fatalf("an attempt older than the agent counted as blocked (%v)", got)
	}

	// when a pod's redirected connection attempt has no conntrack flow
	// over two scans (a filter dropped its first packet before conntrack
	// confirmed it), that alone changes nothing, however long the check
	// looks;
	attempt(pod(5), 40000)
	attempt(pod(6), 40001)
	k.ct.Add(flow(pod(6), 40001, vip, true)) // answered: fine
	for range 4 {
		a.icpt.scanPodPath(logger)
	}
	if k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), pod(5)) {
		t.Fatal("source skipped on one unanswered packet")
	}
	// but once its retried SYN (recorded afresh: the first was forgotten
	// once judged) goes unanswered too, its source goes to kube-proxy's
	// path;
	attempt(pod(5), 40000)
	a.icpt.scanPodPath(logger)
	if k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), pod(5)) {
		t.Fatal("source skipped before its second attempt was judged")
	}
	a.icpt.scanPodPath(logger)
	if !k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), pod(5)) {
		t.Fatalf("blocked source not in the skip set:\n%s", k.ipset.Save())
	}
	if len(k.ct.Deleted) != 0 {
		t.Errorf("deleted flows = %+v, want none (there was none)", k.ct.Deleted)
	}
	if to, err := k.ipt.Traverse("PREROUTING", fake.Packet{Src: pod(5), Dst: vip}); err != nil || to == vip.String() {
		t.Errorf("the blocked source's next connection goes to %q (%v), want kube-proxy's path", to, err)
	}
	if to, err := k.ipt.Traverse("PREROUTING", fake.Packet{Src: pod(6), Dst: vip}); err != nil || to != vip.String() {
		t.Errorf("another pod's connection goes to %q (%v), want the agent", to, err)
	}
	// and when a confirmed flow of an attempt stays unanswered (a drop
	// later on the path), it is deleted, so that its next SYN is NATed and
	// recorded afresh, and when that one's flow stays unanswered too, it
	// is deleted and the source skipped.
	unanswered := flow(pod(7), 40005, vip, false)
	for range blockedAttempts {
		attempt(pod(7), 40005)
		k.ct.Add(unanswered)
		a.icpt.scanPodPath(logger)
		a.icpt.scanPodPath(logger)
	}
	if len(k.ct.Deleted) != blockedAttempts || k.ct.Deleted[0] != unanswered || k.ct.Deleted[1] != unanswered {
		t.Errorf("deleted flows = %+v, want the unanswered one, once per attempt", k.ct.Deleted)
	}
	if !k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), pod(7)) {
		t.Fatalf("source of unanswered flows not in the skip set:\n%s", k.ipset.Save())
	}
	mustDo(t, k.ipset.IpsetDel(skipSetName(a.cfg, netrules.IPv4), &netlink.IPSetEntry{IP: pod(7).AsSlice()}))
	if got := testutil.ToFloat64(a.icpt.podPath.blocked.WithLabelValues("IPv4")); got != 2 {
		t.Errorf("blocked = %v, want 2", got)
	}
	if got := testutil.ToFloat64(a.icpt.podPath.unanswered.WithLabelValues("IPv4", unansweredCounted)); got != 2*blockedAttempts {
		t.Errorf("unanswered attempts counted = %v, want %d (of pods %s and %s)", got, 2*blockedAttempts, pod(5), pod(7))
	}
	if note := a.icpt.PodPathNote(); !strings.Contains(note, "dropped on the way") || !strings.Contains(note, pod(7).String()) {
		t.Errorf("/intercepting note = %q", note)
	}

	// When the skipped source connects again, through kube-proxy, that is
	// no bypass;
	k.ct.Add(flow(pod(5), 40002, apiserver, true))
	a.icpt.scanPodPath(logger)
	if err := a.icpt.podPath.bypassErr(a.now()); err != nil {
		t.Fatalf("a skipped source counted as a bypass: %v", err)
	}
	// nor is the first connection of a new pod whose IP reached the pods
	// set only since the last scan (it may have begun before);
	a.icpt.local.set("default/d", []netip.Addr{pod(8)}, false)
	if notReady, err := a.icpt.sync(ctx); err != nil || notReady != nil {
		t.Fatalf("sync = %v, %v", notReady, err)
	}
	k.ct.Add(flow(pod(8), 40004, apiserver, true))
	a.icpt.scanPodPath(logger)
	if err := a.icpt.podPath.bypassErr(a.now()); err != nil {
		t.Fatalf("a new pod's first connection counted as a bypass: %v", err)
	}
	// but a new connection of another pod of this node that went to
	// kube-apiserver while the agent intercepted is, and the agent says it
	// does not intercept.
	k.ct.Add(flow(pod(7), 40003, apiserver, true))
	a.icpt.scanPodPath(logger)
	if err := a.icpt.syncAndReport(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Intercepting(); err == nil || !strings.Contains(err.Error(), "bypasses the agent") || !strings.Contains(err.Error(), pod(7).String()) {
		t.Errorf("Intercepting() after a bypass = %v", err)
	}
}

// TestPodPathUnansweredSources pins whom unanswered attempts are held
// against. A packet with any source address can be forged by a pod with
// CAP_NET_RAW, and one the kernel drops on routing looks like a filter's
// drop; so in every detect-local mode only a pod of this node goes to
// kube-proxy's path, never an address of the node itself (its own traffic,
// the self-check's included, takes the same chain), and only on
// blockedAttempts unanswered attempts within strikeTTL.
func TestPodPathUnansweredSources(t *testing.T) {
	node := netip.MustParseAddr("10.250.1.1")
	pod := netip.MustParseAddr("10.244.1.5")
	tests := []struct {
		name string
		// src sends attempts, each recorded after the one before was
		// judged, every gap apart; pods are this node's pod IPs, nil
		// while not listed.
		src      netip.Addr
		attempts int
		gap      time.Duration
		pods     []netip.Addr
		skipped  bool
		outcome  string
	}{{
		// A pod of this node whose SYN and its retry go unanswered.
		name: "pod, retried", src: pod, attempts: blockedAttempts, gap: time.Second, pods: []netip.Addr{pod},
		skipped: true, outcome: unansweredCounted,
	}, {
		// One unanswered packet is no evidence.
		name: "pod, one packet", src: pod, attempts: 1, pods: []netip.Addr{pod},
		outcome: unansweredCounted,
	}, {
		// Unanswered attempts further apart than strikeTTL never add up.
		name: "pod, far apart", src: pod, attempts: blockedAttempts, gap: strikeTTL + time.Second, pods: []netip.Addr{pod},
		outcome: unansweredCounted,
	}, {
		// The node's own address, however often, even were it a pod's
		// too: the self-check judges the node's own path.
		name: "node address", src: node, attempts: 3 * blockedAttempts, gap: time.Second, pods: []netip.Addr{node, pod},
		outcome: unansweredNodeAddress,
	}, {
		// Loopback can only be forged from a pod.
		name: "loopback", src: netip.MustParseAddr("127.0.0.1"), attempts: 3 * blockedAttempts, gap: time.Second, pods: []netip.Addr{pod},
		outcome: unansweredNodeAddress,
	}, {
		// An address no pod of this node has: another node's pod, or
		// anyone's.
		name: "not a pod", src: netip.MustParseAddr("10.244.2.7"), attempts: 3 * blockedAttempts, gap: time.Second, pods: []netip.Addr{pod},
		outcome: unansweredNotPod,
	}, {
		// Before this node's pods are listed, no source is known to be
		// one.
		name: "pods not listed", src: pod, attempts: 3 * blockedAttempts, gap: time.Second, pods: nil,
		outcome: unansweredPodsUnknown,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel(t)
			ep := newTestEndpoint(t, ok)
			a, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) {
				c.DetectLocalMode = DetectLocalNone
				c.PodPathCheckInterval = 250 * time.Millisecond
				c.BypassDuration = 10 * time.Minute
			})
			now := time.Now()
			a.now = func() time.Time { return now }
			a.icpt.now = a.now
			a.icpt.podPath.nodeAddrs = func() (map[netip.Addr]bool, error) { return map[netip.Addr]bool{node: true}, nil }
			if tc.pods != nil {
				a.icpt.local.set("default/a", tc.pods, false)
			}
			if notReady, err := a.icpt.sync(context.Background()); err != nil || notReady != nil {
				t.Fatalf("sync = %v, %v", notReady, err)
			}
			logger := klog.Background()
			port, proto := uint16(40000), uint8(6)
			for range tc.attempts {
				mustDo(t, k.ipset.IpsetAdd(seenSetName(a.cfg, netrules.IPv4), &netlink.IPSetEntry{IP: tc.src.AsSlice(), Port: &port, Protocol: &proto, Replace: true}))
				a.icpt.scanPodPath(logger)
				a.icpt.scanPodPath(logger)
				now = now.Add(tc.gap)
			}
			if got := k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), tc.src); got != tc.skipped {
				t.Errorf("%s skipped = %v, want %v:\n%s", tc.src, got, tc.skipped, k.ipset.Save())
			}
			if got := testutil.ToFloat64(a.icpt.podPath.unanswered.WithLabelValues("IPv4", tc.outcome)); got != float64(tc.attempts) {
				t.Errorf("unanswered attempts %s = %v, want %d", tc.outcome, got, tc.attempts)
			}
		})
	}
}

// TestSkipSource: with the pod-path check on, a source handed over (a
// client-certificate caller) goes into its family's skip set; with the
// check off there is no skip set, and the source cannot be steered.
func TestSkipSource(t *testing.T) {
	for _, on := range []bool{true, false} {
		k := newFakeKernel(t)
		ep := newTestEndpoint(t, ok)
		a, _ := newSyncTestAgentWith(t, k, ep, func(c *Config) {
			if on {
				c.PodPathCheckInterval = 250 * time.Millisecond
				c.BypassDuration = 10 * time.Minute
			}
		})
		if notReady, err := a.icpt.sync(context.Background()); err != nil || notReady != nil {
			t.Fatalf("sync = %v, %v", notReady, err)
		}
		pod := netip.MustParseAddr("10.244.1.5")
		steerable, err := a.icpt.SkipSource(pod)
		if err != nil || steerable != on {
			t.Errorf("pod-path check %t: SkipSource = %t, %v; want %t", on, steerable, err, on)
		}
		if got := k.ipset.Contains(skipSetName(a.cfg, netrules.IPv4), pod); got != on {
			t.Errorf("pod-path check %t: source in the skip set %t", on, got)
		}
		a.icpt.RemoveStale()
	}
}
