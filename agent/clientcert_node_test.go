package agent

import (
	"net/netip"
	"testing"
)

// TestIsNodeAddress: loopback and the node's own addresses are the host
// network; a documentation address is not.
func TestIsNodeAddress(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1": true, "::1": true, "0.0.0.0": true, "203.0.113.77": false} {
		if got := isNodeAddress(netip.MustParseAddr(addr)); got != want {
			t.Errorf("isNodeAddress(%s) = %v, want %v", addr, got, want)
		}
	}
}
