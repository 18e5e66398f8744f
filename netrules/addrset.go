package netrules

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// AddressSet is a hash:ip set of one family whose entries never expire and
// are exactly the addresses last given to Sync: the IPs of this node's pods,
// say, for a rule that must match only them.
//
// Ensure adopts a set of the same name, type and family left by an earlier
// process; a set of another kind is replaced when nothing references it.
type AddressSet struct {
	ipset  IPSet
	name   string
	family Family
}

// NewAddressSet returns the set name of family.
func NewAddressSet(ipset IPSet, name string, family Family) *AddressSet {
	return &AddressSet{ipset: ipset, name: name, family: family}
}

// Name returns the set's name.
func (s *AddressSet) Name() string { return s.name }

// Ensure creates the set unless a compatible one exists. It reports whether
// it created it.
func (s *AddressSet) Ensure() (bool, error) {
	return ensureSet(s.ipset, s.name, "hash:ip", s.family, nil, 0)
}

// Sync makes the set hold exactly want (addresses of another family are
// ignored), adding before removing. It reports how many entries it added
// and removed. The set must exist (Ensure).
func (s *AddressSet) Sync(want []netip.Addr) (added, removed int, err error) {
	res, err := s.ipset.IpsetList(s.name)
	if err != nil {
		return 0, 0, fmt.Errorf("listing ipset %s: %w", s.name, err)
	}
	have := map[netip.Addr]bool{}
	for _, e := range res.Entries {
		if ip, ok := netip.AddrFromSlice(e.IP); ok {
			have[ip.Unmap()] = true
		}
	}
	keep := map[netip.Addr]bool{}
	var errs []error
	for _, ip := range want {
		ip = ip.Unmap()
		if !ip.IsValid() || FamilyOf(ip) != s.family || keep[ip] {
			continue
		}
		keep[ip] = true
		if have[ip] {
			continue
		}
		if err := s.ipset.IpsetAdd(s.name, &netlink.IPSetEntry{IP: net.IP(ip.AsSlice()), Replace: true}); err != nil {
			errs = append(errs, fmt.Errorf("adding %s to ipset %s: %w", ip, s.name, err))
			continue
		}
		added++
	}
	for ip := range have {
		if keep[ip] {
			continue
		}
		err := s.ipset.IpsetDel(s.name, &netlink.IPSetEntry{IP: net.IP(ip.AsSlice())})
		if err != nil && !isEntryNotThere(err) {
			errs = append(errs, fmt.Errorf("deleting %s from ipset %s: %w", ip, s.name, err))
			continue
		}
		removed++
	}
	return added, removed, errors.Join(errs...)
}

// Entries returns the addresses in the set now, sorted.
func (s *AddressSet) Entries() ([]netip.Addr, error) { return setEntries(s.ipset, s.name) }

// Destroy deletes the set. A set that does not exist is not an error; one
// still referenced by a rule is (IsSetInUse), so rules go first.
func (s *AddressSet) Destroy() error {
	return destroySet(s.ipset, s.name)
}
