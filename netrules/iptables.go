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
//
// Every call names one chain. Nothing here lists a whole table: on a node
// with kube-proxy's rules for thousands of Services, `iptables -t nat -S`
// costs seconds of CPU and hundreds of megabytes, while listing one chain
// costs milliseconds whatever the table holds.
type IPTables interface {
	ChainExists(table, chain string) (bool, error)
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
// built-in chains that must jump to it ahead of certain other rules.
type Chain struct {
	Table string
	Name  string
	// Rules are the chain's contents, in order. Their Table and Chain fields
	// are ignored: they always live in Table/Name.
	Rules [][]string
	// JumpFrom lists built-in chains (PREROUTING, OUTPUT, ...) that must
	// hold exactly one "-j Name" rule. The jump carries Comment so that it
	// is recognisable in iptables-save output.
	JumpFrom []string
	Comment  string
	// JumpMatch holds, per JumpFrom chain, matches the jump from that
	// chain carries ahead of its comment (say, "-s 10.244.0.0/16").
	JumpMatch map[string][]string
	// Before lists the targets (kube-proxy's KUBE-SERVICES) whose jumps the
	// jump to Name must precede. Rules of others may come first: a
	// component that keeps its own jump at the top (Calico's Felix does)
	// and the agent then both stay where they are instead of moving each
	// other on every sync. An empty Before requires the jump to be first.
	Before []string
}

// jumpArgs returns the jump to the chain from the chain from.
func (c *Chain) jumpArgs(from string) []string {
	args := slices.Clone(c.JumpMatch[from])
	return append(args, "-m", "comment", "--comment", c.Comment, "-j", c.Name)
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

	current, err := s.listArgs(c.Name)
	if err != nil {
		// Listing a missing chain fails; so may other trouble. Tell them
		// apart with a second look before creating anything.
		exists, xerr := s.ipt.ChainExists(c.Table, c.Name)
		if xerr != nil || exists {
			return res, errors.Join(err, xerr)
		}
		if err := s.ipt.NewChain(c.Table, c.Name); err != nil {
			return res, fmt.Errorf("creating chain %s/%s: %w", c.Table, c.Name, err)
		}
		res.ChainCreated = true
		s.applied, current = nil, nil
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

// syncJump makes our exact jump rule the only rule of from that jumps or
// goes to the chain, ahead of every rule targeting one of Before (or first,
// with no Before). It reports whether it had to change anything.
func (s *ChainSyncer) syncJump(from string) (bool, error) {
	c := &s.chain
	rules, err := s.list(from)
	if err != nil {
		return false, err
	}
	if s.jumpInPlace(from, rules) {
		return false, nil
	}
	// Remove every jump, then insert ours at the head. Deleting by
	// specification removes the first matching rule, so inserting first
	// would delete the new jump. In between, new connections take
	// kube-proxy's path, which is always safe.
	if err := s.deleteJumps(from); err != nil {
		return false, err
	}
	if err := s.ipt.Insert(c.Table, from, 1, c.jumpArgs(from)...); err != nil {
		return false, fmt.Errorf("inserting jump %s/%s -> %s: %w", c.Table, from, c.Name, err)
	}
	return true, nil
}

// jumpInPlace reports whether rules, a JumpFrom chain's contents, hold our
// exact jump once and no other jump to the chain, placed as Before asks.
func (s *ChainSyncer) jumpInPlace(from string, rules []parsedRule) bool {
	c := &s.chain
	at, ours := -1, 0
	for i, r := range rules {
		t := r.target()
		if t == c.Name {
			ours++
			if slices.Equal(r.args, c.jumpArgs(from)) {
				at = i
			}
			continue
		}
		if at < 0 && (len(c.Before) == 0 || slices.Contains(c.Before, t)) {
			// A rule we must precede comes before our jump (or, with no
			// Before, any rule at all does).
			return false
		}
	}
	return ours == 1 && at >= 0
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
	exists, err := s.ipt.ChainExists(c.Table, c.Name)
	if err != nil {
		return fmt.Errorf("looking for chain %s/%s: %w", c.Table, c.Name, err)
	}
	if !exists {
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
	exists, err := s.ipt.ChainExists(s.chain.Table, s.chain.Name)
	if err != nil {
		return false, fmt.Errorf("looking for chain %s/%s: %w", s.chain.Table, s.chain.Name, err)
	}
	return exists, nil
}
