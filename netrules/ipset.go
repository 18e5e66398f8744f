package netrules

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// IPSet is the subset of a netlink handle's ipset calls that this package
// uses.
type IPSet interface {
	IpsetCreate(name, typename string, options netlink.IpsetCreateOptions) error
	IpsetDestroy(name string) error
	IpsetList(name string) (*netlink.IPSetResult, error)
	IpsetAdd(name string, entry *netlink.IPSetEntry) error
	IpsetDel(name string, entry *netlink.IPSetEntry) error
}

var _ IPSet = (*netlink.Handle)(nil)

// Family is an IP family: one dataplane (iptables or ip6tables, an inet or
// inet6 set) serves one family.
type Family uint8

// The IP families.
const (
	IPv4 Family = unix.AF_INET
	IPv6 Family = unix.AF_INET6
)

func (f Family) String() string {
	if f == IPv6 {
		return "inet6"
	}
	return "inet"
}

// FamilyOf returns ip's family.
func FamilyOf(ip netip.Addr) Family {
	if ip.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// IsSetNotExist reports whether err says that an ipset does not exist.
func IsSetNotExist(err error) bool {
	return errors.Is(err, unix.ENOENT)
}

// IsSetInUse reports whether err says that an ipset is still referenced, by
// an iptables rule for instance, and cannot be destroyed.
func IsSetInUse(err error) bool {
	var e nl.IPSetError
	return errors.As(err, &e) && (int(e) == nl.IPSET_ERR_BUSY || int(e) == nl.IPSET_ERR_REFERENCED)
}

func isEntryNotThere(err error) bool {
	var e nl.IPSetError
	return errors.As(err, &e) && int(e) == nl.IPSET_ERR_EXIST
}

// LivenessSet is a dead-man switch kept by the kernel: a hash:ip set whose
// entries expire Timeout after they were last refreshed. A rule that also
// matches the set stops matching as soon as its entry expires, whatever
// happened to the process that was meant to refresh it.
//
// Ensure adopts a set of the same name, type and family left by an earlier
// process; a set of another type or family is replaced when nothing
// references it.
type LivenessSet struct {
	ipset   IPSet
	name    string
	family  Family
	timeout time.Duration
}

// NewLivenessSet returns the set name of family whose entries live for
// timeout (rounded up to whole seconds, the kernel's unit) after each
// Refresh.
func NewLivenessSet(ipset IPSet, name string, family Family, timeout time.Duration) *LivenessSet {
	return &LivenessSet{ipset: ipset, name: name, family: family, timeout: timeout}
}

// Name returns the set's name.
func (s *LivenessSet) Name() string { return s.name }

func (s *LivenessSet) seconds() uint32 {
	sec := uint32((s.timeout + time.Second - 1) / time.Second)
	return max(sec, 1)
}

// Ensure creates the set unless a compatible one exists. It reports whether
// it created it.
func (s *LivenessSet) Ensure() (bool, error) {
	timeout := s.seconds()
	return ensureSet(s.ipset, s.name, "hash:ip", s.family, &timeout, 0)
}

// ensureSet creates set name of typ and family, with a default timeout if
// timeout is not nil and at most maxElements entries if that is not zero
// (else the kernel's default, 65536), unless a set of that name, type,
// family and kind of timeout exists. A set of the same name but of another kind cannot be
// ours to keep: it is replaced (which fails while a rule references it).
// It reports whether it created the set.
func ensureSet(ipset IPSet, name, typ string, family Family, timeout *uint32, maxElements uint32) (bool, error) {
	res, err := ipset.IpsetList(name)
	switch {
	case err == nil && res.TypeName == typ && Family(res.Family) == family && (res.Timeout != nil) == (timeout != nil):
		return false, nil
	case err == nil:
		if err := ipset.IpsetDestroy(name); err != nil {
			return false, fmt.Errorf("replacing ipset %s (%s, family %d): %w", name, res.TypeName, res.Family, err)
		}
	case !IsSetNotExist(err):
		return false, fmt.Errorf("listing ipset %s: %w", name, err)
	}
	if err := ipset.IpsetCreate(name, typ, netlink.IpsetCreateOptions{Family: uint8(family), Timeout: timeout, MaxElements: maxElements}); err != nil {
		return false, fmt.Errorf("creating ipset %s: %w", name, err)
	}
	return true, nil
}

// Refresh adds ips to the set, or resets their timeout if they are there.
// The set must exist (Ensure).
func (s *LivenessSet) Refresh(ips []netip.Addr) error {
	timeout := s.seconds()
	for _, ip := range ips {
		t := timeout
		entry := &netlink.IPSetEntry{IP: net.IP(ip.Unmap().AsSlice()), Timeout: &t, Replace: true}
		if err := s.ipset.IpsetAdd(s.name, entry); err != nil {
			return fmt.Errorf("refreshing %s in ipset %s: %w", ip, s.name, err)
		}
	}
	return nil
}

// Clear deletes ips from the set at once. Entries or a set that are not
// there are not an error.
func (s *LivenessSet) Clear(ips []netip.Addr) error {
	var errs []error
	for _, ip := range ips {
		err := s.ipset.IpsetDel(s.name, &netlink.IPSetEntry{IP: net.IP(ip.Unmap().AsSlice())})
		if err != nil && !isEntryNotThere(err) && !IsSetNotExist(err) {
			errs = append(errs, fmt.Errorf("deleting %s from ipset %s: %w", ip, s.name, err))
		}
	}
	return errors.Join(errs...)
}

// Entries returns the addresses in the set now, sorted.
func (s *LivenessSet) Entries() ([]netip.Addr, error) { return setEntries(s.ipset, s.name) }

// setEntries returns the addresses in set name now, sorted.
func setEntries(ipset IPSet, name string) ([]netip.Addr, error) {
	res, err := ipset.IpsetList(name)
	if err != nil {
		return nil, fmt.Errorf("listing ipset %s: %w", name, err)
	}
	var out []netip.Addr
	for _, e := range res.Entries {
		if ip, ok := netip.AddrFromSlice(e.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// Destroy deletes the set. A set that does not exist is not an error; one
// still referenced by a rule is (IsSetInUse), so rules go first.
func (s *LivenessSet) Destroy() error {
	return destroySet(s.ipset, s.name)
}

// destroySet deletes set name; one that does not exist is not an error.
func destroySet(ipset IPSet, name string) error {
	if err := ipset.IpsetDestroy(name); err != nil && !IsSetNotExist(err) {
		return fmt.Errorf("destroying ipset %s: %w", name, err)
	}
	return nil
}
