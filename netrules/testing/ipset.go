package testing

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// IPSet is a fake of netrules.IPSet: hash:ip and hash:ip,port (TCP) sets
// of one family, with
// per-entry timeouts measured on an injected clock. It refuses what the
// kernel refuses: a second set of the same name, entries of the wrong
// family, a timeout on a set created without one, deleting a missing entry,
// and destroying a set an iptables rule still references.
type IPSet struct {
	clock clock.PassiveClock

	mu   sync.Mutex // protects the fields below
	sets map[string]*fakeSet
	// inUse reports whether an iptables rule references the set; set by
	// IPTables.UseSets.
	inUse func(name string) bool
}

type fakeSet struct {
	typ     string
	family  uint8
	timeout *uint32
	// entries maps an address (with port 0 in a hash:ip set) to its
	// expiry; the zero time never expires.
	entries map[netip.AddrPort]time.Time
}

// NewIPSet returns a fake with no sets, whose timeouts follow clk.
func NewIPSet(clk clock.PassiveClock) *IPSet {
	return &IPSet{clock: clk, sets: map[string]*fakeSet{}}
}

// prune drops expired entries, as the kernel's garbage collection (and its
// lookups, which ignore expired entries) do.
func (f *IPSet) prune(s *fakeSet) {
	now := f.clock.Now()
	for ip, exp := range s.entries {
		if !exp.IsZero() && !now.Before(exp) {
			delete(s.entries, ip)
		}
	}
}

// IpsetCreate implements netrules.IPSet for hash:ip and hash:ip,port sets.
func (f *IPSet) IpsetCreate(name, typename string, o netlink.IpsetCreateOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if typename != "hash:ip" && typename != "hash:ip,port" {
		return nl.IPSetError(nl.IPSET_ERR_FIND_TYPE)
	}
	family := o.Family
	if family == 0 {
		family = unix.AF_INET
	}
	if family != unix.AF_INET && family != unix.AF_INET6 {
		return nl.IPSetError(nl.IPSET_ERR_INVALID_FAMILY)
	}
	if len(name) == 0 || len(name) > 31 {
		return unix.EINVAL
	}
	if s, ok := f.sets[name]; ok {
		compatible := s.typ == typename && s.family == family
		if o.Replace && compatible {
			return nil
		}
		return unix.EEXIST
	}
	var timeout *uint32
	if o.Timeout != nil {
		t := *o.Timeout
		timeout = &t
	}
	f.sets[name] = &fakeSet{typ: typename, family: family, timeout: timeout, entries: map[netip.AddrPort]time.Time{}}
	return nil
}

// IpsetDestroy implements netrules.IPSet.
func (f *IPSet) IpsetDestroy(name string) error {
	f.mu.Lock()
	inUse := f.inUse
	f.mu.Unlock()
	// Asked without holding f.mu: the iptables fake takes its own lock
	// and then this one when it checks a rule's set.
	if inUse != nil && inUse(name) {
		if _, ok := f.exists(name); ok {
			return nl.IPSetError(nl.IPSET_ERR_BUSY)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sets[name]; !ok {
		return unix.ENOENT
	}
	delete(f.sets, name)
	return nil
}

// IpsetList implements netrules.IPSet.
func (f *IPSet) IpsetList(name string) (*netlink.IPSetResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return nil, unix.ENOENT
	}
	f.prune(s)
	res := &netlink.IPSetResult{SetName: name, TypeName: s.typ, Family: s.family}
	if s.timeout != nil {
		t := *s.timeout
		res.Timeout = &t
	}
	now := f.clock.Now()
	for _, ip := range sortedAddrs(s.entries) {
		e := netlink.IPSetEntry{IP: net.IP(ip.Addr().AsSlice())}
		if s.typ == "hash:ip,port" {
			port, proto := ip.Port(), uint8(unix.IPPROTO_TCP)
			e.Port, e.Protocol = &port, &proto
		}
		if exp := s.entries[ip]; !exp.IsZero() {
			left := uint32(exp.Sub(now) / time.Second)
			e.Timeout = &left
		}
		res.Entries = append(res.Entries, e)
	}
	res.NumEntries = uint32(len(res.Entries))
	return res, nil
}

// entry returns the set and the key of e: its address, with its port in a
// hash:ip,port set (which, like the kernel, refuses an entry without one).
func (f *IPSet) entry(name string, e *netlink.IPSetEntry) (*fakeSet, netip.AddrPort, error) {
	s, ok := f.sets[name]
	if !ok {
		return nil, netip.AddrPort{}, unix.ENOENT
	}
	ip, ok := netip.AddrFromSlice(e.IP)
	if !ok {
		return nil, netip.AddrPort{}, unix.EINVAL
	}
	ip = ip.Unmap()
	if ip.Is4() != (s.family == unix.AF_INET) {
		if s.family == unix.AF_INET {
			return nil, netip.AddrPort{}, nl.IPSetError(nl.IPSET_ERR_IPADDR_IPV4)
		}
		return nil, netip.AddrPort{}, nl.IPSetError(nl.IPSET_ERR_IPADDR_IPV6)
	}
	var port uint16
	if s.typ == "hash:ip,port" {
		if e.Port == nil {
			return nil, netip.AddrPort{}, nl.IPSetError(nl.IPSET_ERR_PROTOCOL)
		}
		port = *e.Port
	}
	f.prune(s)
	return s, netip.AddrPortFrom(ip, port), nil
}

// IpsetAdd implements netrules.IPSet. Without Replace an existing entry is
// refused; with it, its timeout is reset.
func (f *IPSet) IpsetAdd(name string, e *netlink.IPSetEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ip, err := f.entry(name, e)
	if err != nil {
		return err
	}
	if _, ok := s.entries[ip]; ok && !e.Replace {
		return nl.IPSetError(nl.IPSET_ERR_EXIST)
	}
	var exp time.Time
	switch {
	case e.Timeout != nil && s.timeout == nil:
		return nl.IPSetError(nl.IPSET_ERR_TIMEOUT)
	case e.Timeout != nil && *e.Timeout > 0:
		exp = f.clock.Now().Add(time.Duration(*e.Timeout) * time.Second)
	case e.Timeout == nil && s.timeout != nil && *s.timeout > 0:
		exp = f.clock.Now().Add(time.Duration(*s.timeout) * time.Second)
	}
	s.entries[ip] = exp
	return nil
}

// IpsetDel implements netrules.IPSet.
func (f *IPSet) IpsetDel(name string, e *netlink.IPSetEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ip, err := f.entry(name, e)
	if err != nil {
		return err
	}
	if _, ok := s.entries[ip]; !ok {
		return nl.IPSetError(nl.IPSET_ERR_EXIST)
	}
	delete(s.entries, ip)
	return nil
}

// Contains reports whether the set holds ip now (unexpired).
func (f *IPSet) Contains(name string, ip netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.containsLocked(name, ip)
}

// ContainsAddrPort reports whether the hash:ip,port set holds ap (TCP) now,
// as a "dst,dst" match asks.
func (f *IPSet) ContainsAddrPort(name string, ap netip.AddrPort) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok || s.typ != "hash:ip,port" {
		return false
	}
	f.prune(s)
	_, ok = s.entries[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())]
	return ok
}

func (f *IPSet) containsLocked(name string, ip netip.Addr) bool {
	s, ok := f.sets[name]
	if !ok {
		return false
	}
	f.prune(s)
	_, ok = s.entries[netip.AddrPortFrom(ip.Unmap(), 0)]
	return ok
}

func (f *IPSet) exists(name string) (family uint8, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return 0, false
	}
	return s.family, true
}

// Save renders every set as `ipset save` does, without timeouts left (which
// change as the clock runs), for comparisons in tests.
func (f *IPSet) Save() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.sets))
	for n := range f.sets {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		s := f.sets[n]
		f.prune(s)
		fam := "inet"
		if s.family == unix.AF_INET6 {
			fam = "inet6"
		}
		fmt.Fprintf(&b, "create %s %s family %s", n, s.typ, fam)
		if s.timeout != nil {
			fmt.Fprintf(&b, " timeout %d", *s.timeout)
		}
		b.WriteString("\n")
		for _, ip := range sortedAddrs(s.entries) {
			if s.typ == "hash:ip,port" {
				fmt.Fprintf(&b, "add %s %s,tcp:%d\n", n, ip.Addr(), ip.Port())
			} else {
				fmt.Fprintf(&b, "add %s %s\n", n, ip.Addr())
			}
		}
	}
	return b.String()
}

func sortedAddrs(m map[netip.AddrPort]time.Time) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(m))
	for ip := range m {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}
