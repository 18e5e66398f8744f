package interception

import (
	"net/netip"
	"slices"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// ForgetFlows deletes the flows to the listen addresses, of both families,
// but for those of connections the server holds; with no filter, all of
// them; never the flows kube-proxy's path NATed; and none while a
// redirect (a successor's) is in place.
func TestForgetFlows(t *testing.T) {
	k := newFakeKernel(t)
	cfg := dataplaneConfig()
	planes, err := newDataplanes(cfg, DataplaneIPTables, k.kernel())
	mustDo(t, err)
	ic := &Interceptor{cfg: cfg, planes: planes, conntrack: k.ct}

	vip4, vip6 := netip.MustParseAddrPort("10.96.0.1:443"), netip.MustParseAddrPort("[fd00:10:96::1]:443")
	listen4, listen6 := netip.MustParseAddrPort(DefaultListenAddress), netip.MustParseAddrPort(DefaultListenAddressIPv6)
	open := netip.MustParseAddrPort("10.244.1.5:40000")
	flows := []netrules.Flow{
		// The server sees the client at ReplyDst, which conntrack may
		// have given another port.
		{Src: netip.MustParseAddrPort("10.244.1.5:39999"), Dst: vip4, ReplySrc: listen4, ReplyDst: open, SeenReply: true, State: 3},
		// A connection being opened: not accepted yet.
		{Src: netip.MustParseAddrPort("10.244.1.5:40010"), Dst: vip4, ReplySrc: listen4, State: netrules.TCPSynRecv},
		{Src: netip.MustParseAddrPort("10.244.1.5:40002"), Dst: vip4, ReplySrc: listen4, SeenReply: true, State: netrules.TCPClose},
		{Src: netip.MustParseAddrPort("10.244.1.5:40004"), Dst: vip4, ReplySrc: listen4, SeenReply: true, State: 3},
		{Src: netip.MustParseAddrPort("10.244.1.6:40006"), Dst: vip4, ReplySrc: netip.MustParseAddrPort("10.250.0.2:6443"), SeenReply: true, State: netrules.TCPClose},
		{Src: netip.MustParseAddrPort("[fd00:244::5]:40008"), Dst: vip6, ReplySrc: listen6, SeenReply: true, State: netrules.TCPTimeWait},
	}
	for _, f := range flows {
		k.ct.Add(f)
	}
	srcs := func(fs []netrules.Flow) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Src.String())
		}
		slices.Sort(out)
		return out
	}
	left := func() []string {
		var all []netrules.Flow
		for _, dst := range []netip.AddrPort{vip4, vip6} {
			fs, err := k.ct.Flows(netrules.FamilyOf(dst.Addr()), dst)
			mustDo(t, err)
			all = append(all, fs...)
		}
		return srcs(all)
	}

	ic.ForgetFlows(klog.Background(), func(src netip.AddrPort) bool { return src == open })
	if got, want := left(), []string{"10.244.1.5:39999", "10.244.1.5:40010", "10.244.1.6:40006"}; !slices.Equal(got, want) {
		t.Errorf("before the listener closes, flows left from %v, want %v (the open connection's, the one being opened and kube-proxy's)", got, want)
	}

	ic.ForgetFlows(klog.Background(), nil)
	if got, want := left(), []string{"10.244.1.6:40006"}; !slices.Equal(got, want) {
		t.Errorf("after the server stopped, flows left from %v, want %v (kube-proxy's)", got, want)
	}

	// A successor's redirect in place: its connections' flows stay.
	for _, d := range planes {
		_, _, err := d.sync()
		mustDo(t, err)
	}
	k.ct.Add(flows[3])
	deleted := len(k.ct.Deleted)
	ic.ForgetFlows(klog.Background(), nil)
	if len(k.ct.Deleted) != deleted {
		t.Errorf("with a redirect in place, deleted %v", srcs(k.ct.Deleted[deleted:]))
	}
}
