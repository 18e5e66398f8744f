package testing

import (
	"net"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is a fake of netrules.Netlink holding links and their addresses.
type Netlink struct {
	mu    sync.Mutex // protects the fields below
	links map[string]*fakeLink
	// NoDummy makes LinkAdd of a dummy link fail as it does on kernels
	// without the dummy module.
	NoDummy bool
}

type fakeLink struct {
	attrs netlink.LinkAttrs
	kind  string
	addrs []netlink.Addr
}

func (l *fakeLink) link() netlink.Link {
	a := l.attrs
	if l.kind == "dummy" {
		return &netlink.Dummy{LinkAttrs: a}
	}
	return &netlink.Device{LinkAttrs: a}
}

// NewNetlink returns a fake with an up loopback link.
func NewNetlink() *Netlink {
	return &Netlink{links: map[string]*fakeLink{
		"lo": {attrs: netlink.LinkAttrs{Name: "lo", Index: 1, Flags: net.FlagUp | net.FlagLoopback}, kind: "device"},
	}}
}

// LinkByName implements netrules.Netlink.
func (f *Netlink) LinkByName(name string) (netlink.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[name]
	if !ok {
		return nil, netlink.LinkNotFoundError{}
	}
	return l.link(), nil
}

// LinkAdd implements netrules.Netlink for dummy links.
func (f *Netlink) LinkAdd(link netlink.Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if link.Type() == "dummy" && f.NoDummy {
		return unix.EOPNOTSUPP
	}
	name := link.Attrs().Name
	if _, ok := f.links[name]; ok {
		return unix.EEXIST
	}
	f.links[name] = &fakeLink{attrs: netlink.LinkAttrs{Name: name, Index: len(f.links) + 1}, kind: link.Type()}
	return nil
}

// LinkDel implements netrules.Netlink.
func (f *Netlink) LinkDel(link netlink.Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := link.Attrs().Name
	if _, ok := f.links[name]; !ok {
		return unix.ENODEV
	}
	delete(f.links, name)
	return nil
}

// LinkSetUp implements netrules.Netlink.
func (f *Netlink) LinkSetUp(link netlink.Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[link.Attrs().Name]
	if !ok {
		return unix.ENODEV
	}
	l.attrs.Flags |= net.FlagUp
	return nil
}

// AddrList implements netrules.Netlink.
func (f *Netlink) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[link.Attrs().Name]
	if !ok {
		return nil, unix.ENODEV
	}
	var out []netlink.Addr
	for _, a := range l.addrs {
		is4 := a.IP.To4() != nil
		if family == netlink.FAMILY_ALL || (family == netlink.FAMILY_V4) == is4 {
			out = append(out, a)
		}
	}
	return out, nil
}

// AddrAdd implements netrules.Netlink; a duplicate fails with EEXIST.
func (f *Netlink) AddrAdd(link netlink.Link, addr *netlink.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[link.Attrs().Name]
	if !ok {
		return unix.ENODEV
	}
	if slices.ContainsFunc(l.addrs, func(a netlink.Addr) bool { return a.IP.Equal(addr.IP) }) {
		return unix.EEXIST
	}
	l.addrs = append(l.addrs, *addr)
	return nil
}

// AddrDel implements netrules.Netlink; a missing address fails with
// EADDRNOTAVAIL.
func (f *Netlink) AddrDel(link netlink.Link, addr *netlink.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[link.Attrs().Name]
	if !ok {
		return unix.ENODEV
	}
	i := slices.IndexFunc(l.addrs, func(a netlink.Addr) bool { return a.IP.Equal(addr.IP) })
	if i < 0 {
		return unix.EADDRNOTAVAIL
	}
	l.addrs = slices.Delete(l.addrs, i, i+1)
	return nil
}

// Addresses returns the addresses on every link, as "link addr" strings, for
// assertions.
func (f *Netlink) Addresses() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for name, l := range f.links {
		for _, a := range l.addrs {
			out = append(out, name+" "+a.IPNet.String())
		}
	}
	slices.Sort(out)
	return out
}

// Links returns the names of all links, sorted.
func (f *Netlink) Links() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for name := range f.links {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
