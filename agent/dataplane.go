package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// Kernel holds the node's kernel interfaces the agent works through.
type Kernel struct {
	// IPTables returns iptables (IPv4) or ip6tables (IPv6) of the backend
	// kube-proxy uses.
	IPTables func(netrules.Family) (netrules.IPTables, error)
	// Backend names that backend, for logs.
	Backend string
	Netlink netrules.Netlink
	IPSet   netrules.IPSet
	// Conntrack lists the node's flows to the VIPs for the pod-path check
	// (podpath.go); nil turns that check off.
	Conntrack netrules.Conntrack
}

// dataplane is the agent's redirect for one IP family: the family's listen
// address on the node, a liveness set holding the family's VIPs while the
// agent is healthy, and a nat chain (iptables or ip6tables) whose DNAT to
// the listen address matches that set.
type dataplane struct {
	family netrules.Family
	vips   []netip.Addr
	listen netip.AddrPort
	addr   *netrules.LocalAddress
	set    *netrules.LivenessSet
	ipt    netrules.IPTables
	// podsSet holds this node's pod IPs of the family in PodIPs
	// detect-local mode; nil otherwise.
	podsSet *netrules.AddressSet
	// skip holds the sources sent back to kube-proxy's path: those whose
	// traffic to the agent is dropped on its way (podpath.go) and those
	// that presented a client certificate (clientcert.go); seen holds the
	// connection attempts redirected. Both are nil when the pod-path check
	// is off.
	skip *netrules.LivenessSet
	seen *netrules.AttemptSet
	// chain syncs the redirect whose PREROUTING jump carries local, the
	// detect-local match; both change together (setLocal). Guarded by
	// Agent.syncMu once the agent runs.
	chain *netrules.ChainSyncer
	local []string

	// active is set while the family's redirect is installed and passed
	// its self-check, so that its liveness entries are kept alive. Guarded
	// by Agent.planeMu.
	active bool
}

// newDataplanes returns one dataplane per IP family among cfg's VIPs.
func newDataplanes(cfg *Config, k Kernel) ([]*dataplane, error) {
	byFamily := map[netrules.Family][]netip.Addr{}
	for _, vip := range cfg.ServiceVIPs {
		f := netrules.FamilyOf(vip)
		byFamily[f] = append(byFamily[f], vip.Unmap())
	}
	var out []*dataplane
	for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
		vips := byFamily[f]
		if len(vips) == 0 {
			continue
		}
		ipt, err := k.IPTables(f)
		if err != nil {
			return nil, fmt.Errorf("iptables for %s: %w", f, err)
		}
		set := livenessSetName(cfg, f)
		listen := cfg.listenAddress(f)
		if !listen.IsValid() || netrules.FamilyOf(listen.Addr()) != f {
			return nil, fmt.Errorf("no %s listen address for the %s Service VIPs", familyName(f), familyName(f))
		}
		d := &dataplane{
			family: f,
			vips:   slices.Clone(vips),
			listen: listen,
			// Both families share the link; each keeps its own address.
			addr: netrules.NewLocalAddress(k.Netlink, cfg.ListenLink, listen.Addr()),
			set:  netrules.NewLivenessSet(k.IPSet, set, f, cfg.LivenessTimeout),
			ipt:  ipt,
		}
		if cfg.DetectLocalMode == DetectLocalPodIPs {
			d.podsSet = netrules.NewAddressSet(k.IPSet, localPodsSetName(cfg, f), f)
		}
		if cfg.PodPathCheckInterval > 0 && k.Conntrack != nil {
			d.skip = netrules.NewLivenessSet(k.IPSet, skipSetName(cfg, f), f, cfg.BypassDuration)
			d.seen = netrules.NewAttemptSet(k.IPSet, seenSetName(cfg, f), f, attemptTTL)
		}
		// The detect-local match may not be known yet (NodeCIDR): sync
		// sets it before the chain is first written.
		d.setLocal(cfg, nil)
		out = append(out, d)
	}
	return out, nil
}

// setLocal makes the redirect's PREROUTING jump carry match; it reports
// whether that changed the chain the next sync writes.
func (d *dataplane) setLocal(cfg *Config, match []string) bool {
	if d.chain != nil && slices.Equal(d.local, match) {
		return false
	}
	d.local = slices.Clone(match)
	skip, seen := "", ""
	if d.skip != nil {
		skip, seen = d.skip.Name(), d.seen.Name()
	}
	d.chain = netrules.NewChainSyncer(d.ipt, redirectChain(cfg, d.set.Name(), d.vips, d.listen, d.local, skip, seen))
	return true
}

// sync makes the set and chain exist as they should. The set comes first:
// the kernel refuses a rule matching a set that does not exist. It does not
// touch the set's entries.
func (d *dataplane) sync() (setCreated bool, res netrules.SyncResult, err error) {
	if setCreated, err = d.set.Ensure(); err != nil {
		return false, res, err
	}
	var ensure []func() (bool, error)
	if d.podsSet != nil {
		ensure = append(ensure, d.podsSet.Ensure)
	}
	if d.skip != nil {
		ensure = append(ensure, d.skip.Ensure, d.seen.Ensure)
	}
	for _, e := range ensure {
		created, err := e()
		if err != nil {
			return false, res, err
		}
		setCreated = setCreated || created
	}
	res, err = d.chain.Sync()
	return setCreated, res, err
}

// syncLocalPods makes the pods set hold ips, this node's pod IPs (of any
// family: the set keeps its own). It reports whether it changed the set.
func (d *dataplane) syncLocalPods(ips []netip.Addr) (bool, error) {
	if d.podsSet == nil {
		return false, nil
	}
	added, removed, err := d.podsSet.Sync(ips)
	return added+removed > 0, err
}

// refresh keeps the VIPs in the set for another timeout.
func (d *dataplane) refresh() error { return d.set.Refresh(d.vips) }

// clear takes the VIPs out of the set: new connections go to kube-proxy's
// path at once, while the rules stay. The family is no longer active.
func (d *dataplane) clear() error {
	d.active = false
	return d.set.Clear(d.vips)
}

// remove deletes the entries, the jumps and chain, then the set. A set that
// someone else's rule still uses (a successor that already took over) is
// left alone.
func (d *dataplane) remove() error {
	errClear := d.clear()
	if err := d.chain.Remove(); err != nil {
		return errors.Join(errClear, err)
	}
	if err := d.set.Destroy(); err != nil && !netrules.IsSetInUse(err) {
		return errors.Join(errClear, err)
	}
	if d.podsSet != nil {
		if err := d.podsSet.Destroy(); err != nil && !netrules.IsSetInUse(err) {
			return errors.Join(errClear, err)
		}
	}
	if d.skip != nil {
		for _, destroy := range []func() error{d.skip.Destroy, d.seen.Destroy} {
			if err := destroy(); err != nil && !netrules.IsSetInUse(err) {
				return errors.Join(errClear, err)
			}
		}
	}
	return nil
}
