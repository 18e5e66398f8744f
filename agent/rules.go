package agent

import (
	"fmt"
	"strconv"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// redirectChain is the agent's policy: what its nat chain holds and where it
// is jumped from.
//
// PREROUTING catches pod traffic and OUTPUT host-network traffic; both jump
// here as their first rule, ahead of kube-proxy's KUBE-SERVICES, so the
// redirect wins over kube-proxy's own DNAT (iptables and IPVS modes alike:
// IPVS only sees packets after nat PREROUTING/OUTPUT).
//
// Packets carrying the agent's socket mark return at once: the agent's own
// upstream connections can never be redirected back to itself.
func redirectChain(c *Config) netrules.Chain {
	var rules [][]string
	if c.SocketMark != 0 {
		mark := fmt.Sprintf("0x%x/0x%x", c.SocketMark, c.SocketMark)
		rules = append(rules, []string{
			"-m", "comment", "--comment", "kube-apicache: own upstream traffic",
			"-m", "mark", "--mark", mark, "-j", "RETURN",
		})
	}
	to := c.ListenAddress.String()
	for _, vip := range c.ServiceVIPs {
		rules = append(rules, []string{
			"-d", vip.String() + "/" + strconv.Itoa(vip.BitLen()),
			"-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(int(c.ServicePort)),
			"-m", "comment", "--comment", "kube-apicache: kubernetes Service VIP to the node-local agent",
			"-j", "DNAT", "--to-destination", to,
		})
	}
	return netrules.Chain{
		Table:    "nat",
		Name:     c.Chain,
		Rules:    rules,
		JumpFrom: []string{"PREROUTING", "OUTPUT"},
		Comment:  "kube-apicache: redirect the kubernetes Service VIP",
	}
}
