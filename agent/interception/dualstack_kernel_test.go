package interception

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kube-apicache/kube-apicache/netrules"
	"github.com/kube-apicache/kube-apicache/netrules/netnstest"
)

// kernelNode is a fresh network namespace standing for a node, with a
// second one standing for a pod behind a veth pair, both deleted when the
// test ends. The test goroutine's thread stays in the node namespace while
// the test runs.
type kernelNode struct {
	h       *netlink.Handle
	nodeNS  netns.NsHandle
	podNS   netns.NsHandle
	backend netrules.Backend
}

// Addresses of the test namespaces.
var (
	nodeVeth4 = netip.MustParsePrefix("10.200.0.1/24")
	podVeth4  = netip.MustParsePrefix("10.200.0.2/24")
	nodeVeth6 = netip.MustParsePrefix("fd00:200::1/64")
	podVeth6  = netip.MustParsePrefix("fd00:200::2/64")
)

// inKernelNode runs fn on a locked OS thread inside a fresh node namespace
// (loopback up, a veth to a fresh pod namespace, default routes per family
// both ways). Nothing reaches the machine's own namespace.
// Without root the test is skipped, except under CI=true, where it fails.
func inKernelNode(t *testing.T, fn func(n *kernelNode)) {
	t.Helper()
	netnstest.Run(t, 2, func(nss []netns.NsHandle, hs []*netlink.Handle) {
		setUpKernelNode(t, &kernelNode{podNS: nss[0], nodeNS: nss[1], h: hs[1]}, hs[0], fn)
	})
}

// setUpKernelNode connects the pod namespace (handle ph) to the node
// namespace with a veth pair and routes, picks a working iptables backend
// and runs fn.
func setUpKernelNode(t *testing.T, n *kernelNode, ph *netlink.Handle, fn func(n *kernelNode)) {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kac-node"}, PeerName: "kac-pod", PeerNamespace: netlink.NsFd(int(n.podNS))}
	mustDo(t, n.h.LinkAdd(veth))
	nodeLink, err := n.h.LinkByName("kac-node")
	mustDo(t, err)
	podLink, err := ph.LinkByName("kac-pod")
	mustDo(t, err)
	for _, x := range []struct {
		h    *netlink.Handle
		link netlink.Link
		ips  []netip.Prefix
	}{{n.h, nodeLink, []netip.Prefix{nodeVeth4, nodeVeth6}}, {ph, podLink, []netip.Prefix{podVeth4, podVeth6}}} {
		for _, p := range x.ips {
			// No duplicate address detection: the addresses are usable at once.
			mustDo(t, x.h.AddrAdd(x.link, &netlink.Addr{IPNet: prefixNet(p), Flags: unix.IFA_F_NODAD}))
		}
		mustDo(t, x.h.LinkSetUp(x.link))
	}
	for _, gw := range []netip.Prefix{nodeVeth4, nodeVeth6} {
		mustDo(t, ph.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: gw.Addr().AsSlice()}))
	}
	// The node has a default route too, as real nodes do: a host-network
	// connection to a VIP needs a route before nat OUTPUT rewrites it.
	for _, gw := range []netip.Prefix{podVeth4, podVeth6} {
		mustDo(t, n.h.RouteAdd(&netlink.Route{LinkIndex: nodeLink.Attrs().Index, Gw: gw.Addr().AsSlice()}))
	}
	for _, b := range []netrules.Backend{netrules.BackendNFT, netrules.BackendLegacy} {
		ok := true
		for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
			ipt, err := netrules.OpenIPTables(b, f)
			if err == nil {
				_, err = ipt.List("nat", "PREROUTING")
			}
			ok = ok && err == nil
		}
		if ok {
			n.backend = b
			break
		}
	}
	if n.backend == "" {
		t.Skip("neither iptables backend works for both families here")
	}
	fn(n)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// dialFrom connects to addr from namespace ns (on a thread of its own that
// never returns to the scheduler) and returns the first line the server
// sends, giving up after two seconds.
func dialFrom(ns netns.NsHandle, addr netip.AddrPort) (string, error) {
	return dialFromWithin(ns, addr, 2*time.Second)
}

// dialFromWithin is dialFrom giving up after timeout.
func dialFromWithin(ns netns.NsHandle, addr netip.AddrPort, timeout time.Duration) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread ends with this goroutine; it is never unlocked.
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr.String())
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		ch <- result{strings.TrimSpace(line), err}
	}()
	r := <-ch
	return r.line, r.err
}

// serveBanner accepts connections on l (already bound) and writes banner to
// each, until the test ends.
func serveBanner(t *testing.T, l net.Listener, banner string) {
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(banner + "\n"))
			_ = c.Close()
		}
	}()
}

// TestDualStackKernel runs the dual-stack redirect against the real kernel
// in test namespaces: iptables and ip6tables of one backend, an inet and an
// inet6 liveness set, and the listen addresses. A TCP connection to each
// family's VIP, from the pod namespace (PREROUTING) and from the node
// itself (OUTPUT), lands on the agent's listener of that family while the
// liveness entry lives, and on kube-proxy's destination once it is gone.
func TestDualStackKernel(t *testing.T) {
	inKernelNode(t, func(n *kernelNode) {
		cfg := dataplaneConfig()
		cfg.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")}
		cfg.ListenAddress = netip.MustParseAddrPort(DefaultListenAddress)
		cfg.ListenAddressIPv6 = netip.MustParseAddrPort(DefaultListenAddressIPv6)
		// Expiry is not what this test checks: a one-second entry can
		// expire between one refresh and the dials after it on a loaded
		// machine, and take a family to kube-proxy's path.
		cfg.LivenessTimeout = time.Minute
		k := Kernel{
			IPTables: func(f netrules.Family) (netrules.IPTables, error) { return netrules.OpenIPTables(n.backend, f) },
			Backend:  string(n.backend),
			Netlink:  n.h,
			IPSet:    n.h,
		}
		planes, err := newDataplanes(cfg, DataplaneIPTables, k)
		mustDo(t, err)
		if len(planes) != 2 || planes[1].family != netrules.IPv6 {
			t.Fatalf("got %d dataplanes, want IPv4 and IPv6", len(planes))
		}
		// What the test leaves goes with the namespace; nothing is
		// cleaned up from t.Cleanup, which runs outside the namespace.

		// Given kube-proxy's DNAT of each VIP to an "apiserver" address on
		// the node, and the agent's listeners bound before their addresses
		// exist (as Run does).
		apiserver := map[netrules.Family]netip.AddrPort{
			netrules.IPv4: netip.MustParseAddrPort("10.250.0.2:6443"),
			netrules.IPv6: netip.MustParseAddrPort("[fd00:250::2]:6443"),
		}
		lo, err := n.h.LinkByName("lo")
		mustDo(t, err)
		for _, d := range planes {
			ep := apiserver[d.family]
			// No duplicate address detection: bind at once.
			mustDo(t, n.h.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ep.Addr(), ep.Addr().BitLen())), Flags: unix.IFA_F_NODAD}))
			l, err := net.Listen("tcp", ep.String())
			mustDo(t, err)
			serveBanner(t, l, "apiserver")
			ipt, err := k.IPTables(d.family)
			mustDo(t, err)
			mustDo(t, ipt.NewChain("nat", "KUBE-SERVICES"))
			vip := d.vips[0]
			mustDo(t, ipt.Append("nat", "KUBE-SERVICES", "-d", netip.PrefixFrom(vip, vip.BitLen()).String(), "-p", "tcp", "-m", "tcp",
				"--dport", "443", "-j", "DNAT", "--to-destination", ep.String()))
			for _, hook := range []string{"PREROUTING", "OUTPUT"} {
				mustDo(t, ipt.Append("nat", hook, "-j", "KUBE-SERVICES"))
			}
			l, err = listenFreebind(d.listen.String())
			mustDo(t, err)
			serveBanner(t, l, "agent "+familyName(d.family))
		}
		dst := func(d *dataplane) netip.AddrPort { return netip.AddrPortFrom(d.vips[0], cfg.ServicePort) }
		expect := func(step string, want map[netrules.Family]string) {
			t.Helper()
			for _, d := range planes {
				for _, from := range []struct {
					name string
					ns   netns.NsHandle
				}{{"pod", n.podNS}, {"node", n.nodeNS}} {
					got, err := dialFrom(from.ns, dst(d))
					if err != nil || got != want[d.family] {
						t.Errorf("%s: %s connection from the %s to %s: %q, %v; want %q", step, familyName(d.family), from.name, dst(d), got, err, want[d.family])
					}
				}
			}
		}
		kubeProxy := map[netrules.Family]string{netrules.IPv4: "apiserver", netrules.IPv6: "apiserver"}
		expect("kube-proxy only", kubeProxy)

		// When the dataplanes sync (address, set, chain, jumps) and refresh,
		// then each VIP lands on the agent's listener of its family.
		for _, d := range planes {
			_, err := d.addr.Sync()
			mustDo(t, err)
			_, res, err := d.sync()
			mustDo(t, err)
			if !res.Changed() {
				t.Errorf("%s: first sync changed nothing", d.family)
			}
		}
		expect("synced, no entries yet", kubeProxy)
		for _, d := range planes {
			mustDo(t, d.refresh())
		}
		expect("intercepting", map[netrules.Family]string{netrules.IPv4: "agent IPv4", netrules.IPv6: "agent IPv6"})

		// A second sync finds everything in place: the rules as the kernel
		// lists them (the bracketed IPv6 DNAT target included) are the
		// rules the agent wants.
		for _, d := range planes {
			setCreated, res, err := d.sync()
			if err != nil || setCreated || res.Changed() {
				t.Errorf("%s: second sync = %v, %+v, %v; want no change", d.family, setCreated, res, err)
			}
			if added, err := d.addr.Sync(); err != nil || added {
				t.Errorf("%s: second address sync = %v, %v; want no change", d.family, added, err)
			}
		}

		// When only the IPv6 entry goes (its listener failed), then IPv6
		// falls back to kube-proxy's path and IPv4 stays with the agent.
		mustDo(t, planes[1].clear())
		expect("IPv6 entry cleared", map[netrules.Family]string{netrules.IPv4: "agent IPv4", netrules.IPv6: "apiserver"})

		// When the agent removes everything, then both families go to
		// kube-proxy's path, and no chain, set or address of the agent is
		// left.
		for _, d := range planes {
			mustDo(t, d.remove())
		}
		for _, d := range planes {
			mustDo(t, d.addr.Remove())
		}
		expect("removed", kubeProxy)
		for _, d := range planes {
			if present, err := d.rules.present(); err != nil || present {
				t.Errorf("%s: chain present after removal: %v, %v", d.family, present, err)
			}
			if _, err := d.set.Entries(); !netrules.IsSetNotExist(err) {
				t.Errorf("%s: set after removal: %v, want it gone", d.family, err)
			}
		}
		addrs, err := n.h.AddrList(nil, netlink.FAMILY_ALL)
		mustDo(t, err)
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP)
			if ip.Unmap() == cfg.ListenAddress.Addr() || ip == cfg.ListenAddressIPv6.Addr() {
				t.Errorf("listen address %s left on the node", ip)
			}
		}
	})
}

// listenFreebind listens on addr before the address exists on the node,
// as the agent's listener does (IP_FREEBIND).
func listenFreebind(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
