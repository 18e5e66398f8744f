package netrules_test

import (
	"net"
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
