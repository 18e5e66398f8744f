package netrules

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is the subset of a netlink handle that this package uses.
type Netlink interface {
	LinkByName(name string) (netlink.Link, error)
	LinkAdd(link netlink.Link) error
	LinkDel(link netlink.Link) error
	LinkSetUp(link netlink.Link) error
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	AddrAdd(link netlink.Link, addr *netlink.Addr) error
	AddrDel(link netlink.Link, addr *netlink.Addr) error
}

var _ Netlink = (*netlink.Handle)(nil)

// LoopbackLink is the fallback link for local addresses.
const LoopbackLink = "lo"

// LocalAddress keeps one host address (a /32 or /128) on a link of its own:
// a dummy link named Link when the kernel supports that link type, else the
// loopback device. Either way the address is local to the node and not
// announced anywhere.
type LocalAddress struct {
	nl   Netlink
	link string
	addr netip.Addr

	mu sync.Mutex // protects the field below
	// onLink is the link the address was put on: link, or LoopbackLink when
	// the kernel has no dummy links. Empty until the first Sync.
	onLink string
}

// NewLocalAddress returns a LocalAddress for addr, preferring a dummy link
// named link.
func NewLocalAddress(nl Netlink, link string, addr netip.Addr) *LocalAddress {
	return &LocalAddress{nl: nl, link: link, addr: addr.Unmap()}
}

// Link returns the link that holds the address, once Sync has run.
func (a *LocalAddress) Link() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.onLink
}

func (a *LocalAddress) netlinkAddr() *netlink.Addr {
	bits := a.addr.BitLen()
	return &netlink.Addr{
		IPNet: &net.IPNet{IP: a.addr.AsSlice(), Mask: net.CIDRMask(bits, bits)},
		Scope: unix.RT_SCOPE_HOST,
		// An IPv6 address would otherwise stay tentative (unusable as a
		// DNAT target) while duplicate address detection runs; it is
		// node-local, there is nothing to detect.
		Flags: unix.IFA_F_NODAD,
	}
}

// Sync makes sure the address is present. It reports whether it added it.
func (a *LocalAddress) Sync() (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	link, err := a.ensureLink()
	if err != nil {
		return false, err
	}
	family := netlink.FAMILY_V4
	if a.addr.Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := a.nl.AddrList(link, family)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		// The dump raced with another change; AddrAdd below tolerates an
		// address that is already there.
		err = nil
	}
	if err != nil {
		return false, fmt.Errorf("listing addresses of %s: %w", a.onLink, err)
	}
	for _, x := range addrs {
		if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.Unmap() == a.addr {
			return false, nil
		}
	}
	if err := a.nl.AddrAdd(link, a.netlinkAddr()); err != nil && !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("adding %s to %s: %w", a.addr, a.onLink, err)
	}
	return true, nil
}

// ensureLink finds or creates the dummy link, falling back to loopback when
// the kernel does not know the dummy link type.
func (a *LocalAddress) ensureLink() (netlink.Link, error) {
	if a.onLink == "" || a.onLink == a.link {
		link, err := a.nl.LinkByName(a.link)
		if err == nil {
			a.onLink = a.link
			return link, a.up(link)
		}
		if !isLinkNotFound(err) {
			return nil, fmt.Errorf("looking up link %s: %w", a.link, err)
		}
		if a.onLink == "" {
			d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: a.link}}
			switch err := a.nl.LinkAdd(d); {
			case err == nil || errors.Is(err, unix.EEXIST):
				link, err := a.nl.LinkByName(a.link)
				if err != nil {
					return nil, fmt.Errorf("looking up link %s: %w", a.link, err)
				}
				a.onLink = a.link
				return link, a.up(link)
			case !isUnsupportedLinkType(err):
				return nil, fmt.Errorf("creating dummy link %s: %w", a.link, err)
			}
		}
		// Either the kernel has no dummy links, or ours vanished after we
		// had fallen back: use loopback.
	}
	a.onLink = LoopbackLink
	link, err := a.nl.LinkByName(LoopbackLink)
	if err != nil {
		return nil, fmt.Errorf("looking up link %s: %w", LoopbackLink, err)
	}
	return link, a.up(link)
}

func (a *LocalAddress) up(link netlink.Link) error {
	if link.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := a.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting link %s up: %w", link.Attrs().Name, err)
	}
	return nil
}

// Present returns the link that holds the address, looking where Sync
// puts it (the dummy link or loopback), or "" when neither does.
func (a *LocalAddress) Present() (string, error) {
	family := netlink.FAMILY_V4
	if a.addr.Is6() {
		family = netlink.FAMILY_V6
	}
	for _, name := range []string{a.link, LoopbackLink} {
		link, err := a.nl.LinkByName(name)
		if isLinkNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("looking up link %s: %w", name, err)
		}
		addrs, err := a.nl.AddrList(link, family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return "", fmt.Errorf("listing addresses of %s: %w", name, err)
		}
		for _, x := range addrs {
			if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.Unmap() == a.addr {
				return name, nil
			}
		}
	}
	return "", nil
}

// Remove deletes the address, and the dummy link if this created one. A
// missing address or link is not an error.
func (a *LocalAddress) Remove() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for _, name := range []string{a.link, LoopbackLink} {
		link, err := a.nl.LinkByName(name)
		if err != nil {
			if !isLinkNotFound(err) {
				errs = append(errs, fmt.Errorf("looking up link %s: %w", name, err))
			}
			continue
		}
		if name == a.link && link.Type() == "dummy" {
			// The dummy link exists only to hold the address: deleting it
			// removes the address too. A link of any other type is not
			// ours to delete; only the address is removed from it.
			if err := a.nl.LinkDel(link); err != nil {
				errs = append(errs, fmt.Errorf("deleting link %s: %w", name, err))
			}
			continue
		}
		if err := a.nl.AddrDel(link, a.netlinkAddr()); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting %s from %s: %w", a.addr, name, err))
		}
	}
	a.onLink = ""
	return errors.Join(errs...)
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// isUnsupportedLinkType reports whether LinkAdd failed because the kernel
// does not know the link type (no dummy module).
func isUnsupportedLinkType(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP)
}

// NodeAddresses returns the addresses of the interfaces of the network
// namespace the process runs in: for an agent in the node's namespace,
// the sources the node's own traffic carries.
func NodeAddresses() (map[netip.Addr]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out, nil
}

// MarkSocket returns a dialer Control that sets SO_MARK on every socket;
// nil for mark 0.
func MarkSocket(mark uint32) func(network, address string, c syscall.RawConn) error {
	if mark == 0 {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setting SO_MARK 0x%x on socket: %w", mark, serr)
		}
		return nil
	}
}
