package interception

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// redirectChain is the agent's policy for one IP family: what its nat chain
// holds and where it is jumped from. vips are the family's Service VIPs, set
// the family's liveness set and to the local address they are sent to.
//
// PREROUTING catches pod traffic and OUTPUT host-network traffic; both jump
// here ahead of kube-proxy's KUBE-SERVICES, so the redirect wins over
// kube-proxy's own DNAT. Rules of others may sit above the jump (Calico's
// Felix keeps its own jumps at the top): only kube-proxy's must come after. In kube-proxy's IPVS mode the
// same holds: IPVS takes packets only after nat PREROUTING/OUTPUT, where
// ours is already rewritten to the local address, which IPVS does not
// balance.
//
// Packets carrying the agent's socket mark return at once (the first rule):
// the agent's own upstream connections can never be redirected back to
// itself, even if an upstream pointed at the VIP.
//
// A VIP is redirected only while the liveness set holds it. The agent
// refreshes the entry while it is healthy; if it dies or hangs, the kernel
// expires the entry and the VIP falls through to kube-proxy's rules.
//
// local, the detect-local match, restricts the PREROUTING jump to this
// node's own pods; host traffic (OUTPUT) is always local.
//
// skip, when not empty, is the set of sources whose traffic to the agent a
// filter drops (podpath.go): they return to kube-proxy's path while their
// entries live; seen is then the set each redirected connection attempt is
// recorded in, by source address and port.
func redirectChain(c *Config, set string, vips []netip.Addr, to netip.AddrPort, local []string, skip, seen string) netrules.Chain {
	var rules [][]string
	if c.SocketMark != 0 {
		mark := fmt.Sprintf("0x%x/0x%x", c.SocketMark, c.SocketMark)
		rules = append(rules, []string{
			"-m", "comment", "--comment", "kube-apicache: own upstream traffic",
			"-m", "mark", "--mark", mark, "-j", "RETURN",
		})
	}
	if skip != "" {
		rules = append(rules, []string{
			"-m", "set", "--match-set", skip, "src",
			"-m", "comment", "--comment", "kube-apicache: sources whose traffic to the agent is dropped go to kube-proxy",
			"-j", "RETURN",
		})
	}
	for _, vip := range vips {
		match := []string{
			"-d", vip.String() + "/" + strconv.Itoa(vip.BitLen()),
			"-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(int(c.ServicePort)),
			"-m", "set", "--match-set", set, "dst",
		}
		if seen != "" {
			rules = append(rules, append(slices.Clone(match),
				"-m", "comment", "--comment", "kube-apicache: record each redirected connection attempt",
				"-j", "SET", "--add-set", seen, "src,src", "--exist"))
		}
		rules = append(rules, append(match,
			"-m", "comment", "--comment", "kube-apicache: kubernetes Service VIP to the node-local agent while it is alive",
			"-j", "DNAT", "--to-destination", to.String()))
	}
	return netrules.Chain{
		Table:     "nat",
		Name:      c.Chain,
		Rules:     rules,
		JumpFrom:  []string{"PREROUTING", "OUTPUT"},
		JumpMatch: map[string][]string{"PREROUTING": local},
		Before:    []string{kubeProxyServicesChain},
		Comment:   "kube-apicache: redirect the kubernetes Service VIP",
	}
}

// kubeProxyServicesChain is the chain kube-proxy's iptables and IPVS modes
// jump to from nat PREROUTING and OUTPUT to reach their Service rules.
const kubeProxyServicesChain = "KUBE-SERVICES"

// livenessSetName is the set of family: the configured name for IPv4, with
// a "6" suffix for IPv6 (a set holds one family only).
func livenessSetName(c *Config, family netrules.Family) string {
	if family == netrules.IPv6 {
		return c.LivenessSet + "6"
	}
	return c.LivenessSet
}
