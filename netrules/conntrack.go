package netrules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Flow is one TCP connection as conntrack tracks it: the tuple of its first
// packet (Src → Dst) and where replies come from (ReplySrc: the DNAT target
// of a DNATed connection) and go to (ReplyDst: Src, unless conntrack
// changed the source port to keep two reply tuples apart; what the server
// sees as its peer), and whether a reply was ever seen.
type Flow struct {
	Src, Dst           netip.AddrPort
	ReplySrc, ReplyDst netip.AddrPort
	SeenReply          bool
	// State is conntrack's TCP state of the flow.
	State TCPState
}

// TCPState is conntrack's state of a TCP flow (enum tcp_conntrack in
// linux/netfilter/nf_conntrack_tcp.h).
type TCPState uint8

// TCP states: a connection's handshake under way, and the states a flow
// of an ended connection is left in, after FINs (TIME_WAIT) or a reset
// (CLOSE).
const (
	TCPSynSent  TCPState = 1
	TCPSynRecv  TCPState = 2
	TCPTimeWait TCPState = 7
	TCPClose    TCPState = 8
	TCPSynSent2 TCPState = 9
)

// Handshaking reports whether the flow's connection is being opened.
func (f Flow) Handshaking() bool {
	return f.State == TCPSynSent || f.State == TCPSynRecv || f.State == TCPSynSent2
}

// Conntrack lists and deletes TCP flows to one destination.
type Conntrack interface {
	// Flows returns the TCP flows of family whose original destination is
	// dst.
	Flows(family Family, dst netip.AddrPort) ([]Flow, error)
	// Delete removes the flow whose original tuple is f's, so that the
	// connection's next packet is NATed afresh. A flow that is gone is
	// not an error.
	Delete(family Family, f Flow) error
}

// Netfilter's conntrack netlink attributes this file uses
// (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleIP          = 1
	ctaTupleProto       = 2
	ctaIPv4Src          = 1
	ctaIPv4Dst          = 2
	ctaIPv6Src          = 3
	ctaIPv6Dst          = 4
	ctaProtoNum         = 1
	ctaProtoSrcPort     = 2
	ctaProtoDstPort     = 3
	ctaFilter           = 25
	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2
	// Fields CTA_FILTER compares (CTA_FILTER_FLAG_*).
	ctaFilterIPDst    = 1 << 1
	ctaFilterProtoNum = 1 << 3
	ctaFilterDstPort  = 1 << 5
	// ipsSeenReply is IPS_SEEN_REPLY of CTA_STATUS.
	ipsSeenReply = 1 << 1
	// CTA_PROTOINFO, its nested CTA_PROTOINFO_TCP, and in that the state.
	ctaProtoinfo         = 4
	ctaProtoinfoTCP      = 1
	ctaProtoinfoTCPState = 1
)

// KernelConntrack is Conntrack over ctnetlink in the caller's network
// namespace. Flows asks the kernel to filter the dump by destination
// (CTA_FILTER, Linux 5.9 and later), so its cost does not grow with the
// node's other connections; on older kernels, which ignore the filter, it
// filters the whole table itself.
type KernelConntrack struct{}

var _ Conntrack = KernelConntrack{}

// tupleAttr builds a CTA_TUPLE_* attribute for TCP from src to dst; an
// invalid src leaves the source out.
func tupleAttr(typ int, family Family, src, dst netip.AddrPort) *nl.RtAttr {
	tuple := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
	ip := tuple.AddRtAttr(ctaTupleIP|int(nl.NLA_F_NESTED), nil)
	srcType, dstType := ctaIPv4Src, ctaIPv4Dst
	if family == IPv6 {
		srcType, dstType = ctaIPv6Src, ctaIPv6Dst
	}
	if src.IsValid() {
		ip.AddRtAttr(srcType, src.Addr().AsSlice())
	}
	ip.AddRtAttr(dstType, dst.Addr().AsSlice())
	proto := tuple.AddRtAttr(ctaTupleProto|int(nl.NLA_F_NESTED), nil)
	proto.AddRtAttr(ctaProtoNum, []byte{unix.IPPROTO_TCP})
	if src.IsValid() {
		proto.AddRtAttr(ctaProtoSrcPort, binary.BigEndian.AppendUint16(nil, src.Port()))
	}
	proto.AddRtAttr(ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, dst.Port()))
	return tuple
}

func conntrackRequest(family Family, op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(family), Version: nl.NFNETLINK_V0})
	return req
}

// Flows implements Conntrack.
func (KernelConntrack) Flows(family Family, dst netip.AddrPort) ([]Flow, error) {
	req := conntrackRequest(family, nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	req.AddData(tupleAttr(nl.CTA_TUPLE_ORIG, family, netip.AddrPort{}, dst))
	filter := nl.NewRtAttr(ctaFilter|int(nl.NLA_F_NESTED), nil)
	filter.AddRtAttr(ctaFilterOrigFlags, binary.NativeEndian.AppendUint32(nil, ctaFilterIPDst|ctaFilterProtoNum|ctaFilterDstPort))
	filter.AddRtAttr(ctaFilterReplyFlags, binary.NativeEndian.AppendUint32(nil, 0))
	req.AddData(filter)
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("listing conntrack flows to %s: %w", dst, err)
	}
	var out []Flow
	for _, m := range msgs {
		f, ok := parseFlow(m)
		if ok && f.Dst == dst {
			out = append(out, f)
		}
	}
	return out, nil
}

// Delete implements Conntrack.
func (KernelConntrack) Delete(family Family, f Flow) error {
	req := conntrackRequest(family, nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.AddData(tupleAttr(nl.CTA_TUPLE_ORIG, family, f.Src, f.Dst))
	if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting conntrack flow %s -> %s: %w", f.Src, f.Dst, err)
	}
	return nil
}

// parseFlow reads a ctnetlink message (nfgenmsg, then attributes); ok is
// false for anything but a TCP flow.
func parseFlow(msg []byte) (Flow, bool) {
	if len(msg) < nl.SizeofNfgenmsg {
		return Flow{}, false
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return Flow{}, false
	}
	var f Flow
	okOrig, okReply := false, false
	for _, a := range attrs {
		switch a.Attr.Type & nl.NLA_TYPE_MASK {
		case nl.CTA_TUPLE_ORIG:
			f.Src, f.Dst, okOrig = parseTuple(a.Value)
		case nl.CTA_TUPLE_REPLY:
			f.ReplySrc, f.ReplyDst, okReply = parseTuple(a.Value)
		case nl.CTA_STATUS:
			if len(a.Value) == 4 {
				f.SeenReply = binary.BigEndian.Uint32(a.Value)&ipsSeenReply != 0
			}
		case ctaProtoinfo:
			f.State = parseTCPState(a.Value)
		}
	}
	return f, okOrig && okReply
}

// parseTCPState reads the state out of a CTA_PROTOINFO attribute; 0 (no
// state) if it holds none.
func parseTCPState(b []byte) TCPState {
	infos, err := nl.ParseRouteAttr(b)
	if err != nil {
		return 0
	}
	for _, info := range infos {
		if info.Attr.Type&nl.NLA_TYPE_MASK != ctaProtoinfoTCP {
			continue
		}
		tcp, err := nl.ParseRouteAttr(info.Value)
		if err != nil {
			return 0
		}
		for _, a := range tcp {
			if a.Attr.Type&nl.NLA_TYPE_MASK == ctaProtoinfoTCPState && len(a.Value) == 1 {
				return TCPState(a.Value[0])
			}
		}
	}
	return 0
}

// parseTuple reads a CTA_TUPLE_* attribute of a TCP flow.
func parseTuple(b []byte) (src, dst netip.AddrPort, ok bool) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return src, dst, false
	}
	var srcIP, dstIP netip.Addr
	var srcPort, dstPort uint16
	tcp := false
	for _, a := range attrs {
		switch a.Attr.Type & nl.NLA_TYPE_MASK {
		case ctaTupleIP:
			ips, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return src, dst, false
			}
			for _, ip := range ips {
				addr, _ := netip.AddrFromSlice(ip.Value)
				switch ip.Attr.Type & nl.NLA_TYPE_MASK {
				case ctaIPv4Src, ctaIPv6Src:
					srcIP = addr
				case ctaIPv4Dst, ctaIPv6Dst:
					dstIP = addr
				}
			}
		case ctaTupleProto:
			ps, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return src, dst, false
			}
			for _, p := range ps {
				switch p.Attr.Type & nl.NLA_TYPE_MASK {
				case ctaProtoNum:
					tcp = len(p.Value) == 1 && p.Value[0] == unix.IPPROTO_TCP
				case ctaProtoSrcPort:
					srcPort = be16(p)
				case ctaProtoDstPort:
					dstPort = be16(p)
				}
			}
		}
	}
	if !tcp || !srcIP.IsValid() || !dstIP.IsValid() {
		return src, dst, false
	}
	return netip.AddrPortFrom(srcIP.Unmap(), srcPort), netip.AddrPortFrom(dstIP.Unmap(), dstPort), true
}

func be16(a syscall.NetlinkRouteAttr) uint16 {
	if len(a.Value) != 2 {
		return 0
	}
	return binary.BigEndian.Uint16(a.Value)
}
