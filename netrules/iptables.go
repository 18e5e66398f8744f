package netrules

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/coreos/go-iptables/iptables"
)

// IPTables is the subset of go-iptables that this package uses. List returns
// `iptables -S` lines: "-N C" or "-P C POLICY" first, then "-A C ..." rules.
type IPTables interface {
	ListChains(table string) ([]string, error)
	List(table, chain string) ([]string, error)
	NewChain(table, chain string) error
	Insert(table, chain string, pos int, rulespec ...string) error
	Append(table, chain string, rulespec ...string) error
	Delete(table, chain string, rulespec ...string) error
	ClearChain(table, chain string) error
	DeleteChain(table, chain string) error
}

var _ IPTables = (*iptables.IPTables)(nil)

// IsNotExist reports whether err says that a chain or rule does not exist.
func IsNotExist(err error) bool {
	var e interface{ IsNotExist() bool }
	return errors.As(err, &e) && e.IsNotExist()
}

// Chain describes one chain owned by the caller: its full contents, and the
// built-in chains that must jump to it as their very first rule.
type Chain struct {
	Table string
	Name  string
	// Rules are the chain's contents, in order. Their Table and Chain fields
	// are ignored: they always live in Table/Name.
	Rules [][]string
	// JumpFrom lists built-in chains (PREROUTING, OUTPUT, ...) whose first
	// rule must be "-j Name". The jump carries Comment so that it is
	// recognisable in iptables-save output.
	JumpFrom []string
	Comment  string
}

func (c *Chain) jumpArgs() []string {
	return []string{"-m", "comment", "--comment", c.Comment, "-j", c.Name}
}

// ChainSyncer makes the kernel's iptables state match a Chain and removes it
// again. Sync is idempotent and adopts state left by an earlier process (a
// chain with the same name, jumps with the same target) instead of
// duplicating it.
type ChainSyncer struct {
	ipt   IPTables
	chain Chain

	mu sync.Mutex // protects the field below
	// applied is the chain's content as the kernel printed it right after the
	// last rewrite; a differing listing means someone changed the chain.
	applied [][]string
}

// NewChainSyncer returns a syncer for chain using ipt.
func NewChainSyncer(ipt IPTables, chain Chain) *ChainSyncer {
	return &ChainSyncer{ipt: ipt, chain: chain}
}

// SyncResult says what a Sync had to change.
type SyncResult struct {
	ChainCreated   bool
	RulesRewritten bool
	JumpsFixed     []string
}

// Changed reports whether the sync changed anything.
func (r SyncResult) Changed() bool {
	return r.ChainCreated || r.RulesRewritten || len(r.JumpsFixed) > 0
}

// Sync brings the chain, its rules and the jumps to it into the desired state.
// The chain is filled before any jump to it is (re)inserted, so traffic never
// enters a half-written chain.
func (s *ChainSyncer) Sync() (SyncResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var res SyncResult
	c := &s.chain

	chains, err := s.ipt.ListChains(c.Table)
	if err != nil {
		return res, fmt.Errorf("listing chains of table %s: %w", c.Table, err)
	}
	if !slices.Contains(chains, c.Name) {
		if err := s.ipt.NewChain(c.Table, c.Name); err != nil {
			return res, fmt.Errorf("creating chain %s/%s: %w", c.Table, c.Name, err)
		}
		res.ChainCreated = true
		s.applied = nil
	}

	current, err := s.listArgs(c.Name)
	if err != nil {
		return res, err
	}
	if s.applied == nil || !slices.EqualFunc(current, s.applied, slices.Equal[[]string]) {
		if err := s.rewrite(); err != nil {
			return res, err
		}
		res.RulesRewritten = true
	}

	for _, from := range c.JumpFrom {
		fixed, err := s.syncJump(from)
		if err != nil {
			return res, err
		}
		if fixed {
			res.JumpsFixed = append(res.JumpsFixed, from)
		}
	}
	return res, nil
}

// rewrite flushes the chain and appends the desired rules, then remembers the
// kernel's own rendering of them for later comparisons.
func (s *ChainSyncer) rewrite() error {
	c := &s.chain
	s.applied = nil
	if err := s.ipt.ClearChain(c.Table, c.Name); err != nil {
		return fmt.Errorf("flushing chain %s/%s: %w", c.Table, c.Name, err)
	}
	for _, r := range c.Rules {
		if err := s.ipt.Append(c.Table, c.Name, r...); err != nil {
			return fmt.Errorf("appending to chain %s/%s: %w", c.Table, c.Name, err)
		}
	}
	got, err := s.listArgs(c.Name)
	if err != nil {
		return err
	}
	if len(got) != len(c.Rules) {
		return fmt.Errorf("chain %s/%s has %d rules after rewrite, want %d", c.Table, c.Name, len(got), len(c.Rules))
	}
	s.applied = got
	return nil
}

// listArgs returns the arguments of every rule in chain.
func (s *ChainSyncer) listArgs(chain string) ([][]string, error) {
	rules, err := s.list(chain)
	if err != nil {
		return nil, err
	}
	out := make([][]string, len(rules))
	for i, r := range rules {
		out[i] = r.args
	}
	return out, nil
}

func (s *ChainSyncer) list(chain string) ([]parsedRule, error) {
	lines, err := s.ipt.List(s.chain.Table, chain)
	if err != nil {
		return nil, fmt.Errorf("listing chain %s/%s: %w", s.chain.Table, chain, err)
	}
	return parseRules(lines), nil
}

// syncJump makes our exact jump rule the first rule of from, and the only
// rule there that jumps or goes to the chain. It reports whether it had to
// change anything.
func (s *ChainSyncer) syncJump(from string) (bool, error) {
	c := &s.chain
	rules, err := s.list(from)
	if err != nil {
		return false, err
	}
	var ours int
	for _, r := range rules {
		if r.target() == c.Name {
			ours++
		}
	}
	if ours == 1 && slices.Equal(rules[0].args, c.jumpArgs()) {
		return false, nil
	}
	// Remove every jump, then insert ours at the head. Deleting by
	// specification removes the first matching rule, so inserting first
	// would delete the new jump. In between, new connections take
	// kube-proxy's path, which is always safe.
	if err := s.deleteJumps(from); err != nil {
		return false, err
	}
	if err := s.ipt.Insert(c.Table, from, 1, c.jumpArgs()...); err != nil {
		return false, fmt.Errorf("inserting jump %s/%s -> %s: %w", c.Table, from, c.Name, err)
	}
	return true, nil
}

// deleteJumps removes every rule of from that jumps or goes to the chain.
// Rules are deleted by their full specification, never by position, so that
// a concurrent change by another component (kube-proxy, a CNI plugin)
// cannot make us delete its rule.
func (s *ChainSyncer) deleteJumps(from string) error {
	c := &s.chain
	rules, err := s.list(from)
	if err != nil {
		return err
	}
	for _, r := range rules {
		if r.target() != c.Name {
			continue
		}
		if err := s.ipt.Delete(c.Table, from, r.args...); err != nil && !IsNotExist(err) {
			return fmt.Errorf("deleting jump from %s/%s: %w", c.Table, from, err)
		}
	}
	return nil
}

// Remove deletes every jump to the chain from the JumpFrom chains, then the
// chain itself. Jumps go first, so that traffic stops entering the chain
// before it changes. Missing state is not an error, and Remove creates
// nothing: a node that never had the chain is left untouched.
func (s *ChainSyncer) Remove() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.chain
	s.applied = nil
	var errs []error
	for _, from := range c.JumpFrom {
		if err := s.deleteJumps(from); err != nil && !IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// A jump may remain: keep the chain it points to.
		return errors.Join(errs...)
	}
	chains, err := s.ipt.ListChains(c.Table)
	if err != nil {
		return fmt.Errorf("listing chains of table %s: %w", c.Table, err)
	}
	if !slices.Contains(chains, c.Name) {
		return nil
	}
	if err := s.ipt.ClearChain(c.Table, c.Name); err != nil {
		return fmt.Errorf("flushing chain %s/%s: %w", c.Table, c.Name, err)
	}
	if err := s.ipt.DeleteChain(c.Table, c.Name); err != nil && !IsNotExist(err) {
		return fmt.Errorf("deleting chain %s/%s: %w", c.Table, c.Name, err)
	}
	return nil
}

// Present reports whether the chain exists in the kernel, whoever created
// it: on shutdown, a chain that reappeared after Remove means a successor
// has taken over.
func (s *ChainSyncer) Present() (bool, error) {
	chains, err := s.ipt.ListChains(s.chain.Table)
	if err != nil {
		return false, fmt.Errorf("listing chains of table %s: %w", s.chain.Table, err)
	}
	return slices.Contains(chains, s.chain.Name), nil
}
