package netrules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// KernelNFTables is NFTables over netlink (github.com/google/nftables), with
// no nft binary. Rules are compiled here to the expressions nft itself
// emits for the same text (NFTRule.String), and carry their comment where
// nft keeps one, so `nft list table` shows them as if nft had written them.
//
// It holds one netlink socket, opened in the network namespace of the
// thread that called NewKernelNFTables, and uses it for every call whatever
// goroutine makes it.
type KernelNFTables struct {
	mu sync.Mutex // serializes batches and dumps: they share conn's socket and buffer
	// conn buffers the messages of the batch being built until Flush,
	// with no way to drop them, and a serialization error sticks to it for
	// good: every op is checked and every expression marshalled before
	// the first message is queued.
	conn *nftables.Conn
	// broken is set if queueing failed nonetheless: no batch is sent
	// again, and the caller must open a new KernelNFTables.
	broken error
}

var _ NFTables = (*KernelNFTables)(nil)

// NewKernelNFTables opens a netlink socket bound to the calling thread's
// network namespace, and lists the tables once: a netfilter socket opens
// on kernels without nf_tables too, and this fails there. Close releases
// the socket.
func NewKernelNFTables() (*KernelNFTables, error) {
	conn, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("opening an nftables netlink socket: %w", err)
	}
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyIPv4); err != nil {
		_ = conn.CloseLasting()
		return nil, fmt.Errorf("nftables: listing tables: %w", err)
	}
	return &KernelNFTables{conn: conn}, nil
}

// Close closes the socket; the value must not be used afterwards.
func (k *KernelNFTables) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.conn.CloseLasting()
}

// nftErr wraps err, and ErrNFTNotExist with it when the kernel said ENOENT
// (a table, chain, set or element that is not there).
func nftErr(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf(format, args...)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s: %w: %w", msg, ErrNFTNotExist, err)
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// nftFamily is where a family's addresses sit and how nftables names them.
type nftFamily struct {
	family  Family
	name    string // nft's name of the table family
	table   nftables.TableFamily
	nfproto uint32 // the NAT expression's family
	addrLen uint32
	saddr   uint32 // network header offsets
	daddr   uint32
	addr    nftables.SetDatatype
	addrKey nftables.SetDatatype // addr . inet_service
}

var (
	nftIPv4 = nftFamily{
		family: IPv4, name: "ip", table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4,
		addrLen: 4, saddr: 12, daddr: 16,
		addr:    nftables.TypeIPAddr,
		addrKey: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService),
	}
	nftIPv6 = nftFamily{
		family: IPv6, name: "ip6", table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6,
		addrLen: 16, saddr: 8, daddr: 24,
		addr:    nftables.TypeIP6Addr,
		addrKey: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService),
	}
)

func nftFamilyOf(f Family) (*nftFamily, error) {
	switch f {
	case IPv4:
		return &nftIPv4, nil
	case IPv6:
		return &nftIPv6, nil
	}
	return nil, fmt.Errorf("nftables: unsupported family %d", f)
}

func (f *nftFamily) tableOf(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: f.table}
}

// addrBytes is ip in the family's wire form.
func (f *nftFamily) addrBytes(ip netip.Addr) ([]byte, error) {
	ip = ip.Unmap()
	if !ip.IsValid() || FamilyOf(ip) != f.family {
		return nil, fmt.Errorf("address %s does not belong in an %s table", ip, f.name)
	}
	return ip.AsSlice(), nil
}

// Registers as nft allocates them: 16-byte NFT_REG_1 for a value, the
// verdict register for verdicts. A concatenation occupies consecutive
// 32-bit registers from NFT_REG_1 (which is NFT_REG32_00), each part padded
// to 4 bytes: the port of addr . port follows the address at
// NFT_REG32_00 + addrLen/4.
const (
	nftReg  = unix.NFT_REG_1
	nftReg2 = unix.NFT_REG_2
)

// ifNameSize is IFNAMSIZ: iifname compares that many bytes, NUL-padded.
const ifNameSize = 16

// compile turns r into expressions for family f. setIDs names the sets
// created earlier in the same batch, which a lookup also finds by name but
// nft identifies by ID too.
func (f *nftFamily) compile(r NFTRule, setIDs map[string]uint32) ([]expr.Any, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	var ex []expr.Any
	load := func(offset, n uint32) *expr.Payload {
		return &expr.Payload{DestRegister: nftReg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n}
	}
	eq := func(data []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: nftReg, Data: data} }
	lookup := func(set string) *expr.Lookup {
		return &expr.Lookup{SourceRegister: nftReg, SetName: set, SetID: setIDs[set]}
	}
	tcp := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nftReg},
		eq([]byte{unix.IPPROTO_TCP}),
	}

	if r.MarkMask != 0 {
		// The mark is a host-order u32, as nft compiles "meta mark & m == m".
		m := binaryutil.NativeEndian.PutUint32(r.MarkMask)
		ex = append(ex,
			&expr.Meta{Key: expr.MetaKeyMARK, Register: nftReg},
			&expr.Bitwise{SourceRegister: nftReg, DestRegister: nftReg, Len: 4, Mask: m, Xor: make([]byte, 4)},
			eq(m))
	}
	if r.SrcSet != "" {
		ex = append(ex, load(f.saddr, f.addrLen), lookup(r.SrcSet))
	}
	if r.SrcPrefix.IsValid() {
		if r.SrcPrefix.Addr().Is4In6() {
			return nil, fmt.Errorf("rule %q: an IPv4-mapped prefix", r)
		}
		p := r.SrcPrefix.Masked()
		network, err := f.addrBytes(p.Addr())
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r, err)
		}
		ex = append(ex, load(f.saddr, f.addrLen))
		if p.Bits() < int(f.addrLen*8) {
			mask := netipMask(p.Bits(), int(f.addrLen))
			ex = append(ex, &expr.Bitwise{SourceRegister: nftReg, DestRegister: nftReg, Len: f.addrLen, Mask: mask, Xor: make([]byte, f.addrLen)})
		}
		ex = append(ex, eq(network))
	}
	if r.InIface != "" {
		name, prefix := strings.CutSuffix(r.InIface, "*")
		if name == "" || len(name) >= ifNameSize {
			return nil, fmt.Errorf("rule %q: interface name %q must have 1 to %d characters", r, r.InIface, ifNameSize-1)
		}
		// A prefix compares only its own bytes; a whole name compares
		// all IFNAMSIZ bytes, so that "eth0" does not match "eth01".
		data := []byte(name)
		if !prefix {
			data = append(data, make([]byte, ifNameSize-len(data))...)
		}
		ex = append(ex, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: nftReg}, eq(data))
	}
	if r.DstAddr.IsValid() {
		a, err := f.addrBytes(r.DstAddr)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r, err)
		}
		ex = append(ex, load(f.daddr, f.addrLen), eq(a))
	}
	if r.TCPDstPort != 0 {
		ex = append(ex, tcp...)
		ex = append(ex,
			&expr.Payload{DestRegister: nftReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			eq(binaryutil.BigEndian.PutUint16(r.TCPDstPort)))
	}
	if r.DstSet != "" {
		ex = append(ex, load(f.daddr, f.addrLen), lookup(r.DstSet))
	}

	switch {
	case r.UpdateSet != "":
		// "tcp sport" depends on "meta l4proto tcp", which nft adds
		// unless the rule already has it.
		if r.TCPDstPort == 0 {
			ex = append(ex, tcp...)
		}
		// The key is the concatenation saddr . sport in consecutive
		// 32-bit registers; the payload load zeroes the port's padding.
		// No timeout: the element gets the set's default, and an update
		// of an element present resets its expiry to that.
		ex = append(ex,
			load(f.saddr, f.addrLen),
			&expr.Payload{DestRegister: unix.NFT_REG32_00 + f.addrLen/4, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
			&expr.Dynset{SrcRegKey: nftReg, SetName: r.UpdateSet, SetID: setIDs[r.UpdateSet], Operation: unix.NFT_DYNSET_OP_UPDATE})
	case r.Return:
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictReturn})
	case r.Jump != "":
		ex = append(ex, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Jump})
	case r.DNAT.IsValid():
		a, err := f.addrBytes(r.DNAT.Addr())
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r, err)
		}
		nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto, RegAddrMin: nftReg}
		ex = append(ex, &expr.Immediate{Register: nftReg, Data: a})
		if r.DNAT.Port() != 0 {
			ex = append(ex, &expr.Immediate{Register: nftReg2, Data: binaryutil.BigEndian.PutUint16(r.DNAT.Port())})
			nat.RegProtoMin, nat.Specified = nftReg2, true
		}
		ex = append(ex, nat)
	}
	// Marshal once here: a serialization error inside the batch would
	// poison the connection for good.
	for _, e := range ex {
		if _, err := expr.Marshal(byte(f.table), e); err != nil {
			return nil, fmt.Errorf("rule %q: %w", r, err)
		}
	}
	return ex, nil
}

// netipMask is a prefix mask of bits ones in n bytes.
func netipMask(bits, n int) []byte {
	m := make([]byte, n)
	for i := range m {
		switch {
		case bits >= 8:
			m[i] = 0xff
			bits -= 8
		case bits > 0:
			m[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return m
}

// ruleUserData is a comment as nft stores it: the NFTNL_UDATA_RULE_COMMENT
// TLV, NUL-terminated.
func ruleUserData(comment string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, comment)
}

// ruleComment reads the comment back from a rule's user data, which other
// tools may fill with TLVs of their own.
func ruleComment(udata []byte) string {
	for len(udata) >= 2 {
		typ, n := userdata.Type(udata[0]), int(udata[1])
		if len(udata) < 2+n {
			break
		}
		if typ == userdata.TypeComment {
			return strings.TrimRight(string(udata[2:2+n]), "\x00")
		}
		udata = udata[2+n:]
	}
	return ""
}

// set is def as nftables creates it in table. A set of addr . port pairs is
// filled from the packet path (the update action's key is saddr . sport),
// so it is dynamic, as nft makes a set that a rule updates. Its key is the
// concatenated type and length; like nft, no concatenation flag, which
// only interval sets take.
func (f *nftFamily) set(table *nftables.Table, def NFTSet) (*nftables.Set, error) {
	s := &nftables.Set{
		Table:      table,
		Name:       def.Name,
		HasTimeout: def.Timeout > 0,
		Timeout:    def.Timeout,
		Size:       def.Size,
	}
	switch def.Type {
	case NFTSetAddr:
		s.KeyType = f.addr
	case NFTSetAddrPort:
		s.KeyType = f.addrKey
		s.Dynamic = true
	default:
		return nil, fmt.Errorf("set %s: unknown type %q", def.Name, def.Type)
	}
	if def.Timeout < 0 || def.Timeout%1e6 != 0 {
		return nil, fmt.Errorf("set %s: timeout %s is not a whole number of milliseconds", def.Name, def.Timeout)
	}
	return s, nil
}

// setDef reads back what f.set wrote; a set of another kind gets a type
// of its key's name, which no NFTSet has.
func (f *nftFamily) setDef(s *nftables.Set) NFTSet {
	def := NFTSet{Name: s.Name, Size: s.Size}
	switch s.KeyType.Name {
	case f.addr.Name:
		def.Type = NFTSetAddr
	case f.addrKey.Name:
		def.Type = NFTSetAddrPort
	default:
		def.Type = NFTSetType(s.KeyType.Name)
	}
	if s.HasTimeout {
		def.Timeout = s.Timeout
	}
	return def
}

// chain is def as nftables creates it in table: a nat base chain with
// policy accept, or a regular chain.
func (f *nftFamily) chain(table *nftables.Table, def NFTChain) (*nftables.Chain, error) {
	c := &nftables.Chain{Table: table, Name: def.Name}
	if def.Hook == "" {
		return c, nil
	}
	switch def.Hook {
	case NFTHookPrerouting:
		c.Hooknum = nftables.ChainHookPrerouting
	case NFTHookOutput:
		c.Hooknum = nftables.ChainHookOutput
	default:
		return nil, fmt.Errorf("chain %s: unsupported hook %q", def.Name, def.Hook)
	}
	accept := nftables.ChainPolicyAccept
	c.Type, c.Priority, c.Policy = nftables.ChainTypeNAT, nftables.ChainPriorityRef(nftables.ChainPriority(def.Priority)), &accept
	return c, nil
}

// chainDef reads back what f.chain wrote. A base chain of another type or
// hook reads as a hook no NFTChain has, so that a sync replaces it.
func chainDef(c *nftables.Chain) NFTChain {
	def := NFTChain{Name: c.Name}
	if c.Hooknum == nil {
		return def
	}
	switch *c.Hooknum {
	case *nftables.ChainHookPrerouting:
		def.Hook = NFTHookPrerouting
	case *nftables.ChainHookOutput:
		def.Hook = NFTHookOutput
	default:
		def.Hook = NFTHook(fmt.Sprintf("hook %d", *c.Hooknum))
	}
	if c.Type != nftables.ChainTypeNAT {
		def.Hook = NFTHook(string(c.Type) + " " + string(def.Hook))
	}
	if c.Priority != nil {
		def.Priority = int32(*c.Priority)
	}
	return def
}

// ListTable implements NFTables. The kernel filters dumps of sets and rules
// by table, but not dumps of chains: the family's chains are all read and
// those of other tables dropped. Anonymous sets (rule-local, nft's
// "{ a, b }") are left out.
func (k *KernelNFTables) ListTable(family Family, table string) (*NFTTable, error) {
	f, err := nftFamilyOf(family)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	t, err := k.conn.ListTableOfFamily(table, f.table)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, nftErr(err, "reading table %s %s", f.name, table)
	}
	chains, err := k.conn.ListChainsOfTableFamily(f.table)
	if err != nil {
		return nil, nftErr(err, "listing chains of %s", f.name)
	}
	out := &NFTTable{}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != table {
			continue
		}
		def := chainDef(c)
		rules, err := k.conn.GetRules(t, c)
		if err != nil {
			return nil, nftErr(err, "listing rules of chain %s in %s %s", c.Name, f.name, table)
		}
		for _, r := range rules {
			def.Rules = append(def.Rules, NFTRule{Note: ruleComment(r.UserData)})
		}
		out.Chains = append(out.Chains, def)
	}
	sets, err := k.conn.GetSets(t)
	if err != nil {
		return nil, nftErr(err, "listing sets of %s %s", f.name, table)
	}
	for _, s := range sets {
		if !s.Anonymous {
			out.Sets = append(out.Sets, f.setDef(s))
		}
	}
	return out, nil
}

// Tables implements NFTables.
func (k *KernelNFTables) Tables(family Family) ([]string, error) {
	f, err := nftFamilyOf(family)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	ts, err := k.conn.ListTablesOfFamily(f.table)
	if err != nil {
		return nil, nftErr(err, "listing %s tables", f.name)
	}
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		names = append(names, t.Name)
	}
	return names, nil
}

// Apply implements NFTables: tx is one netlink batch, which the kernel
// commits whole or not at all. NFTAddTable creates the table unless it
// exists. Every op is checked and every rule compiled before anything is
// queued, so a malformed tx sends nothing.
func (k *KernelNFTables) Apply(tx *NFTTransaction) error {
	f, err := nftFamilyOf(tx.Family)
	if err != nil {
		return err
	}
	t := f.tableOf(tx.Table)
	// Sets created in this batch get IDs, unique within it, by which the
	// kernel also resolves a rule's reference before the set is committed.
	setIDs := map[string]uint32{}
	var queue []func() error
	for i, op := range tx.Ops {
		switch op.Kind {
		case NFTAddTable:
			queue = append(queue, func() error { k.conn.AddTable(t); return nil })
		case NFTAddSet:
			s, err := f.set(t, op.Set)
			if err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			s.ID = uint32(i + 1)
			setIDs[s.Name] = s.ID
			queue = append(queue, func() error { return k.conn.AddSet(s, nil) })
		case NFTDeleteSet:
			s := &nftables.Set{Table: t, Name: op.Set.Name}
			delete(setIDs, s.Name)
			queue = append(queue, func() error { k.conn.DelSet(s); return nil })
		case NFTAddChain:
			c, err := f.chain(t, op.Chain)
			if err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			queue = append(queue, func() error { k.conn.AddChain(c); return nil })
		case NFTFlushChain:
			c := &nftables.Chain{Table: t, Name: op.Chain.Name}
			queue = append(queue, func() error { k.conn.FlushChain(c); return nil })
		case NFTDeleteChain:
			c := &nftables.Chain{Table: t, Name: op.Chain.Name}
			queue = append(queue, func() error { k.conn.DelChain(c); return nil })
		case NFTAddRule:
			ex, err := f.compile(op.Rule, setIDs)
			if err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
			r := &nftables.Rule{
				Table:    t,
				Chain:    &nftables.Chain{Table: t, Name: op.Chain.Name},
				Exprs:    ex,
				UserData: ruleUserData(op.Rule.Comment()),
			}
			queue = append(queue, func() error { k.conn.AddRule(r); return nil })
		default:
			return fmt.Errorf("op %d: unknown kind %d", i, op.Kind)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.flush(queue, "writing table %s %s", f.name, tx.Table)
}

// flush queues ops and sends them as one batch. Must hold k.mu.
func (k *KernelNFTables) flush(ops []func() error, format string, args ...any) error {
	if k.broken != nil {
		return k.broken
	}
	for _, op := range ops {
		if err := op(); err != nil {
			// The ops queued so far cannot be taken back: they would go
			// out with the next batch, as half a transaction. No batch
			// is ever sent on this connection again.
			k.broken = fmt.Errorf("nftables connection unusable after a batch failed half built: %w", err)
			return fmt.Errorf(format+": %w", append(args, err)...)
		}
	}
	return nftErr(k.conn.Flush(), format, args...)
}

// DeleteTable implements NFTables.
func (k *KernelNFTables) DeleteTable(family Family, table string) error {
	f, err := nftFamilyOf(family)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	t := f.tableOf(table)
	err = k.flush([]func() error{func() error { k.conn.DelTable(t); return nil }}, "deleting table %s %s", f.name, table)
	if IsNFTNotExist(err) {
		return nil
	}
	return err
}

// lookupSet reads set's definition. Must hold k.mu.
func (k *KernelNFTables) lookupSet(f *nftFamily, table, set string) (*nftables.Set, NFTSet, error) {
	s, err := k.conn.GetSetByName(f.tableOf(table), set)
	if err != nil {
		return nil, NFTSet{}, nftErr(err, "reading set %s in %s %s", set, f.name, table)
	}
	s.Table = f.tableOf(table)
	return s, f.setDef(s), nil
}

// elements reads a set's elements, by key. Must hold k.mu.
func (k *KernelNFTables) elements(f *nftFamily, table, set string) (*nftables.Set, NFTSet, map[string]NFTElement, error) {
	s, def, err := k.lookupSet(f, table, set)
	if err != nil {
		return nil, def, nil, err
	}
	els, err := k.conn.GetSetElements(s)
	if err != nil {
		return nil, def, nil, nftErr(err, "listing set %s in %s %s", set, f.name, table)
	}
	out := make(map[string]NFTElement, len(els))
	for _, e := range els {
		el, ok := f.decodeElement(def.Type, e.Key)
		if !ok {
			continue
		}
		el.Expires = e.Expires
		out[string(e.Key)] = el
	}
	return s, def, out, nil
}

// elementKey is e's key in a set of typ: the address, then for addr . port
// the port, big-endian and padded to 4 bytes.
func (f *nftFamily) elementKey(typ NFTSetType, e NFTElement) ([]byte, error) {
	key, err := f.addrBytes(e.Addr)
	if err != nil {
		return nil, err
	}
	switch typ {
	case NFTSetAddr:
		if e.Port != 0 {
			return nil, fmt.Errorf("element %s: a port in a set of addresses", netip.AddrPortFrom(e.Addr, e.Port))
		}
		return key, nil
	case NFTSetAddrPort:
		return binary.BigEndian.AppendUint32(key, uint32(e.Port)<<16), nil
	}
	return nil, fmt.Errorf("elements of a set of type %q are not supported", typ)
}

func (f *nftFamily) decodeElement(typ NFTSetType, key []byte) (NFTElement, bool) {
	n := int(f.addrLen)
	switch {
	case typ == NFTSetAddr && len(key) == n:
	case typ == NFTSetAddrPort && len(key) == n+4:
	default:
		return NFTElement{}, false
	}
	ip, _ := netip.AddrFromSlice(key[:n])
	e := NFTElement{Addr: ip}
	if typ == NFTSetAddrPort {
		e.Port = binary.BigEndian.Uint16(key[n:])
	}
	return e, true
}

// Elements implements NFTables.
func (k *KernelNFTables) Elements(family Family, table, set string) ([]NFTElement, error) {
	f, err := nftFamilyOf(family)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, _, els, err := k.elements(f, table, set)
	if err != nil {
		return nil, err
	}
	out := make([]NFTElement, 0, len(els))
	for _, e := range els {
		out = append(out, e)
	}
	return out, nil
}

// elementsPerMessage bounds one message's element list, a nested netlink
// attribute whose length must fit in 16 bits.
const elementsPerMessage = 512

// elementRetries is how often a batch that found an element gone (ENOENT)
// is read and sent again: an element that expires between the read and
// the batch's delete fails the whole batch.
const elementRetries = 3

// RefreshElements implements NFTables. An element present is deleted and
// added again in the same batch, which the kernel commits together: adding
// an element that is present leaves its expiry as it was, so the delete is
// what gives it a fresh timeout.
func (k *KernelNFTables) RefreshElements(family Family, table, set string, elems []NFTElement) error {
	return k.changeElements(family, table, set, elems, true)
}

// DeleteElements implements NFTables. Elements' timeouts are ignored.
func (k *KernelNFTables) DeleteElements(family Family, table, set string, elems []NFTElement) error {
	return k.changeElements(family, table, set, elems, false)
}

// changeElements deletes the elements of elems that are present and, if
// add, adds them all, in one batch.
func (k *KernelNFTables) changeElements(family Family, table, set string, elems []NFTElement, add bool) error {
	f, err := nftFamilyOf(family)
	if err != nil {
		return err
	}
	verb := "deleting elements of"
	if add {
		verb = "refreshing elements of"
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for attempt := 1; ; attempt++ {
		s, def, have, err := k.elements(f, table, set)
		if err != nil {
			return err
		}
		var del, put []nftables.SetElement
		seen := map[string]bool{}
		for _, e := range elems {
			key, err := f.elementKey(def.Type, e)
			if err != nil {
				return fmt.Errorf("%s set %s in %s %s: %w", verb, set, f.name, table, err)
			}
			if add && e.Timeout != 0 && !s.HasTimeout {
				return fmt.Errorf("%s set %s in %s %s: element %s has a timeout, the set has none", verb, set, f.name, table, e.Addr)
			}
			if seen[string(key)] {
				continue
			}
			seen[string(key)] = true
			if _, ok := have[string(key)]; ok {
				del = append(del, nftables.SetElement{Key: key})
			}
			if add {
				put = append(put, nftables.SetElement{Key: key, Timeout: e.Timeout})
			}
		}
		if len(del) == 0 && len(put) == 0 {
			return nil
		}
		var ops []func() error
		for c := range slices.Chunk(del, elementsPerMessage) {
			ops = append(ops, func() error { return k.conn.SetDeleteElements(s, c) })
		}
		for c := range slices.Chunk(put, elementsPerMessage) {
			ops = append(ops, func() error { return k.conn.SetAddElements(s, c) })
		}
		err = k.flush(ops, "%s set %s in %s %s", verb, set, f.name, table)
		if err == nil || !IsNFTNotExist(err) || attempt == elementRetries {
			return err
		}
	}
}
