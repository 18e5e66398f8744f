package agent

import (
	"net/netip"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// isNodeAddress reports whether addr is an address of the node's own
// interfaces (a host-network caller), or one that cannot be told apart.
func isNodeAddress(addr netip.Addr) bool {
	if addr.IsLoopback() || addr.IsUnspecified() {
		return true
	}
	addrs, err := netrules.NodeAddresses()
	return err != nil || addrs[addr]
}
