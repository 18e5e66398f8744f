package netrules_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// TestConntrackKernel checks KernelConntrack against the real kernel: a
// connection to a VIP DNATed to a listener whose packets INPUT drops shows
// as a flow with no reply, from the VIP's point of view; deleting it lets
// the next attempt be NATed afresh; an answered connection shows a reply.
func TestConntrackKernel(t *testing.T) {
	inNewNetNS(t, func(h *netlink.Handle) {
		ipt, err := netrules.OpenIPTables(netrules.BackendNFT, netrules.IPv4)
		if err != nil {
			t.Skipf("no nft backend: %v", err)
		}
		lo, err := h.LinkByName("lo")
		must(t, err)
		must(t, h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(24, 32)}, Scope: netlink.SCOPE_LINK}))
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		listen := netip.MustParseAddrPort("127.0.0.1:" + port)
		vip := netip.MustParseAddrPort("10.96.0.1:443")
		must(t, ipt.Append("nat", "OUTPUT", "-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", listen.String()))
		drop := []string{"-p", "tcp", "--dport", port, "-j", "DROP"}
		must(t, ipt.Append("filter", "INPUT", drop...))
		ct := netrules.KernelConntrack{}

		// A blocked connection: DNATed to the listener, never answered.
		if c, err := net.DialTimeout("tcp4", vip.String(), 300*time.Millisecond); err == nil {
			c.Close()
			t.Fatal("connection through the DROP rule succeeded")
		}
		flows, err := ct.Flows(netrules.IPv4, vip)
		must(t, err)
		if len(flows) != 1 || flows[0].ReplySrc != listen || flows[0].SeenReply || flows[0].Dst != vip {
			t.Fatalf("flows to the VIP = %+v, want one unanswered flow DNATed to %s", flows, listen)
		}
		// Flows to other destinations are not listed.
		if other, err := ct.Flows(netrules.IPv4, netip.MustParseAddrPort("10.96.0.2:443")); err != nil || len(other) != 0 {
			t.Errorf("flows to another VIP = %+v, %v", other, err)
		}
		must(t, ct.Delete(netrules.IPv4, flows[0]))
		must(t, ct.Delete(netrules.IPv4, flows[0])) // gone: not an error
		if flows, err := ct.Flows(netrules.IPv4, vip); err != nil || len(flows) != 0 {
			t.Errorf("flows after delete = %+v, %v", flows, err)
		}

		// An answered connection.
		must(t, ipt.Delete("filter", "INPUT", drop...))
		c, err := net.DialTimeout("tcp4", vip.String(), time.Second)
		must(t, err)
		c.Close()
		flows, err = ct.Flows(netrules.IPv4, vip)
		must(t, err)
		if len(flows) != 1 || !flows[0].SeenReply || flows[0].ReplySrc != listen {
			t.Errorf("flows after an answered connection = %+v", flows)
		}
	})
}

// TestConntrackClosedFlowsTakenOver checks, against the real kernel, the
// hazard the agent's shutdown clears (interception.ForgetFlows) and its
// remedy. Requests with Connection:
// close to a Go TLS server behind a DNAT of the VIP leave flows that keep
// their NAT mapping after the connections ended: CLOSE, or ESTABLISHED
// when the server's reset did not fit conntrack's window. Once the DNAT
// is gone and the server closed, a new connection from such a port takes
// the flow over and is refused (1 to 4 ports of 100 in runs here); with
// the flows deleted first, every new connection from those ports is
// NATed afresh and reaches the fallback. TestConntrackResetFlowTakenOver
// is its deterministic control.
func TestConntrackClosedFlowsTakenOver(t *testing.T) {
	inNewNetNS(t, func(h *netlink.Handle) {
		ipt, err := netrules.OpenIPTables(netrules.BackendNFT, netrules.IPv4)
		if err != nil {
			t.Skipf("no nft backend: %v", err)
		}
		lo, err := h.LinkByName("lo")
		must(t, err)
		must(t, h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(24, 32)}, Scope: netlink.SCOPE_LINK}))
		// A source address of the client's own: 127.0.0.1 would make
		// the DNATed connection one from loopback to loopback.
		must(t, h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 96, 0, 100), Mask: net.CIDRMask(32, 32)}}))
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
		srv.Listener, err = net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		srv.StartTLS()
		defer srv.Close()
		fallback, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		defer fallback.Close()
		go func() {
			for {
				c, err := fallback.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		listen := netip.MustParseAddrPort(srv.Listener.Addr().String())
		vip := netip.MustParseAddrPort("10.96.0.1:443")
		redirect := []string{"-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", listen.String()}
		must(t, ipt.Append("nat", "OUTPUT", redirect...))
		must(t, ipt.Append("nat", "OUTPUT", "-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", fallback.Addr().String()))
		// iptables-nft registers only the hooks of the chains that exist:
		// replies are translated back in nat INPUT.
		must(t, ipt.Append("nat", "INPUT", "-j", "RETURN"))
		must(t, ipt.Append("nat", "POSTROUTING", "-j", "RETURN"))

		// Each request is made on this goroutine, whose thread is in the
		// namespace: a socket is created in the namespace of the thread
		// that creates it, and http.Transport dials on goroutines of its
		// own.
		roots := x509.NewCertPool()
		roots.AddCert(srv.Certificate())
		const n = 100
		var ports []int
		for range n {
			c, err := net.DialTimeout("tcp4", vip.String(), time.Second)
			must(t, err)
			ports = append(ports, c.LocalAddr().(*net.TCPAddr).Port)
			must(t, c.SetDeadline(time.Now().Add(5*time.Second)))
			tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "example.com"}) // in httptest's certificate
			req, err := http.NewRequest(http.MethodGet, "https://"+vip.String()+"/", nil)
			must(t, err)
			req.Close = true
			must(t, req.Write(tc))
			resp, err := http.ReadResponse(bufio.NewReader(tc), req)
			must(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			tc.Close()
		}

		ct := netrules.KernelConntrack{}
		// Go's server lingers up to half a second before it closes.
		time.Sleep(700 * time.Millisecond)
		flows, err := ct.Flows(netrules.IPv4, vip)
		must(t, err)
		states := map[netrules.TCPState]int{}
		for _, f := range flows {
			if f.ReplySrc != listen || f.ReplyDst != f.Src {
				t.Fatalf("flow %+v does not lead to the server %s and back to its source", f, listen)
			}
			states[f.State]++
			must(t, ct.Delete(netrules.IPv4, f))
		}
		// Most end in CLOSE (a reset), some stay ESTABLISHED (the reset
		// did not fit conntrack's window): both would be taken over.
		t.Logf("%d flows deleted, by TCP state: %v", len(flows), states)
		if states[netrules.TCPClose]+states[netrules.TCPTimeWait] == 0 {
			t.Errorf("no closed flow among %v: the states are not read", states)
		}
		must(t, ipt.Delete("nat", "OUTPUT", redirect...))
		srv.Close()

		refused := 0
		for _, p := range ports {
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: p}, Timeout: time.Second}
			c, err := d.Dial("tcp4", vip.String())
			if err != nil {
				refused++
				t.Logf("from port %d: %v", p, err)
				continue
			}
			c.Close()
		}
		if refused > 0 {
			t.Errorf("%d of %d new connections from the ports of deleted closed flows failed", refused, n)
		}
	})
}

// TestConntrackResetFlowTakenOver is the control of
// TestConntrackClosedFlowsTakenOver, made deterministic: connections the
// server resets without a FIN (SO_LINGER 0) leave CLOSE flows whose NAT a
// new connection from the same port takes over once the DNAT is gone.
// Those whose flow was kept are refused by the closed listener, every one
// of them; those whose flow was deleted reach the fallback.
func TestConntrackResetFlowTakenOver(t *testing.T) {
	inNewNetNS(t, func(h *netlink.Handle) {
		ipt, err := netrules.OpenIPTables(netrules.BackendNFT, netrules.IPv4)
		if err != nil {
			t.Skipf("no nft backend: %v", err)
		}
		lo, err := h.LinkByName("lo")
		must(t, err)
		must(t, h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(24, 32)}, Scope: netlink.SCOPE_LINK}))
		must(t, h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 96, 0, 100), Mask: net.CIDRMask(32, 32)}}))
		resetter, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		defer resetter.Close()
		go func() {
			for {
				c, err := resetter.Accept()
				if err != nil {
					return
				}
				_, _ = c.Read(make([]byte, 1))
				_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
				c.Close()
			}
		}()
		fallback, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		defer fallback.Close()
		go func() {
			for {
				c, err := fallback.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		listen := netip.MustParseAddrPort(resetter.Addr().String())
		vip := netip.MustParseAddrPort("10.96.0.1:443")
		redirect := []string{"-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", listen.String()}
		must(t, ipt.Append("nat", "OUTPUT", redirect...))
		must(t, ipt.Append("nat", "OUTPUT", "-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", fallback.Addr().String()))
		must(t, ipt.Append("nat", "INPUT", "-j", "RETURN"))
		must(t, ipt.Append("nat", "POSTROUTING", "-j", "RETURN"))

		const n = 10
		var ports []int
		for range n {
			c, err := net.DialTimeout("tcp4", vip.String(), time.Second)
			must(t, err)
			ports = append(ports, c.LocalAddr().(*net.TCPAddr).Port)
			_, err = c.Write([]byte{0})
			must(t, err)
			must(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("the resetter answered instead of resetting")
			}
			c.Close()
		}
		ct := netrules.KernelConntrack{}
		flows, err := ct.Flows(netrules.IPv4, vip)
		must(t, err)
		if len(flows) != n {
			t.Fatalf("%d flows to the VIP, want %d: %+v", len(flows), n, flows)
		}
		// The flows of every other connection are deleted.
		deleted := map[int]bool{}
		for i, p := range ports {
			deleted[p] = i%2 == 0
		}
		for _, f := range flows {
			if f.State != netrules.TCPClose {
				t.Errorf("flow %+v of a reset connection is not in CLOSE", f)
			}
			if deleted[int(f.Src.Port())] {
				must(t, ct.Delete(netrules.IPv4, f))
			}
		}
		must(t, ipt.Delete("nat", "OUTPUT", redirect...))
		resetter.Close()

		for _, p := range ports {
			d := net.Dialer{LocalAddr: &net.TCPAddr{Port: p}, Timeout: time.Second}
			c, err := d.Dial("tcp4", vip.String())
			if err == nil {
				c.Close()
			}
			switch {
			case deleted[p] && err != nil:
				t.Errorf("from port %d, whose flow was deleted: %v", p, err)
			case !deleted[p] && err == nil:
				t.Errorf("from port %d, whose flow was kept: connected, want refused by the closed listener", p)
			}
		}
	})
}
