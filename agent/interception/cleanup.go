package interception

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// CleanupTarget names the state Cleanup looks for: the names an agent was
// Run with. Zero fields take the agent's defaults.
type CleanupTarget struct {
	Chain             string
	LivenessSet       string
	ListenLink        string
	ListenAddress     netip.Addr
	ListenAddressIPv6 netip.Addr
	// NFTablesTable is the nftables dataplane's table, in ip and ip6.
	NFTablesTable string
}

// withDefaults fills the zero fields with the agent's defaults.
func (t CleanupTarget) withDefaults() CleanupTarget {
	if t.Chain == "" {
		t.Chain = DefaultChain
	}
	if t.LivenessSet == "" {
		t.LivenessSet = DefaultLivenessSet
	}
	if t.NFTablesTable == "" {
		t.NFTablesTable = DefaultNFTablesTable
	}
	if t.ListenLink == "" {
		t.ListenLink = DefaultListenLink
	}
	if !t.ListenAddress.IsValid() {
		t.ListenAddress = netip.MustParseAddrPort(DefaultListenAddress).Addr()
	}
	if !t.ListenAddressIPv6.IsValid() {
		t.ListenAddressIPv6 = netip.MustParseAddrPort(DefaultListenAddressIPv6).Addr()
	}
	return t
}

// CleanupBackend is one iptables backend to clean: its name, for the
// report, and its iptables per family. Open returns an error when the
// backend's binary for that family is not installed; that family is then
// skipped.
type CleanupBackend struct {
	Name string
	Open func(netrules.Family) (netrules.IPTables, error)
}

// Cleanup removes from the node everything an agent named as t may have
// left there, as `kube-proxy --cleanup` does for kube-proxy's rules: the
// jumps to its chain and the chain, in both IP families and in every
// backend given (rules written through one are invisible to the other, and
// a node may have changed backends), its nftables tables (nft may be nil:
// none), then the liveness sets, then the listen addresses. That is the state a SIGKILLed or force-deleted agent
// leaves: inert, since the liveness entries expire by themselves, but
// still there. It returns what it removed. Missing state is not an error,
// so Cleanup changes nothing on a clean node and can run again after a
// partial failure. An agent still running on the node puts its state back
// at its next sync: stop it first.
func Cleanup(t CleanupTarget, backends []CleanupBackend, nl netrules.Netlink, sets netrules.IPSet, nft netrules.NFTables) ([]string, error) {
	t = t.withDefaults()
	var removed []string
	var errs []error
	families := []netrules.Family{netrules.IPv4, netrules.IPv6}
	names := &Config{LivenessSet: t.LivenessSet}
	setNames := func(f netrules.Family) []string {
		return []string{livenessSetName(names, f), localPodsSetName(names, f), skipSetName(names, f), seenSetName(names, f)}
	}
	// Rules first: a set cannot be destroyed while a rule matches it.
	for _, b := range backends {
		for _, f := range families {
			ipt, err := b.Open(f)
			if err != nil {
				continue // that backend's binary is not installed here
			}
			s := netrules.NewChainSyncer(ipt, netrules.Chain{
				Table: "nat", Name: t.Chain, JumpFrom: []string{"PREROUTING", "OUTPUT"},
			})
			present, err := s.Present()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", b.Name, familyName(f), err))
				continue
			}
			if err := s.Remove(); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", b.Name, familyName(f), err))
				continue
			}
			if present {
				removed = append(removed, fmt.Sprintf("chain nat/%s and its jumps (%s, %s)", t.Chain, b.Name, familyName(f)))
			}
		}
	}
	// The nftables dataplane's tables hold their own sets.
	for _, f := range families {
		if nft == nil {
			break
		}
		have, err := nft.ListTable(f, t.NFTablesTable)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables %s: %w", familyName(f), err))
			continue
		}
		if have == nil {
			continue
		}
		if err := nft.DeleteTable(f, t.NFTablesTable); err != nil {
			errs = append(errs, fmt.Errorf("nftables %s: %w", familyName(f), err))
			continue
		}
		removed = append(removed, fmt.Sprintf("nftables table %s %s", netrules.NFTFamilyName(f), t.NFTablesTable))
	}
	if len(errs) > 0 {
		// A rule may still match a set or send traffic to an address:
		// leave both.
		return removed, errors.Join(errs...)
	}
	for _, f := range families {
		for _, name := range setNames(f) {
			// Any kind of set under the agent's names is the agent's.
			set := netrules.NewLivenessSet(sets, name, f, DefaultLivenessTimeout)
			if _, err := set.Entries(); err != nil {
				if !netrules.IsSetNotExist(err) {
					errs = append(errs, err)
				}
				continue
			}
			if err := set.Destroy(); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, "ipset "+name)
		}
	}
	for _, a := range []netip.Addr{t.ListenAddress, t.ListenAddressIPv6} {
		la := netrules.NewLocalAddress(nl, t.ListenLink, a)
		held, err := la.Present()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := la.Remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		if held != "" {
			removed = append(removed, fmt.Sprintf("address %s from %s", a, held))
		}
	}
	return removed, errors.Join(errs...)
}
