package interception

import (
	"net/netip"
	"time"

	"k8s.io/klog/v2"
)

// The flows a redirect leaves behind.
//
// Conntrack decides a connection's NAT once, on its first packet, and
// keeps the decision in the connection's flow until the flow times out,
// well after the connection ended: 10 s in CLOSE, 2 minutes in TIME_WAIT,
// days in ESTABLISHED. A new connection from the same client address and
// port (clients reuse ports within seconds) is tracked afresh only if the
// old one ended with a FIN, or with a reset from the client; otherwise
// its SYN takes the old flow over, NAT included. Go's TLS server resets
// each connection of a Connection: close request without a FIN (the
// client's close_notify is left unread), and some of those resets do not
// fit conntrack's window, which leaves the flow ESTABLISHED: in a run of
// 100 such requests here, 98 flows ended in CLOSE and 2 in ESTABLISHED.
//
// So removing the redirect does not send every new connection to
// kube-proxy's path: one whose port an earlier redirected connection used
// still goes to the agent's listen address, and once the listener is
// closed it is refused (ECONNREFUSED: the address is still there). A pod
// opening a connection per request saw that during a rollout of the
// DaemonSet. At shutdown the agent therefore deletes, once the redirect
// is gone and before it closes its listener, every flow to the listen
// address that none of its open connections owns, then, while it drains,
// those of the connections that end, and, once it serves nothing any
// more, the rest, before it gives the address up.

// forgetBudget bounds a pass of ForgetFlows: the flows are many only when
// clients opened many connections, and shutdown has a grace period to
// keep.
const forgetBudget = 2 * time.Second

// ForgetFlows deletes the flows from the Service VIPs to the listen
// addresses whose client address and port, as the server sees it, held
// does not report, and which are not being opened (a connection not
// accepted yet); with held nil, all of them. New connections reusing
// those ports are then NATed afresh. A pass stops after forgetBudget.
// It is meant for shutdown, once the redirect is gone, and does nothing
// with the external dataplane (the redirect is not the agent's), without
// conntrack, or for a family whose redirect is in place again (a
// successor's, whose connections the flows are). Failures are logged: at
// worst a connection from a reused port is refused, as without this.
func (ic *Interceptor) ForgetFlows(logger klog.Logger, held func(netip.AddrPort) bool) {
	if ic.conntrack == nil || ic.cfg.external() {
		return
	}
	start := time.Now()
	deleted, kept := 0, 0
	for _, d := range ic.planes {
		if present, err := d.rules.present(); err != nil || present {
			// A successor's redirect: the flows to the listen address
			// are its connections now.
			logger.V(2).Info("A redirect is in place; leaving the flows to its listener", "family", d.family, "err", err)
			continue
		}
		for _, vip := range d.vips {
			dst := netip.AddrPortFrom(vip, ic.cfg.ServicePort)
			flows, err := ic.conntrack.Flows(d.family, dst)
			if err != nil {
				logger.Error(err, "Listing the flows the redirect left", "vip", dst)
				continue
			}
			for _, f := range flows {
				if f.ReplySrc != d.listen {
					continue // kube-proxy's path
				}
				if held != nil && (f.Handshaking() || held(f.ReplyDst)) {
					kept++
					continue
				}
				if time.Since(start) > forgetBudget {
					logger.Info("Stopped deleting the flows the redirect left: out of time", "budget", forgetBudget, "deleted", deleted)
					return
				}
				if err := ic.conntrack.Delete(d.family, f); err != nil {
					logger.Error(err, "Deleting a flow the redirect left", "flow", f.Src.String()+" -> "+f.Dst.String())
					continue
				}
				deleted++
			}
		}
	}
	log := logger.V(2)
	if deleted > 0 {
		log = logger.V(0)
	}
	log.Info("Deleted the conntrack flows the redirect left", "deleted", deleted, "kept", kept, "final", held == nil)
}
