package agent

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// TestPodPathKernel runs the pod-path check against the real kernel: a pod
// whose connections to the agent's listen address INPUT drops (a pod
// egress policy's stand-in) while the node's own path works. The dropped
// first packet leaves no conntrack flow, only the chain's record of the
// attempt; the check sends the pod's source to kube-proxy's path before
// TCP's first SYN retry, so the same dial reaches kube-proxy's destination.
func TestPodPathKernel(t *testing.T) {
	inKernelNode(t, func(n *kernelNode) {
		cfg := dataplaneConfig()
		cfg.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
		cfg.ListenAddress = netip.MustParseAddrPort(DefaultListenAddress)
		cfg.PodPathCheckInterval, cfg.BypassDuration = 100*time.Millisecond, time.Minute
		// The liveness entry must outlive the steps between its refresh
		// and the blocked dial on a loaded machine; its expiry is not
		// what this test checks.
		cfg.LivenessTimeout = time.Minute
		mustDo(t, cfg.Validate())
		k := Kernel{
			IPTables:  func(f netrules.Family) (netrules.IPTables, error) { return netrules.OpenIPTables(n.backend, f) },
			Netlink:   n.h,
			IPSet:     n.h,
			Conntrack: netrules.KernelConntrack{},
		}
		planes, err := newDataplanes(cfg, DataplaneIPTables, k)
		mustDo(t, err)
		d := planes[0]
		a := &Agent{cfg: cfg, planes: planes, now: time.Now, local: newLocalPods(),
			podPath: newPodPath(k.Conntrack, prometheus.NewRegistry())}

		// Given kube-proxy's DNAT of the VIP to an "apiserver" on the node,
		// the agent's listener, and its redirect in place,
		ipt, err := k.IPTables(netrules.IPv4)
		mustDo(t, err)
		lo, err := n.h.LinkByName("lo")
		mustDo(t, err)
		apiserver := netip.MustParseAddrPort("10.250.0.2:6443")
		mustDo(t, n.h.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(apiserver.Addr(), 32)), Flags: unix.IFA_F_NODAD}))
		l, err := net.Listen("tcp", apiserver.String())
		mustDo(t, err)
		serveBanner(t, l, "apiserver")
		mustDo(t, ipt.NewChain("nat", "KUBE-SERVICES"))
		mustDo(t, ipt.Append("nat", "KUBE-SERVICES", "-d", "10.96.0.1/32", "-p", "tcp", "-m", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", apiserver.String()))
		for _, hook := range []string{"PREROUTING", "OUTPUT"} {
			mustDo(t, ipt.Append("nat", hook, "-j", "KUBE-SERVICES"))
		}
		l, err = listen(context.Background(), d.listen.String())
		mustDo(t, err)
		serveBanner(t, l, "agent")
		_, err = d.addr.Sync()
		mustDo(t, err)
		_, _, err = d.sync()
		mustDo(t, err)
		mustDo(t, d.refresh())
		d.active = true
		vip := netip.AddrPortFrom(d.vips[0], cfg.ServicePort)
		if got, err := dialFrom(n.podNS, vip); err != nil || got != "agent" {
			t.Fatalf("before the filter: the pod reaches %q (%v), want the agent", got, err)
		}
		// An answered connection is not blocked, however often it is
		// looked at.
		for range 3 {
			<-inNodeNS(t, n, func() { a.scanPodPath(klog.Background()) })
		}
		if attempts, err := d.seen.Entries(); err != nil || len(attempts) != 1 {
			t.Errorf("attempts recorded = %v, %v; want the one connection", attempts, err)
		}
		if got := testutil.ToFloat64(a.podPath.blocked.WithLabelValues("IPv4")); got != 0 {
			t.Fatalf("an answered connection counted as blocked (%v)", got)
		}

		// when a filter drops the pod's traffic to the listen address and
		// the check scans meanwhile (in the node's namespace),
		mustDo(t, ipt.Insert("filter", "INPUT", 1, "-s", podVeth4.Addr().String(), "-d", d.listen.Addr().String(), "-p", "tcp", "-j", "DROP"))
		stop := make(chan struct{})
		done := inNodeNS(t, n, func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(cfg.PodPathCheckInterval):
				}
				a.scanPodPath(klog.Background())
			}
		})
		start := time.Now()
		got, err := dialFrom(n.podNS, vip)
		took := time.Since(start)
		close(stop)
		<-done

		// then the same dial reaches kube-proxy's destination after one SYN
		// retry, and the source is in the skip set.
		if err != nil || got != "apiserver" {
			t.Fatalf("blocked pod's dial: %q, %v after %s; want kube-proxy's apiserver", got, err, took)
		}
		t.Logf("the blocked pod reached kube-proxy's destination %s after it began to dial", took.Round(time.Millisecond))
		skipped, err := d.skip.Entries()
		mustDo(t, err)
		if len(skipped) != 1 || skipped[0] != podVeth4.Addr() {
			t.Errorf("skip set = %v, want the pod", skipped)
		}
		if got := testutil.ToFloat64(a.podPath.blocked.WithLabelValues("IPv4")); got != 1 {
			t.Errorf("blocked = %v, want 1", got)
		}
		// The node itself is still intercepted (the entry refreshed, as
		// the liveness loop would).
		mustDo(t, d.refresh())
		if got, err := dialFrom(n.nodeNS, vip); err != nil || got != "agent" {
			t.Errorf("the node reaches %q (%v), want the agent", got, err)
		}
	})
}

// inNodeNS runs fn on a thread of its own in n's node namespace (the
// check's netlink sockets are opened there) and returns a channel closed
// when fn is done.
func inNodeNS(t *testing.T, n *kernelNode, fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(n.nodeNS); err != nil {
			t.Error(err)
			return
		}
		fn()
	}()
	return done
}
