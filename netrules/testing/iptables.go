// Package testing holds stateful fakes of the kernel interfaces in package
// netrules. They keep tables, chains, rules, links and addresses, and refuse
// the operations the kernel would refuse, so tests observe real outcomes
// rather than call counts.
package testing

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// builtinChains are the chains each table starts with.
var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// builtinTargets are targets that are not chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "DNAT": true,
	"SNAT": true, "MASQUERADE": true, "REDIRECT": true, "MARK": true, "LOG": true,
	"CONNMARK": true, "NOTRACK": true, "CT": true, "SET": true,
}

// Error is returned for operations the kernel would refuse.
type Error struct {
	msg      string
	notExist bool
}

func (e *Error) Error() string    { return e.msg }
func (e *Error) IsNotExist() bool { return e.notExist }
func notExist(f string, a ...any) error {
	return &Error{msg: fmt.Sprintf(f, a...), notExist: true}
}

type table struct {
	chains map[string][]string // chain -> rule argument strings, in order
}

// IPTables is a fake of netrules.IPTables.
type IPTables struct {
	// v6 makes the fake an ip6tables; only sets of its family can be
	// matched.
	v6 bool

	mu     sync.Mutex // protects the fields below
	tables map[string]*table
	sets   *IPSet
	// Calls counts mutating calls, so tests can assert that a sync of an
	// already correct state changes nothing.
	Calls int
}

// NewIPTables returns a fake with the built-in tables and chains.
func NewIPTables() *IPTables {
	f := &IPTables{tables: map[string]*table{}}
	for name, chains := range builtinChains {
		t := &table{chains: map[string][]string{}}
		for _, c := range chains {
			t.chains[c] = nil
		}
		f.tables[name] = t
	}
	return f
}

// NewIP6Tables returns an ip6tables fake with the built-in tables and chains.
func NewIP6Tables() *IPTables {
	f := NewIPTables()
	f.v6 = true
	return f
}

// UseSets makes rules with "-m set --match-set NAME" refer to sets in s, as
// the kernel does: such a rule is refused while the set does not exist or
// is of the other family, and the set cannot be destroyed while a rule
// refers to it. Without UseSets every set match is refused.
func (f *IPTables) UseSets(s *IPSet) {
	f.mu.Lock()
	f.sets = s
	f.mu.Unlock()
	s.mu.Lock()
	prev := s.inUse
	s.inUse = func(name string) bool {
		return f.referencesSet(name) || (prev != nil && prev(name))
	}
	s.mu.Unlock()
}

// referencesSet reports whether any rule matches set name.
func (f *IPTables) referencesSet(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.tables {
		for _, rules := range t.chains {
			for _, r := range rules {
				if slices.Contains(matchSets(strings.Fields(r)), name) {
					return true
				}
			}
		}
	}
	return false
}

func matchSets(rulespec []string) []string {
	var out []string
	for i := 0; i+1 < len(rulespec); i++ {
		if rulespec[i] == "--match-set" || rulespec[i] == "--add-set" {
			out = append(out, strings.Trim(rulespec[i+1], `"`))
		}
	}
	return out
}

// checkSets refuses rules matching sets that do not exist or are of the
// other family.
func (f *IPTables) checkSets(rulespec []string) error {
	for _, name := range matchSets(rulespec) {
		if f.sets == nil {
			return &Error{msg: fmt.Sprintf("Set %s doesn't exist.\n", name)}
		}
		family, ok := f.sets.exists(name)
		if !ok {
			return &Error{msg: fmt.Sprintf("Set %s doesn't exist.\n", name)}
		}
		if (family == unix.AF_INET6) != f.v6 {
			return &Error{msg: fmt.Sprintf("The protocol family of set %s is incompatible.\n", name)}
		}
	}
	return nil
}

func isBuiltin(tbl, chain string) bool { return slices.Contains(builtinChains[tbl], chain) }

func (f *IPTables) table(name string) (*table, error) {
	t, ok := f.tables[name]
	if !ok {
		return nil, notExist("can't initialize iptables table `%s': Table does not exist", name)
	}
	return t, nil
}

func (f *IPTables) chain(tbl, chain string) (*table, error) {
	t, err := f.table(tbl)
	if err != nil {
		return nil, err
	}
	if _, ok := t.chains[chain]; !ok {
		return nil, notExist("iptables: No chain/target/match by that name.\n")
	}
	return t, nil
}

// checkTarget refuses jumps to chains that do not exist, as the kernel does.
func (f *IPTables) checkTarget(t *table, rulespec []string) error {
	for i := 0; i+1 < len(rulespec); i++ {
		if rulespec[i] == "-j" || rulespec[i] == "-g" {
			target := rulespec[i+1]
			if builtinTargets[target] {
				return nil
			}
			if _, ok := t.chains[target]; !ok {
				return notExist("iptables: No chain/target/match by that name.\n")
			}
		}
	}
	return nil
}

func render(rulespec []string) string {
	out := make([]string, len(rulespec))
	for i, a := range rulespec {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			out[i] = `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
		} else {
			out[i] = a
		}
	}
	return strings.Join(out, " ")
}

// ChainExists implements netrules.IPTables.
func (f *IPTables) ChainExists(tbl, chain string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.table(tbl)
	if err != nil {
		return false, err
	}
	_, ok := t.chains[chain]
	return ok, nil
}

// AppendRaw appends line to chain exactly as given, to stand for a rule of
// another component that iptables prints in a form this package cannot
// read back (nft-native rules, say). It bypasses every check.
func (f *IPTables) AppendRaw(tbl, chain, line string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tables[tbl].chains[chain] = append(f.tables[tbl].chains[chain], line)
}

// chainNames lists built-in chains first, in kernel order, then the others
// sorted, as iptables -S does.
func (f *IPTables) chainNames(tbl string, t *table) []string {
	names := slices.Clone(builtinChains[tbl])
	var user []string
	for c := range t.chains {
		if !isBuiltin(tbl, c) {
			user = append(user, c)
		}
	}
	sort.Strings(user)
	return append(names, user...)
}

// List implements netrules.IPTables.
func (f *IPTables) List(tbl, chain string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.chain(tbl, chain)
	if err != nil {
		return nil, err
	}
	var out []string
	if isBuiltin(tbl, chain) {
		out = append(out, "-P "+chain+" ACCEPT")
	} else {
		out = append(out, "-N "+chain)
	}
	for _, r := range t.chains[chain] {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

// NewChain implements netrules.IPTables.
func (f *IPTables) NewChain(tbl, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	t, err := f.table(tbl)
	if err != nil {
		return err
	}
	if _, ok := t.chains[chain]; ok {
		return &Error{msg: "iptables: Chain already exists.\n"}
	}
	t.chains[chain] = nil
	return nil
}

// Insert implements netrules.IPTables. Positions start at 1.
func (f *IPTables) Insert(tbl, chain string, pos int, rulespec ...string) error {
	if pos < 1 {
		return &Error{msg: "iptables: Index of insertion too big.\n"}
	}
	return f.add(tbl, chain, pos, rulespec)
}

// Append implements netrules.IPTables.
func (f *IPTables) Append(tbl, chain string, rulespec ...string) error {
	return f.add(tbl, chain, 0, rulespec)
}

// add inserts rulespec at pos (from 1), or appends it with pos 0.
func (f *IPTables) add(tbl, chain string, pos int, rulespec []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	t, err := f.chain(tbl, chain)
	if err != nil {
		return err
	}
	if err := f.checkTarget(t, rulespec); err != nil {
		return err
	}
	if err := f.checkSets(rulespec); err != nil {
		return err
	}
	rules := t.chains[chain]
	if pos == 0 {
		pos = len(rules) + 1
	}
	if pos > len(rules)+1 {
		return &Error{msg: "iptables: Index of insertion too big.\n"}
	}
	t.chains[chain] = slices.Insert(rules, pos-1, render(rulespec))
	return nil
}

// Delete implements netrules.IPTables: by specification, or by position when
// rulespec is a single number.
func (f *IPTables) Delete(tbl, chain string, rulespec ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	t, err := f.chain(tbl, chain)
	if err != nil {
		return err
	}
	rules := t.chains[chain]
	if len(rulespec) == 1 {
		if n, err := strconv.Atoi(rulespec[0]); err == nil {
			if n < 1 || n > len(rules) {
				return notExist("iptables: Index of deletion too big.\n")
			}
			t.chains[chain] = slices.Delete(rules, n-1, n)
			return nil
		}
	}
	i := slices.Index(rules, render(rulespec))
	if i < 0 {
		return notExist("iptables: Bad rule (does a matching rule exist in that chain?).\n")
	}
	t.chains[chain] = slices.Delete(rules, i, i+1)
	return nil
}

// ClearChain implements netrules.IPTables. Like go-iptables, it creates the
// chain when it does not exist.
func (f *IPTables) ClearChain(tbl, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	t, err := f.table(tbl)
	if err != nil {
		return err
	}
	t.chains[chain] = nil
	return nil
}

// DeleteChain implements netrules.IPTables. Like the kernel, it refuses
// built-in, non-empty and still referenced chains.
func (f *IPTables) DeleteChain(tbl, chain string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls++
	t, err := f.chain(tbl, chain)
	if err != nil {
		return err
	}
	if isBuiltin(tbl, chain) {
		return &Error{msg: "iptables: Can't delete built-in chain.\n"}
	}
	if len(t.chains[chain]) > 0 {
		return &Error{msg: "iptables: Directory not empty.\n"}
	}
	for c, rules := range t.chains {
		for _, r := range rules {
			if strings.HasSuffix(r, "-j "+chain) || strings.Contains(r, "-j "+chain+" ") {
				return &Error{msg: fmt.Sprintf("iptables: Too many links (referenced from %s).\n", c)}
			}
		}
	}
	delete(t.chains, chain)
	return nil
}

// Save renders a table as iptables-save does (without counters), for
// comparisons in tests.
func (f *IPTables) Save(tbl string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tbl]
	if !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", tbl)
	names := f.chainNames(tbl, t)
	for _, c := range names {
		if isBuiltin(tbl, c) {
			fmt.Fprintf(&b, ":%s ACCEPT [0:0]\n", c)
		} else {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
	}
	for _, c := range names {
		for _, r := range t.chains[c] {
			fmt.Fprintf(&b, "-A %s %s\n", c, r)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
