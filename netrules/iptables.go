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
	applied []string
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

	current, err := s.ipt.List(c.Table, c.Name)
	if err != nil {
		return res, fmt.Errorf("listing chain %s/%s: %w", c.Table, c.Name, err)
	}
	current = ruleLines(current)
	if s.applied == nil || !slices.Equal(current, s.applied) {
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
	got, err := s.ipt.List(c.Table, c.Name)
	if err != nil {
		return fmt.Errorf("listing chain %s/%s: %w", c.Table, c.Name, err)
	}
	got = ruleLines(got)
	if len(got) != len(c.Rules) {
		return fmt.Errorf("chain %s/%s has %d rules after rewrite, want %d", c.Table, c.Name, len(got), len(c.Rules))
	}
	s.applied = got
	return nil
}

// syncJump makes "-j Name" the first rule of from, and the only jump to Name
// there. It reports whether it had to change anything.
func (s *ChainSyncer) syncJump(from string) (bool, error) {
	c := &s.chain
	lines, err := s.ipt.List(c.Table, from)
	if err != nil {
		return false, fmt.Errorf("listing chain %s/%s: %w", c.Table, from, err)
	}
	rules := ruleLines(lines)
	var jumps int
	for _, l := range rules {
		if jumpTarget(l) == c.Name {
			jumps++
		}
	}
	if jumps == 1 && jumpTarget(rules[0]) == c.Name {
		return false, nil
	}
	// Insert the new jump first, then drop every other one: there is never a
	// moment without a jump at the head of the chain.
	if err := s.ipt.Insert(c.Table, from, 1, c.jumpArgs()...); err != nil {
		return false, fmt.Errorf("inserting jump %s/%s -> %s: %w", c.Table, from, c.Name, err)
	}
	for i := jumps; i > 0; i-- {
		if err := s.deleteLastJump(from); err != nil {
			return false, err
		}
	}
	return true, nil
}

// deleteLastJump removes the last rule of from that jumps to the chain. It
// deletes by position so that jumps written by other versions (other
// comments or matches) are removed as well.
func (s *ChainSyncer) deleteLastJump(from string) error {
	c := &s.chain
	lines, err := s.ipt.List(c.Table, from)
	if err != nil {
		return fmt.Errorf("listing chain %s/%s: %w", c.Table, from, err)
	}
	rules := ruleLines(lines)
	for i := len(rules) - 1; i >= 0; i-- {
		if jumpTarget(rules[i]) == c.Name {
			if err := s.ipt.Delete(c.Table, from, fmt.Sprint(i+1)); err != nil {
				return fmt.Errorf("deleting jump %d of %s/%s: %w", i+1, c.Table, from, err)
			}
			return nil
		}
	}
	return nil
}

// Remove deletes every jump to the chain from the JumpFrom chains, then the
// chain itself. Jumps go first, so that traffic stops entering the chain
// before it changes. Missing state is not an error.
func (s *ChainSyncer) Remove() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.chain
	s.applied = nil
	var errs []error
	for _, from := range c.JumpFrom {
		for {
			lines, err := s.ipt.List(c.Table, from)
			if err != nil {
				if !IsNotExist(err) {
					errs = append(errs, fmt.Errorf("listing chain %s/%s: %w", c.Table, from, err))
				}
				break
			}
			found := false
			for _, l := range ruleLines(lines) {
				if jumpTarget(l) == c.Name {
					found = true
					break
				}
			}
			if !found {
				break
			}
			if err := s.deleteLastJump(from); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if err := s.ipt.ClearChain(c.Table, c.Name); err != nil && !IsNotExist(err) {
		errs = append(errs, fmt.Errorf("flushing chain %s/%s: %w", c.Table, c.Name, err))
	}
	if err := s.ipt.DeleteChain(c.Table, c.Name); err != nil && !IsNotExist(err) {
		errs = append(errs, fmt.Errorf("deleting chain %s/%s: %w", c.Table, c.Name, err))
	}
	return errors.Join(errs...)
}
