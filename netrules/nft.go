package netrules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The nftables dataplane: one table of the agent's own per family (ip
// kube-apicache, ip6 kube-apicache) with nat prerouting and output base
// chains at a priority strictly before dstnat, a regular chain holding the
// redirect, and the sets the rules match: liveness (with per-element
// timeouts, the dead-man switch), the pods, skip and seen sets of the
// pod-path check. Nothing outside the table is written, and only its own
// sets and rules are read (the kernel cannot list one table's chains
// alone, so chain names are read for the whole family): a sync does not
// grow with other tables' rules.
//
// kube-proxy's nftables mode registers its nat chains at dstnat (-100) in
// its own table; netfilter runs NAT base chains in priority order and the
// first mapping wins, so a chain at dstnat-1 runs first on every packet,
// whatever order the two tables were loaded in. iptables-nft's nat chains
// sit at -100 too, so the iptables dataplane ties with kube-proxy's
// nftables mode, and which runs first then depends on registration order.

// NFTables is the narrow nftables surface the redirect needs. The kernel
// binding speaks netlink (github.com/google/nftables); the fake in
// netrules/testing keeps priorities and element timeouts like the kernel.
type NFTables interface {
	// ListTable returns table, or nil if it does not exist. Rules read
	// from the kernel carry their Comment only, which identifies them
	// (NFTRule.Comment); the fake returns whole rules.
	ListTable(family Family, table string) (*NFTTable, error)
	// Tables returns the names of family's tables.
	Tables(family Family) ([]string, error)
	// Apply runs tx as one transaction: all of it takes effect, or none.
	Apply(tx *NFTTransaction) error
	// DeleteTable deletes table and everything in it; a missing table is
	// not an error.
	DeleteTable(family Family, table string) error
	// Elements returns a set's elements, with the time each has left
	// (Expires) in a set with timeouts.
	Elements(family Family, table, set string) ([]NFTElement, error)
	// RefreshElements makes elems present, each with a fresh timeout (the
	// set's default when Timeout is 0), atomically: an element is never
	// missing in between.
	RefreshElements(family Family, table, set string, elems []NFTElement) error
	// DeleteElements deletes elems; missing ones are not an error.
	DeleteElements(family Family, table, set string, elems []NFTElement) error
}

// NFTTable is one table's chains and sets.
type NFTTable struct {
	Chains []NFTChain
	Sets   []NFTSet
}

// Chain returns the chain named name, or nil.
func (t *NFTTable) Chain(name string) *NFTChain {
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	return nil
}

// Set returns the set named name, or nil.
func (t *NFTTable) Set(name string) *NFTSet {
	for i := range t.Sets {
		if t.Sets[i].Name == name {
			return &t.Sets[i]
		}
	}
	return nil
}

// NFTHook is a base chain's netfilter hook; "" for a regular chain.
type NFTHook string

const (
	NFTHookPrerouting NFTHook = "prerouting"
	NFTHookOutput     NFTHook = "output"
)

// NFTPriorityDstNAT is the dstnat priority (NF_IP_PRI_NAT_DST), where
// iptables-nft's and kube-proxy's nat chains run.
const NFTPriorityDstNAT = -100

// NFTChain is a chain of type nat: a base chain (Hook set) at Priority, or
// a regular chain.
type NFTChain struct {
	Name     string
	Hook     NFTHook
	Priority int32
	Rules    []NFTRule
}

// NFTSetType is a set's key type.
type NFTSetType string

const (
	// NFTSetAddr holds addresses of the table's family.
	NFTSetAddr NFTSetType = "addr"
	// NFTSetAddrPort holds address . TCP port pairs.
	NFTSetAddrPort NFTSetType = "addr . port"
)

// NFTSet is a set's definition.
type NFTSet struct {
	Name string
	Type NFTSetType
	// Timeout, when set, gives the set the timeout flag and this default
	// timeout for elements added without one (by a rule's update).
	Timeout time.Duration
	// Size bounds the elements (0: the kernel's default).
	Size uint32
}

// NFTElement is a set element.
type NFTElement struct {
	Addr netip.Addr
	// Port is the TCP port of an NFTSetAddrPort element.
	Port uint16
	// Timeout is the element's own timeout when added (0: the set's).
	Timeout time.Duration
	// Expires is the time it has left, when read.
	Expires time.Duration
}

// NFTRule is one rule of the small language the redirect uses. Every match
// that is set must hold; exactly one action is set.
type NFTRule struct {
	// Matches.
	MarkMask   uint32       // meta mark & MarkMask == MarkMask
	SrcSet     string       // ip saddr @SrcSet
	SrcPrefix  netip.Prefix // ip saddr SrcPrefix
	InIface    string       // iifname; a trailing "*" makes it a prefix
	DstAddr    netip.Addr   // ip daddr
	TCPDstPort uint16       // meta l4proto tcp, th dport
	DstSet     string       // ip daddr @DstSet
	// Actions.
	Return    bool
	Jump      string
	DNAT      netip.AddrPort
	UpdateSet string // update @UpdateSet { ip saddr . tcp sport }: non-terminal
	// Note is the human-readable part of the rule's comment.
	Note string
}

// String is the rule in nft's syntax, for logs and tests.
func (r NFTRule) String() string {
	var b []string
	if r.MarkMask != 0 {
		b = append(b, fmt.Sprintf("meta mark & 0x%x == 0x%x", r.MarkMask, r.MarkMask))
	}
	if r.SrcSet != "" {
		b = append(b, "ip saddr @"+r.SrcSet)
	}
	if r.SrcPrefix.IsValid() {
		b = append(b, "ip saddr "+r.SrcPrefix.String())
	}
	if r.InIface != "" {
		b = append(b, strconv.Quote(r.InIface))
		b[len(b)-1] = "iifname " + b[len(b)-1]
	}
	if r.DstAddr.IsValid() {
		b = append(b, "ip daddr "+r.DstAddr.String())
	}
	if r.TCPDstPort != 0 {
		b = append(b, "tcp dport "+strconv.Itoa(int(r.TCPDstPort)))
	}
	if r.DstSet != "" {
		b = append(b, "ip daddr @"+r.DstSet)
	}
	switch {
	case r.UpdateSet != "":
		b = append(b, "update @"+r.UpdateSet+" { ip saddr . tcp sport }")
	case r.Return:
		b = append(b, "return")
	case r.Jump != "":
		b = append(b, "jump "+r.Jump)
	case r.DNAT.IsValid():
		b = append(b, "dnat to "+r.DNAT.String())
	}
	return strings.Join(b, " ")
}

// Comment is what the rule carries in the kernel: its note and a digest of
// the whole rule, so that a rule read back is known to be exactly this one.
func (r NFTRule) Comment() string {
	sum := sha256.Sum256([]byte(r.String()))
	c := r.Note
	if len(c) > 100 {
		c = c[:100]
	}
	return c + " [" + hex.EncodeToString(sum[:6]) + "]"
}

// validate checks that exactly one action is set.
func (r NFTRule) validate() error {
	n := 0
	for _, set := range []bool{r.Return, r.Jump != "", r.DNAT.IsValid(), r.UpdateSet != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("nftables rule %q: want exactly one action, have %d", r.String(), n)
	}
	return nil
}

// NFTOpKind is one operation of a transaction.
type NFTOpKind int

const (
	NFTAddTable NFTOpKind = iota
	NFTAddSet
	NFTDeleteSet
	NFTAddChain
	NFTFlushChain
	NFTDeleteChain
	NFTAddRule
)

// NFTOp is one operation; Chain names the chain of a rule operation.
type NFTOp struct {
	Kind  NFTOpKind
	Set   NFTSet
	Chain NFTChain
	Rule  NFTRule
}

// NFTTransaction is a batch of operations on one table.
type NFTTransaction struct {
	Family Family
	Table  string
	Ops    []NFTOp
}

// NFTRedirectSpec describes the agent's table for one family.
type NFTRedirectSpec struct {
	Family Family
	Table  string
	// Priority of the prerouting and output base chains.
	Priority int32
	// Chain is the regular chain both base chains jump to, with its rules.
	Chain NFTChain
	// Local restricts the prerouting jump to this node's own pods (its
	// match fields only); the output jump is unconditional.
	Local NFTRule
	Sets  []NFTSet
}

// Base chain names in the agent's table.
const (
	NFTPreroutingChain = "prerouting"
	NFTOutputChain     = "output"
)

// chains returns the spec's three chains with their rules.
func (s *NFTRedirectSpec) chains() []NFTChain {
	jump := s.Local
	jump.Return, jump.DNAT, jump.UpdateSet = false, netip.AddrPort{}, ""
	jump.Jump = s.Chain.Name
	jump.Note = "kube-apicache: this node's own pods to the redirect"
	out := NFTRule{Jump: s.Chain.Name, Note: "kube-apicache: the host to the redirect"}
	return []NFTChain{
		{Name: s.Chain.Name, Rules: s.Chain.Rules},
		{Name: NFTPreroutingChain, Hook: NFTHookPrerouting, Priority: s.Priority, Rules: []NFTRule{jump}},
		{Name: NFTOutputChain, Hook: NFTHookOutput, Priority: s.Priority, Rules: []NFTRule{out}},
	}
}

// NFTRedirect keeps the agent's table as its spec says.
type NFTRedirect struct {
	nft  NFTables
	mu   sync.Mutex
	spec NFTRedirectSpec
}

// NewNFTRedirect returns a redirect for spec; it changes nothing yet.
func NewNFTRedirect(nft NFTables, spec NFTRedirectSpec) *NFTRedirect {
	return &NFTRedirect{nft: nft, spec: spec}
}

// Spec returns the spec.
func (r *NFTRedirect) Spec() NFTRedirectSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spec
}

// SetSpec replaces the spec; the next Sync applies it.
func (r *NFTRedirect) SetSpec(spec NFTRedirectSpec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spec = spec
}

// Sync makes the table hold the spec's sets and chains, in one
// transaction, and leaves the elements of unchanged sets alone. When
// anything differs, every chain is flushed and refilled: a chain whose hook
// or priority differs is recreated, a set whose definition differs is
// recreated (empty), and chains and sets the spec does not have are
// deleted. setCreated reports a set created (empty); res reports the chain
// changes like ChainSyncer's (JumpsFixed names the base chains created).
func (r *NFTRedirect) Sync() (setCreated bool, res SyncResult, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spec := r.spec
	want := spec.chains()
	for _, c := range want {
		for _, rule := range c.Rules {
			if err := rule.validate(); err != nil {
				return false, res, err
			}
		}
	}
	have, err := r.nft.ListTable(spec.Family, spec.Table)
	if err != nil {
		return false, res, fmt.Errorf("listing table %s %s: %w", NFTFamilyName(spec.Family), spec.Table, err)
	}
	if have == nil {
		have = &NFTTable{}
	}
	sameDef := func(h *NFTChain, w NFTChain) bool {
		return h != nil && h.Hook == w.Hook && (w.Hook == "" || h.Priority == w.Priority)
	}
	inSync := len(have.Chains) == len(want) && len(have.Sets) == len(spec.Sets)
	for _, w := range want {
		h := have.Chain(w.Name)
		inSync = inSync && sameDef(h, w) && sameRules(h.Rules, w.Rules)
	}
	for _, w := range spec.Sets {
		h := have.Set(w.Name)
		inSync = inSync && h != nil && *h == w
	}
	if inSync {
		return false, res, nil
	}

	tx := &NFTTransaction{Family: spec.Family, Table: spec.Table, Ops: []NFTOp{{Kind: NFTAddTable}}}
	// Rules go first: a chain or set can only be deleted once no rule
	// uses it.
	for _, c := range have.Chains {
		tx.Ops = append(tx.Ops, NFTOp{Kind: NFTFlushChain, Chain: NFTChain{Name: c.Name}})
	}
	for _, c := range have.Chains {
		if w := chainNamed(want, c.Name); w == nil || !sameDef(&c, *w) {
			tx.Ops = append(tx.Ops, NFTOp{Kind: NFTDeleteChain, Chain: NFTChain{Name: c.Name}})
		}
	}
	for _, s := range have.Sets {
		if w := setNamed(spec.Sets, s.Name); w == nil || *w != s {
			tx.Ops = append(tx.Ops, NFTOp{Kind: NFTDeleteSet, Set: NFTSet{Name: s.Name}})
		}
	}
	for _, s := range spec.Sets {
		if h := have.Set(s.Name); h == nil || *h != s {
			setCreated = true
			tx.Ops = append(tx.Ops, NFTOp{Kind: NFTAddSet, Set: s})
		}
	}
	// The regular chain comes first in want: it is filled before the base
	// chains that jump to it are.
	for _, w := range want {
		h := have.Chain(w.Name)
		if !sameDef(h, w) {
			tx.Ops = append(tx.Ops, NFTOp{Kind: NFTAddChain, Chain: NFTChain{Name: w.Name, Hook: w.Hook, Priority: w.Priority}})
			if w.Hook != "" {
				res.JumpsFixed = append(res.JumpsFixed, w.Name)
			} else {
				res.ChainCreated = true
			}
		} else {
			res.RulesRewritten = true
		}
		for _, rule := range w.Rules {
			tx.Ops = append(tx.Ops, NFTOp{Kind: NFTAddRule, Chain: NFTChain{Name: w.Name}, Rule: rule})
		}
	}
	if err := r.nft.Apply(tx); err != nil {
		return false, SyncResult{}, fmt.Errorf("writing table %s %s: %w", NFTFamilyName(spec.Family), spec.Table, err)
	}
	return setCreated, res, nil
}

// RemoveRules deletes the table's chains, so that nothing is redirected,
// and keeps its sets and their elements.
func (r *NFTRedirect) RemoveRules() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	have, err := r.nft.ListTable(r.spec.Family, r.spec.Table)
	if err != nil || have == nil || len(have.Chains) == 0 {
		return err
	}
	tx := &NFTTransaction{Family: r.spec.Family, Table: r.spec.Table}
	for _, c := range have.Chains {
		tx.Ops = append(tx.Ops, NFTOp{Kind: NFTFlushChain, Chain: NFTChain{Name: c.Name}})
	}
	for _, c := range have.Chains {
		tx.Ops = append(tx.Ops, NFTOp{Kind: NFTDeleteChain, Chain: NFTChain{Name: c.Name}})
	}
	return r.nft.Apply(tx)
}

// Present reports whether the table has a base chain, through which it may
// redirect.
func (r *NFTRedirect) Present() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	have, err := r.nft.ListTable(r.spec.Family, r.spec.Table)
	if err != nil || have == nil {
		return false, err
	}
	for _, c := range have.Chains {
		if c.Hook != "" {
			return true, nil
		}
	}
	return false, nil
}

// Remove deletes the whole table, elements included.
func (r *NFTRedirect) Remove() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nft.DeleteTable(r.spec.Family, r.spec.Table)
}

func chainNamed(cs []NFTChain, name string) *NFTChain {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func setNamed(ss []NFTSet, name string) *NFTSet {
	for i := range ss {
		if ss[i].Name == name {
			return &ss[i]
		}
	}
	return nil
}

// sameRules compares rules by their comments, which is all the kernel
// binding reads back.
func sameRules(have, want []NFTRule) bool {
	return slices.EqualFunc(have, want, func(a, b NFTRule) bool { return a.Comment() == b.Comment() || commentOf(a) == b.Comment() })
}

// commentOf is a rule's comment as read back: a rule from the kernel has
// only its Note, which holds the whole comment.
func commentOf(r NFTRule) string { return r.Note }

// NFTTimedSet is a set of addresses with per-element timeouts in the
// agent's table: the liveness and skip sets.
type NFTTimedSet struct {
	nft     NFTables
	family  Family
	table   string
	name    string
	timeout time.Duration
}

// NewNFTTimedSet returns the set name of table; Refresh gives elements
// timeout.
func NewNFTTimedSet(nft NFTables, family Family, table, name string, timeout time.Duration) *NFTTimedSet {
	return &NFTTimedSet{nft: nft, family: family, table: table, name: name, timeout: timeout}
}

// Name returns the set's name.
func (s *NFTTimedSet) Name() string { return s.name }

// Def is the set's definition.
func (s *NFTTimedSet) Def() NFTSet { return NFTSet{Name: s.name, Type: NFTSetAddr, Timeout: s.timeout} }

// Refresh makes ips present for another timeout.
func (s *NFTTimedSet) Refresh(ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	return s.nft.RefreshElements(s.family, s.table, s.name, addrElements(ips, s.timeout))
}

// Clear removes ips; a missing table or set is not an error.
func (s *NFTTimedSet) Clear(ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	err := s.nft.DeleteElements(s.family, s.table, s.name, addrElements(ips, 0))
	if IsNFTNotExist(err) {
		return nil
	}
	return err
}

// Entries returns the addresses in the set.
func (s *NFTTimedSet) Entries() ([]netip.Addr, error) {
	return nftAddrs(s.nft, s.family, s.table, s.name)
}

// NFTAddressSet is a set of addresses without timeouts (this node's pods).
type NFTAddressSet struct {
	nft    NFTables
	family Family
	table  string
	name   string
}

// NewNFTAddressSet returns the set name of table.
func NewNFTAddressSet(nft NFTables, family Family, table, name string) *NFTAddressSet {
	return &NFTAddressSet{nft: nft, family: family, table: table, name: name}
}

// Name returns the set's name.
func (s *NFTAddressSet) Name() string { return s.name }

// Def is the set's definition.
func (s *NFTAddressSet) Def() NFTSet { return NFTSet{Name: s.name, Type: NFTSetAddr} }

// Entries returns the addresses in the set.
func (s *NFTAddressSet) Entries() ([]netip.Addr, error) {
	return nftAddrs(s.nft, s.family, s.table, s.name)
}

// Sync makes the set hold exactly the ips of its family.
func (s *NFTAddressSet) Sync(ips []netip.Addr) (added, removed int, err error) {
	have, err := s.Entries()
	if err != nil {
		return 0, 0, err
	}
	want := map[netip.Addr]bool{}
	for _, ip := range ips {
		if FamilyOf(ip) == s.family {
			want[ip.Unmap()] = true
		}
	}
	var add, del []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, ip := range have {
		seen[ip] = true
		if !want[ip] {
			del = append(del, ip)
		}
	}
	for ip := range want {
		if !seen[ip] {
			add = append(add, ip)
		}
	}
	if len(del) > 0 {
		if err := s.nft.DeleteElements(s.family, s.table, s.name, addrElements(del, 0)); err != nil {
			return 0, 0, err
		}
	}
	if len(add) > 0 {
		if err := s.nft.RefreshElements(s.family, s.table, s.name, addrElements(add, 0)); err != nil {
			return 0, len(del), err
		}
	}
	return len(add), len(del), nil
}

// NFTAttemptSet is the set of redirected connection attempts, by source
// address and port, that the redirect's update rule fills.
type NFTAttemptSet struct {
	nft     NFTables
	family  Family
	table   string
	name    string
	timeout time.Duration
	size    uint32
}

// NewNFTAttemptSet returns the set name of table, whose elements live for
// timeout after their last packet; it holds at most MaxAttempts.
func NewNFTAttemptSet(nft NFTables, family Family, table, name string, timeout time.Duration) *NFTAttemptSet {
	return &NFTAttemptSet{nft: nft, family: family, table: table, name: name, timeout: timeout, size: MaxAttempts}
}

// Name returns the set's name.
func (s *NFTAttemptSet) Name() string { return s.name }

// Def is the set's definition.
func (s *NFTAttemptSet) Def() NFTSet {
	return NFTSet{Name: s.name, Type: NFTSetAddrPort, Timeout: s.timeout, Size: s.size}
}

// Entries returns the attempts in the set.
func (s *NFTAttemptSet) Entries() ([]netip.AddrPort, error) {
	els, err := s.nft.Elements(s.family, s.table, s.name)
	if err != nil {
		if IsNFTNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]netip.AddrPort, 0, len(els))
	for _, e := range els {
		out = append(out, netip.AddrPortFrom(e.Addr, e.Port))
	}
	return out, nil
}

// Forget removes one attempt.
func (s *NFTAttemptSet) Forget(src netip.AddrPort) error {
	err := s.nft.DeleteElements(s.family, s.table, s.name, []NFTElement{{Addr: src.Addr().Unmap(), Port: src.Port()}})
	if IsNFTNotExist(err) {
		return nil
	}
	return err
}

func addrElements(ips []netip.Addr, timeout time.Duration) []NFTElement {
	out := make([]NFTElement, 0, len(ips))
	for _, ip := range ips {
		out = append(out, NFTElement{Addr: ip.Unmap(), Timeout: timeout})
	}
	return out
}

func nftAddrs(nft NFTables, family Family, table, set string) ([]netip.Addr, error) {
	els, err := nft.Elements(family, table, set)
	if err != nil {
		if IsNFTNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]netip.Addr, 0, len(els))
	for _, e := range els {
		out = append(out, e.Addr)
	}
	return out, nil
}

// NFTFamilyName is f's nftables family: ip or ip6.
func NFTFamilyName(f Family) string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// ErrNFTNotExist is returned (wrapped) for a table, chain or set that does
// not exist.
var ErrNFTNotExist = errors.New("nftables object does not exist")

// IsNFTNotExist reports whether err says a table, chain or set does not
// exist.
func IsNFTNotExist(err error) bool { return errors.Is(err, ErrNFTNotExist) }
