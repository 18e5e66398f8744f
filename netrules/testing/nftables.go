package testing

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// NFTables is a stateful fake of netrules.NFTables that behaves like the
// kernel where the agent depends on it: transactions apply whole or not at
// all; base chains keep their hook and priority (changing them needs a new
// chain); a chain, or a set, still referenced by a rule cannot be deleted;
// elements expire on an injected clock; and Traverse runs a packet through
// every table's nat base chains of a hook in priority order, ties in
// registration order, the first mapping winning.
type NFTables struct {
	clock clock.PassiveClock

	mu     sync.Mutex // protects the fields below
	tables map[nftKey]*nftTable
	seq    int
	// FailApply, when set, fails every Apply with it.
	FailApply error
	// Applies counts successful transactions.
	Applies int
	// TieLatestFirst, when set, orders base chains of equal priority by
	// registration, latest first, instead of earliest first: the other
	// order the kernel may end up with.
	TieLatestFirst bool
}

type nftKey struct {
	family netrules.Family
	name   string
}

type nftTable struct {
	chains []*nftChain
	sets   map[string]*nftSet
}

type nftChain struct {
	def netrules.NFTChain
	seq int
}

type nftSet struct {
	def netrules.NFTSet
	// elems maps an element to its expiry; zero never expires.
	elems map[netip.AddrPort]time.Time
}

// NewNFTables returns a fake with no tables, whose timeouts follow clk.
func NewNFTables(clk clock.PassiveClock) *NFTables {
	return &NFTables{clock: clk, tables: map[nftKey]*nftTable{}}
}

var _ netrules.NFTables = (*NFTables)(nil)

func notExistNFT(format string, a ...any) error {
	return fmt.Errorf("%w: %s", netrules.ErrNFTNotExist, fmt.Sprintf(format, a...))
}

func (f *NFTables) prune(s *nftSet) {
	now := f.clock.Now()
	for k, exp := range s.elems {
		if !exp.IsZero() && !now.Before(exp) {
			delete(s.elems, k)
		}
	}
}

// ListTable implements netrules.NFTables.
func (f *NFTables) ListTable(family netrules.Family, table string) (*netrules.NFTTable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[nftKey{family, table}]
	if !ok {
		return nil, nil
	}
	out := &netrules.NFTTable{}
	for _, c := range t.chains {
		d := c.def
		d.Rules = slices.Clone(d.Rules)
		out.Chains = append(out.Chains, d)
	}
	names := make([]string, 0, len(t.sets))
	for n := range t.sets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out.Sets = append(out.Sets, t.sets[n].def)
	}
	return out, nil
}

// Tables implements netrules.NFTables.
func (f *NFTables) Tables(family netrules.Family) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.tables {
		if k.family == family {
			out = append(out, k.name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// DeleteTable implements netrules.NFTables.
func (f *NFTables) DeleteTable(family netrules.Family, table string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tables, nftKey{family, table})
	return nil
}

// Apply implements netrules.NFTables: the operations run on a copy, which
// replaces the table only if all of them succeed.
func (f *NFTables) Apply(tx *netrules.NFTTransaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.FailApply != nil {
		return f.FailApply
	}
	key := nftKey{tx.Family, tx.Table}
	orig, exists := f.tables[key]
	t := &nftTable{sets: map[string]*nftSet{}}
	if exists {
		for _, c := range orig.chains {
			cc := *c
			cc.def.Rules = slices.Clone(c.def.Rules)
			t.chains = append(t.chains, &cc)
		}
		for n, s := range orig.sets {
			ss := &nftSet{def: s.def, elems: map[netip.AddrPort]time.Time{}}
			for k, v := range s.elems {
				ss.elems[k] = v
			}
			t.sets[n] = ss
		}
	}
	seq := f.seq
	created := exists
	for i, op := range tx.Ops {
		if !created && op.Kind != netrules.NFTAddTable {
			return notExistNFT("op %d: table %s %s", i, tx.Family, tx.Table)
		}
		if err := t.apply(op, &seq); err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
		created = true
	}
	f.seq = seq
	f.tables[key] = t
	f.Applies++
	return nil
}

func (t *nftTable) chain(name string) (int, *nftChain) {
	for i, c := range t.chains {
		if c.def.Name == name {
			return i, c
		}
	}
	return -1, nil
}

// referenced reports whether a rule of the table jumps to chain or matches
// or updates set.
func (t *nftTable) referenced(chain, set string) bool {
	for _, c := range t.chains {
		for _, r := range c.def.Rules {
			if (chain != "" && r.Jump == chain) ||
				(set != "" && (r.SrcSet == set || r.DstSet == set || r.UpdateSet == set)) {
				return true
			}
		}
	}
	return false
}

func (t *nftTable) apply(op netrules.NFTOp, seq *int) error {
	switch op.Kind {
	case netrules.NFTAddTable:
		return nil
	case netrules.NFTAddSet:
		if s, ok := t.sets[op.Set.Name]; ok {
			if s.def != op.Set {
				return fmt.Errorf("set %s exists with another definition", op.Set.Name)
			}
			return nil
		}
		t.sets[op.Set.Name] = &nftSet{def: op.Set, elems: map[netip.AddrPort]time.Time{}}
	case netrules.NFTDeleteSet:
		if _, ok := t.sets[op.Set.Name]; !ok {
			return notExistNFT("set %s", op.Set.Name)
		}
		if t.referenced("", op.Set.Name) {
			return fmt.Errorf("set %s: device or resource busy", op.Set.Name)
		}
		delete(t.sets, op.Set.Name)
	case netrules.NFTAddChain:
		if _, c := t.chain(op.Chain.Name); c != nil {
			if c.def.Hook != op.Chain.Hook || c.def.Priority != op.Chain.Priority {
				return fmt.Errorf("chain %s exists with another hook or priority", op.Chain.Name)
			}
			return nil
		}
		*seq++
		t.chains = append(t.chains, &nftChain{def: netrules.NFTChain{Name: op.Chain.Name, Hook: op.Chain.Hook, Priority: op.Chain.Priority}, seq: *seq})
	case netrules.NFTFlushChain:
		_, c := t.chain(op.Chain.Name)
		if c == nil {
			return notExistNFT("chain %s", op.Chain.Name)
		}
		c.def.Rules = nil
	case netrules.NFTDeleteChain:
		i, c := t.chain(op.Chain.Name)
		if c == nil {
			return notExistNFT("chain %s", op.Chain.Name)
		}
		if len(c.def.Rules) > 0 || t.referenced(op.Chain.Name, "") {
			return fmt.Errorf("chain %s: device or resource busy", op.Chain.Name)
		}
		t.chains = slices.Delete(t.chains, i, i+1)
	case netrules.NFTAddRule:
		_, c := t.chain(op.Chain.Name)
		if c == nil {
			return notExistNFT("chain %s", op.Chain.Name)
		}
		r := op.Rule
		for _, s := range []string{r.SrcSet, r.DstSet, r.UpdateSet} {
			if s != "" && t.sets[s] == nil {
				return notExistNFT("set %s", s)
			}
		}
		if r.Jump != "" {
			if _, target := t.chain(r.Jump); target == nil || target.def.Hook != "" {
				return notExistNFT("jump target %s", r.Jump)
			}
		}
		c.def.Rules = append(c.def.Rules, r)
	default:
		return fmt.Errorf("unknown operation %d", op.Kind)
	}
	return nil
}

func (f *NFTables) set(family netrules.Family, table, set string) (*nftSet, error) {
	t, ok := f.tables[nftKey{family, table}]
	if !ok {
		return nil, notExistNFT("table %s %s", family, table)
	}
	s, ok := t.sets[set]
	if !ok {
		return nil, notExistNFT("set %s", set)
	}
	f.prune(s)
	return s, nil
}

func elemKey(s *nftSet, e netrules.NFTElement) (netip.AddrPort, error) {
	if s.def.Type == netrules.NFTSetAddr && e.Port != 0 {
		return netip.AddrPort{}, errors.New("a port in an address set")
	}
	return netip.AddrPortFrom(e.Addr.Unmap(), e.Port), nil
}

// Elements implements netrules.NFTables.
func (f *NFTables) Elements(family netrules.Family, table, set string) ([]netrules.NFTElement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.set(family, table, set)
	if err != nil {
		return nil, err
	}
	now := f.clock.Now()
	var out []netrules.NFTElement
	for k, exp := range s.elems {
		e := netrules.NFTElement{Addr: k.Addr(), Port: k.Port()}
		if !exp.IsZero() {
			e.Expires = exp.Sub(now)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		return netip.AddrPortFrom(out[i].Addr, out[i].Port).Compare(netip.AddrPortFrom(out[j].Addr, out[j].Port)) < 0
	})
	return out, nil
}

// RefreshElements implements netrules.NFTables.
func (f *NFTables) RefreshElements(family netrules.Family, table, set string, elems []netrules.NFTElement) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.set(family, table, set)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if netrules.FamilyOf(e.Addr) != family {
			return fmt.Errorf("element %s of the wrong family", e.Addr)
		}
		if e.Timeout != 0 && s.def.Timeout == 0 {
			return fmt.Errorf("a timeout in set %s without the timeout flag", set)
		}
	}
	for _, e := range elems {
		k, err := elemKey(s, e)
		if err != nil {
			return err
		}
		timeout := e.Timeout
		if timeout == 0 {
			timeout = s.def.Timeout
		}
		var exp time.Time
		if timeout > 0 {
			exp = f.clock.Now().Add(timeout)
		}
		s.elems[k] = exp
	}
	return nil
}

// DeleteElements implements netrules.NFTables.
func (f *NFTables) DeleteElements(family netrules.Family, table, set string, elems []netrules.NFTElement) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.set(family, table, set)
	if err != nil {
		return err
	}
	for _, e := range elems {
		k, err := elemKey(s, e)
		if err != nil {
			return err
		}
		delete(s.elems, k)
	}
	return nil
}

// Contains reports whether a set holds addr (an unexpired element).
func (f *NFTables) Contains(family netrules.Family, table, set string, addr netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.set(family, table, set)
	if err != nil {
		return false
	}
	_, ok := s.elems[netip.AddrPortFrom(addr.Unmap(), 0)]
	return ok
}

// NFTPacket is a new TCP connection's first packet as nat base chains see
// it. Src and InIface are unset for a packet of the host itself (output).
type NFTPacket struct {
	Src     netip.AddrPort
	InIface string
	Dst     netip.AddrPort
	Mark    uint32
}

// Traverse runs p through every nat base chain of family at hook, in
// priority order (ties by registration), and returns the table and the
// address of the first DNAT, or "" if none applies. Update rules add their
// element as the kernel's would.
func (f *NFTables) Traverse(family netrules.Family, hook netrules.NFTHook, p NFTPacket) (table, to string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type base struct {
		table string
		t     *nftTable
		c     *nftChain
	}
	var bases []base
	for k, t := range f.tables {
		if k.family != family {
			continue
		}
		for _, c := range t.chains {
			if c.def.Hook == hook {
				bases = append(bases, base{k.name, t, c})
			}
		}
	}
	sort.Slice(bases, func(i, j int) bool {
		if bases[i].c.def.Priority != bases[j].c.def.Priority {
			return bases[i].c.def.Priority < bases[j].c.def.Priority
		}
		if f.TieLatestFirst {
			return bases[i].c.seq > bases[j].c.seq
		}
		return bases[i].c.seq < bases[j].c.seq
	})
	for _, b := range bases {
		to, err := f.walk(b.t, b.c, p, 0)
		if err != nil || to != "" {
			return b.table, to, err
		}
	}
	return "", "", nil
}

// walk evaluates chain c for p; it returns the DNAT target, or "" when the
// chain ends or returns.
func (f *NFTables) walk(t *nftTable, c *nftChain, p NFTPacket, depth int) (string, error) {
	if depth > 16 {
		return "", fmt.Errorf("jumps too deep at %s", c.def.Name)
	}
	for _, r := range c.def.Rules {
		if !f.matches(t, r, p) {
			continue
		}
		switch {
		case r.Return:
			return "", nil
		case r.Jump != "":
			_, target := t.chain(r.Jump)
			if target == nil {
				return "", notExistNFT("chain %s", r.Jump)
			}
			to, err := f.walk(t, target, p, depth+1)
			if err != nil || to != "" {
				return to, err
			}
		case r.DNAT.IsValid():
			return r.DNAT.String(), nil
		case r.UpdateSet != "":
			if !p.Src.IsValid() {
				continue // a host packet whose source the fake does not model
			}
			s := t.sets[r.UpdateSet]
			var exp time.Time
			if s.def.Timeout > 0 {
				exp = f.clock.Now().Add(s.def.Timeout)
			}
			s.elems[netip.AddrPortFrom(p.Src.Addr(), p.Src.Port())] = exp
		}
	}
	return "", nil
}

func (f *NFTables) in(t *nftTable, set string, a netip.AddrPort) bool {
	s, ok := t.sets[set]
	if !ok || !a.Addr().IsValid() {
		return false
	}
	f.prune(s)
	_, ok = s.elems[a]
	return ok
}

func (f *NFTables) matches(t *nftTable, r netrules.NFTRule, p NFTPacket) bool {
	src := p.Src.Addr()
	switch {
	case r.MarkMask != 0 && p.Mark&r.MarkMask != r.MarkMask,
		r.SrcSet != "" && !f.in(t, r.SrcSet, netip.AddrPortFrom(src, 0)),
		r.SrcPrefix.IsValid() && (!src.IsValid() || !r.SrcPrefix.Contains(src)),
		r.DstAddr.IsValid() && p.Dst.Addr() != r.DstAddr,
		r.TCPDstPort != 0 && p.Dst.Port() != r.TCPDstPort,
		r.DstSet != "" && !f.in(t, r.DstSet, netip.AddrPortFrom(p.Dst.Addr(), 0)):
		return false
	}
	if r.InIface != "" {
		if prefix, ok := strings.CutSuffix(r.InIface, "*"); ok {
			return p.InIface != "" && strings.HasPrefix(p.InIface, prefix)
		}
		return p.InIface == r.InIface
	}
	return true
}
