package interception

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kube-apicache/kube-apicache/netrules"
)

// iptablesRules is the iptables dataplane of one family: a nat chain with
// jumps from PREROUTING and OUTPUT ahead of kube-proxy's, and ipsets for
// the liveness entries, this node's pods, skipped sources and attempts.
type iptablesRules struct {
	cfg     *Config
	d       *dataplane
	ipt     netrules.IPTables
	set     *netrules.LivenessSet
	podsSet *netrules.AddressSet
	skip    *netrules.LivenessSet
	seen    *netrules.AttemptSet
	// chain syncs the redirect whose PREROUTING jump carries local, the
	// detect-local match; both change together (setLocal). Guarded by
	// Agent.syncMu once the agent runs.
	chain *netrules.ChainSyncer
	local []string
}

func newIPTablesRules(cfg *Config, k Kernel, d *dataplane) (*iptablesRules, error) {
	ipt, err := k.IPTables(d.family)
	if err != nil {
		return nil, fmt.Errorf("iptables for %s: %w", d.family, err)
	}
	f := d.family
	r := &iptablesRules{cfg: cfg, d: d, ipt: ipt, set: netrules.NewLivenessSet(k.IPSet, livenessSetName(cfg, f), f, cfg.LivenessTimeout)}
	d.set = r.set
	if cfg.DetectLocalMode == DetectLocalPodIPs {
		r.podsSet = netrules.NewAddressSet(k.IPSet, localPodsSetName(cfg, f), f)
		d.podsSet = r.podsSet
	}
	if cfg.PodPathCheckInterval > 0 && k.Conntrack != nil {
		r.skip = netrules.NewLivenessSet(k.IPSet, skipSetName(cfg, f), f, cfg.BypassDuration)
		r.seen = netrules.NewAttemptSet(k.IPSet, seenSetName(cfg, f), f, attemptTTL)
		d.skip, d.seen = r.skip, r.seen
	}
	return r, nil
}

func (r *iptablesRules) setLocal(m localMatch) bool {
	args := m.iptables(localPodsSetName(r.cfg, r.d.family))
	if r.chain != nil && slices.Equal(r.local, args) {
		return false
	}
	r.local = args
	skip, seen := "", ""
	if r.skip != nil {
		skip, seen = r.skip.Name(), r.seen.Name()
	}
	r.chain = netrules.NewChainSyncer(r.ipt, redirectChain(r.cfg, r.set.Name(), r.d.vips, r.d.listen, r.local, skip, seen))
	return true
}

// sync makes the sets and chain exist as they should. The sets come
// first: the kernel refuses a rule matching a set that does not exist.
func (r *iptablesRules) sync() (setCreated bool, res netrules.SyncResult, err error) {
	if setCreated, err = r.set.Ensure(); err != nil {
		return false, res, err
	}
	var ensure []func() (bool, error)
	if r.podsSet != nil {
		ensure = append(ensure, r.podsSet.Ensure)
	}
	if r.skip != nil {
		ensure = append(ensure, r.skip.Ensure, r.seen.Ensure)
	}
	for _, e := range ensure {
		created, err := e()
		if err != nil {
			return false, res, err
		}
		setCreated = setCreated || created
	}
	res, err = r.chain.Sync()
	return setCreated, res, err
}

func (r *iptablesRules) removeRules() error     { return r.chain.Remove() }
func (r *iptablesRules) present() (bool, error) { return r.chain.Present() }

// remove deletes the jumps and chain, then the sets.
func (r *iptablesRules) remove() error {
	if err := r.chain.Remove(); err != nil {
		return err
	}
	destroy := []func() error{r.set.Destroy}
	if r.podsSet != nil {
		destroy = append(destroy, r.podsSet.Destroy)
	}
	if r.skip != nil {
		destroy = append(destroy, r.skip.Destroy, r.seen.Destroy)
	}
	var errs []error
	for _, d := range destroy {
		if err := d(); err != nil && !netrules.IsSetInUse(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
