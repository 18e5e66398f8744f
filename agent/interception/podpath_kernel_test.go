package interception

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
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
// of this node whose connections to the agent's listen address INPUT drops
// (a pod egress policy's stand-in) while the node's own path works. The
// dropped first packet leaves no conntrack flow, only the chain's record
// of the attempt; the check counts it, and the retried SYN after it, and
// sends the pod's source to kube-proxy's path before TCP's second SYN
// retry, so the same dial reaches kube-proxy's destination.
func TestPodPathKernel(t *testing.T) {
	inKernelNode(t, func(n *kernelNode) {
		// Given the agent's redirect, kube-proxy's DNAT of the VIP to an
		// "apiserver" on the node, and the pod known as a pod of this node,
		a, d, vip := newPodPathKernelAgent(t, n, DetectLocalNone)
		a.icpt.local.set("default/pod", []netip.Addr{podVeth4.Addr()}, false)
		ipt, err := netrules.OpenIPTables(n.backend, netrules.IPv4)
		mustDo(t, err)
		if got, err := dialFrom(n.podNS, vip); err != nil || got != "agent" {
			t.Fatalf("before the filter: the pod reaches %q (%v), want the agent", got, err)
		}
		// An answered connection is not blocked, however often it is
		// looked at.
		for range 3 {
			<-inNodeNS(t, n, func() { a.icpt.scanPodPath(klog.Background()) })
		}
		if attempts, err := d.seen.Entries(); err != nil || len(attempts) != 1 {
			t.Errorf("attempts recorded = %v, %v; want the one connection", attempts, err)
		}
		if got := testutil.ToFloat64(a.icpt.podPath.blocked.WithLabelValues("IPv4")); got != 0 {
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
				case <-time.After(a.cfg.PodPathCheckInterval):
				}
				a.icpt.scanPodPath(klog.Background())
			}
		})
		start := time.Now()
		// TCP sends SYNs at 0, 1 and 3 seconds: the third one is the
		// first that can find the source skipped.
		got, err := dialFromWithin(n.podNS, vip, 5*time.Second)
		took := time.Since(start)
		close(stop)
		<-done

		// then the same dial reaches kube-proxy's destination after two
		// SYN retries, and the source is in the skip set.
		if err != nil || got != "apiserver" {
			t.Fatalf("blocked pod's dial: %q, %v after %s; want kube-proxy's apiserver", got, err, took)
		}
		t.Logf("the blocked pod reached kube-proxy's destination %s after it began to dial", took.Round(time.Millisecond))
		skipped, err := d.skip.Entries()
		mustDo(t, err)
		if len(skipped) != 1 || skipped[0] != podVeth4.Addr() {
			t.Errorf("skip set = %v, want the pod", skipped)
		}
		if got := testutil.ToFloat64(a.icpt.podPath.blocked.WithLabelValues("IPv4")); got != 1 {
			t.Errorf("blocked = %v, want 1", got)
		}
		if got := testutil.ToFloat64(a.icpt.podPath.unanswered.WithLabelValues("IPv4", unansweredCounted)); got != blockedAttempts {
			t.Errorf("unanswered attempts counted = %v, want %d", got, blockedAttempts)
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

// TestPodPathSpoofedKernel sends the pod-path check what a pod with
// CAP_NET_RAW (containerd's default) can forge: one TCP SYN to the VIP
// whose source is the node's own address, and one whose source is another
// pod of this node, in the detect-local mode that redirects every source
// (None). The kernel records both attempts and drops both packets on
// routing (a local source is a martian; the other pod's address fails
// strict reverse-path filtering on the sender's veth), which is exactly
// what a filter's drop looks like. Neither may change the skip set: a
// skipped node address fails the self-check and takes interception off
// for every pod of the node, and one unanswered packet is no evidence
// against another pod.
func TestPodPathSpoofedKernel(t *testing.T) {
	inKernelNode(t, func(n *kernelNode) {
		a, d, vip := newPodPathKernelAgent(t, n, DetectLocalNone)
		// Given another pod of this node behind a veth of its own, strict
		// reverse-path filtering as CNIs set it on pod interfaces, and the
		// sender and that pod known to the agent as pods of this node,
		victim := netip.MustParsePrefix("10.201.0.2/24")
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kac-victim"}, PeerName: "kac-victim-p"}
		mustDo(t, n.h.LinkAdd(veth))
		for _, name := range []string{"kac-victim", "kac-victim-p"} {
			link, err := n.h.LinkByName(name)
			mustDo(t, err)
			mustDo(t, n.h.LinkSetUp(link))
		}
		link, err := n.h.LinkByName("kac-victim")
		mustDo(t, err)
		mustDo(t, n.h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixNet(victim.Masked())}))
		// The test goroutine's thread is in the node namespace: these
		// sysctls are the node namespace's.
		for _, iface := range []string{"all", "kac-node"} {
			mustDo(t, os.WriteFile("/proc/sys/net/ipv4/conf/"+iface+"/rp_filter", []byte("1"), 0o644))
		}
		a.icpt.local.set("default/sender", []netip.Addr{podVeth4.Addr()}, false)
		a.icpt.local.set("default/victim", []netip.Addr{victim.Addr()}, false)
		node := nodeVeth4.Addr()
		scan := func(times int) {
			<-inNodeNS(t, n, func() {
				for range times {
					a.icpt.scanPodPath(klog.Background())
					time.Sleep(a.cfg.PodPathCheckInterval)
				}
			})
		}

		// when the pod sends one SYN to the VIP with the node's address as
		// its source and one with the other pod's, the redirect records
		// both,
		spoofed := []netip.AddrPort{netip.AddrPortFrom(node, 40404), netip.AddrPortFrom(victim.Addr(), 40405)}
		for _, src := range spoofed {
			mustDo(t, sendSYN(n.podNS, src, vip))
		}
		deadline := time.Now().Add(2 * time.Second)
		for {
			attempts, err := d.seen.Entries()
			mustDo(t, err)
			if len(attempts) == len(spoofed) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("attempts recorded = %v, want the spoofed SYNs %v", attempts, spoofed)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// and the check scans for longer than it takes to judge them,
		scan(8)

		// then no skip set entry for the node's address or the other pod
		// exists, and the node's own connection (the self-check's path)
		// still reaches the agent.
		skipped, err := d.skip.Entries()
		mustDo(t, err)
		changed := 0
		for _, ip := range skipped {
			if ip == node || ip == victim.Addr() {
				changed++
			}
		}
		t.Logf("skip set entries for the node's address or another pod after one spoofed SYN each: %d (want 0); skip set %v", changed, skipped)
		if changed != 0 {
			t.Errorf("a spoofed SYN changed the skip set: %v", skipped)
		}
		mustDo(t, d.refresh())
		if got, err := dialFrom(n.nodeNS, vip); err != nil || got != "agent" {
			t.Errorf("the node reaches %q (%v), want the agent", got, err)
		}

		// When the spoofer sends both again, as a blocked client retries
		// its SYN, the node's address still never goes to kube-proxy's
		// path, while the other pod now does: that is the bound, the path
		// it would take without the agent.
		for _, src := range spoofed {
			mustDo(t, sendSYN(n.podNS, src, vip))
		}
		scan(8)
		skipped, err = d.skip.Entries()
		mustDo(t, err)
		if len(skipped) != 1 || skipped[0] != victim.Addr() {
			t.Errorf("skip set after the spoofer repeated = %v, want only the other pod %s", skipped, victim.Addr())
		}
		for _, o := range []struct {
			outcome string
			want    float64
		}{{unansweredNodeAddress, 2}, {unansweredCounted, 2}} {
			if got := testutil.ToFloat64(a.icpt.podPath.unanswered.WithLabelValues("IPv4", o.outcome)); got != o.want {
				t.Errorf("unanswered attempts %s = %v, want %v", o.outcome, got, o.want)
			}
		}
		t.Logf("after the spoofer repeated: skip set %v; the node still reaches the agent", skipped)
		mustDo(t, d.refresh())
		if got, err := dialFrom(n.nodeNS, vip); err != nil || got != "agent" {
			t.Errorf("after the spoofer repeated, the node reaches %q (%v), want the agent", got, err)
		}
	})
}

// newPodPathKernelAgent builds, in n's node namespace, an agent whose
// IPv4 redirect is in place (detect-local mode) with the pod-path check
// over the kernel's conntrack, kube-proxy's DNAT of the VIP to an
// "apiserver" on the node, and the agent's listener. It returns the
// agent, its dataplane and the VIP.
func newPodPathKernelAgent(t *testing.T, n *kernelNode, mode string) (*testAgent, *dataplane, netip.AddrPort) {
	t.Helper()
	cfg := dataplaneConfig()
	cfg.DetectLocalMode = mode
	cfg.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
	cfg.ListenAddress = netip.MustParseAddrPort(DefaultListenAddress)
	cfg.PodPathCheckInterval, cfg.BypassDuration = 100*time.Millisecond, time.Minute
	// The liveness entry must outlive the steps between its refresh and
	// the dials after it on a loaded machine; its expiry is not what
	// these tests check.
	cfg.LivenessTimeout = time.Minute
	k := Kernel{
		IPTables:  func(f netrules.Family) (netrules.IPTables, error) { return netrules.OpenIPTables(n.backend, f) },
		Netlink:   n.h,
		IPSet:     n.h,
		Conntrack: netrules.KernelConntrack{},
	}
	planes, err := newDataplanes(cfg, DataplaneIPTables, k)
	mustDo(t, err)
	d := planes[0]
	a := &testAgent{cfg: cfg, icpt: &Interceptor{cfg: cfg, planes: planes, now: time.Now, local: newLocalPods(),
		podPath: newPodPath(k.Conntrack, prometheus.NewRegistry())}}

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
	l, err = listenFreebind(d.listen.String())
	mustDo(t, err)
	serveBanner(t, l, "agent")
	_, err = d.addr.Sync()
	mustDo(t, err)
	match, err := a.icpt.localMatch(d.family)
	mustDo(t, err)
	d.setLocal(match)
	_, _, err = d.sync()
	mustDo(t, err)
	mustDo(t, d.refresh())
	d.active = true
	return a, d, netip.AddrPortFrom(d.vips[0], cfg.ServicePort)
}

// sendSYN sends one TCP SYN from namespace ns to dst through a raw socket
// that writes its own IP header, so its source src may be anyone's, as a
// pod with CAP_NET_RAW can.
func sendSYN(ns netns.NsHandle, src, dst netip.AddrPort) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		errc <- unix.Sendto(fd, synPacket(src, dst), 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
	}()
	return <-errc
}

// synPacket is an IPv4 TCP SYN from src to dst, with a correct TCP
// checksum (conntrack does not track a packet whose checksum is wrong);
// the kernel fills in the IP header's length and checksum.
func synPacket(src, dst netip.AddrPort) []byte {
	s, d := src.Addr().As4(), dst.Addr().As4()
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1) // sequence number
	tcp[12] = 5 << 4                       // header length: five words
	tcp[13] = 0x02                         // SYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, unix.IPPROTO_TCP, 0, byte(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], inetChecksum(append(pseudo, tcp...)))
	ip := make([]byte, 20)
	ip[0] = 4<<4 | 5 // version 4, five words
	ip[8] = 64       // TTL
	ip[9] = unix.IPPROTO_TCP
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	return append(ip, tcp...)
}

// inetChecksum is the Internet checksum (RFC 1071) of b.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
