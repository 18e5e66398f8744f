package netrules

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AttemptSet records connection attempts: a hash:ip,port set with a
// timeout, which an iptables SET target in a nat chain fills with the
// source address and TCP port of every new connection it redirects
// ("-j SET --add-set NAME src,src --exist"). The nat table sees only a
// connection's first packet, so each attempt is one entry, refreshed by
// the SYN's retries. Conntrack confirms a connection only once its first
// packet has passed every hook: an attempt with no conntrack flow a moment
// later was dropped on its way by a filter.
type AttemptSet struct {
	ipset   IPSet
	name    string
	family  Family
	timeout time.Duration
}

// NewAttemptSet returns the set name of family whose entries live for
// timeout (whole seconds) after the last packet that wrote them.
func NewAttemptSet(ipset IPSet, name string, family Family, timeout time.Duration) *AttemptSet {
	return &AttemptSet{ipset: ipset, name: name, family: family, timeout: timeout}
}

// Name returns the set's name.
func (s *AttemptSet) Name() string { return s.name }

// MaxAttempts bounds the attempts an AttemptSet holds. A pod opening
// connections faster than that over the set's timeout fills it; further
// attempts are then not recorded (the SET target fails silently and the
// rule after it still applies), so what a reader of the set lists, and
// what that costs it, stays bounded whatever the node's pods do.
const MaxAttempts = 4096

// Ensure creates the set unless a compatible one exists. It reports whether
// it created it.
func (s *AttemptSet) Ensure() (bool, error) {
	timeout := uint32(max((s.timeout+time.Second-1)/time.Second, 1))
	return ensureSet(s.ipset, s.name, "hash:ip,port", s.family, &timeout, MaxAttempts)
}

// Entries returns the attempts in the set now, as source address and port.
func (s *AttemptSet) Entries() ([]netip.AddrPort, error) {
	res, err := s.ipset.IpsetList(s.name)
	if err != nil {
		return nil, err
	}
	out := make([]netip.AddrPort, 0, len(res.Entries))
	for _, e := range res.Entries {
		ip, ok := netip.AddrFromSlice(e.IP)
		if !ok || e.Port == nil {
			continue
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), *e.Port))
	}
	return out, nil
}

// Forget deletes the attempt from src, once judged. An attempt that is not
// there is not an error.
func (s *AttemptSet) Forget(src netip.AddrPort) error {
	port, proto := src.Port(), uint8(unix.IPPROTO_TCP)
	err := s.ipset.IpsetDel(s.name, &netlink.IPSetEntry{IP: net.IP(src.Addr().AsSlice()), Port: &port, Protocol: &proto})
	if err != nil && !isEntryNotThere(err) && !IsSetNotExist(err) {
		return fmt.Errorf("deleting %s from ipset %s: %w", src, s.name, err)
	}
	return nil
}

// Destroy deletes the set. A set that does not exist is not an error; one
// still referenced by a rule is (IsSetInUse), so rules go first.
func (s *AttemptSet) Destroy() error { return destroySet(s.ipset, s.name) }
