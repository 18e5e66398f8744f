package testing

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// Conntrack is a fake of netrules.Conntrack: a table of flows that tests
// fill, as connections would.
type Conntrack struct {
	mu    sync.Mutex // protects the field below
	flows []netrules.Flow
	// Deleted lists the flows Delete removed, in order.
	Deleted []netrules.Flow
}

var _ netrules.Conntrack = (*Conntrack)(nil)

// Add puts f in the table, replacing a flow of the same original tuple.
func (c *Conntrack) Add(f netrules.Flow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flows = slices.DeleteFunc(c.flows, func(x netrules.Flow) bool { return x.Src == f.Src && x.Dst == f.Dst })
	c.flows = append(c.flows, f)
}

// Flows implements netrules.Conntrack.
func (c *Conntrack) Flows(family netrules.Family, dst netip.AddrPort) ([]netrules.Flow, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []netrules.Flow
	for _, f := range c.flows {
		if f.Dst == dst && netrules.FamilyOf(dst.Addr()) == family {
			out = append(out, f)
		}
	}
	return out, nil
}

// Delete implements netrules.Conntrack.
func (c *Conntrack) Delete(_ netrules.Family, f netrules.Flow) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.flows)
	c.flows = slices.DeleteFunc(c.flows, func(x netrules.Flow) bool { return x.Src == f.Src && x.Dst == f.Dst })
	if len(c.flows) < n {
		c.Deleted = append(c.Deleted, f)
	}
	return nil
}
