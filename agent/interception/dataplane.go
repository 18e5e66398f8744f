package interception

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

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
	// NFTables drives the agent's nftables tables; nil where nftables is
	// not available (the iptables dataplane only).
	NFTables netrules.NFTables
	// Conntrack lists and deletes the node's flows to the VIPs, for the
	// pod-path check (podpath.go) and the flows the redirect leaves at
	// shutdown (flows.go); nil turns both off.
	Conntrack netrules.Conntrack
}

// dataplane is the agent's redirect for one IP family: the family's listen
// address on the node, a liveness set holding the family's VIPs while the
// agent is healthy, and rules (an iptables chain, or a table of its own in
// nftables) whose DNAT to the listen address matches that set.
type dataplane struct {
	// backend is DataplaneIPTables or DataplaneNFTables.
	backend string
	family  netrules.Family
	vips    []netip.Addr
	listen  netip.AddrPort
	addr    *netrules.LocalAddress
	// rules are the redirect's rules and sets in the dataplane backend
	// that runs; set and the optional sets below live there.
	rules redirectRules
	set   timedSet
	// podsSet holds this node's pod IPs of the family in PodIPs
	// detect-local mode; nil otherwise.
	podsSet addressSet
	// skip holds the sources sent back to kube-proxy's path: those whose
	// traffic to the agent is dropped on its way (podpath.go) and those
	// that presented a client certificate (clientcert.go); seen holds the
	// connection attempts redirected. Both are nil when the pod-path check
	// is off.
	skip timedSet
	seen attemptSet

	// active is set while the family's redirect is installed and passed
	// its self-check, so that its liveness entries are kept alive. Guarded
	// by Agent.planeMu.
	active bool
}

// timedSet is a set of addresses whose entries expire: the liveness and
// skip sets.
type timedSet interface {
	Refresh([]netip.Addr) error
	Clear([]netip.Addr) error
	Entries() ([]netip.Addr, error)
}

// addressSet is a set of addresses kept equal to a list (this node's pods).
type addressSet interface {
	Sync([]netip.Addr) (added, removed int, err error)
	Entries() ([]netip.Addr, error)
}

// attemptSet is the set of redirected connection attempts.
type attemptSet interface {
	Entries() ([]netip.AddrPort, error)
	Forget(netip.AddrPort) error
}

// redirectRules are one family's redirect in one dataplane backend.
type redirectRules interface {
	// setLocal makes the prerouting entry carry m (detect-local); it
	// reports whether that changed what the next sync writes.
	setLocal(m localMatch) bool
	// sync makes the sets and rules exist as they should; it does not
	// touch the sets' entries.
	sync() (setCreated bool, res netrules.SyncResult, err error)
	// removeRules removes the rules, so that nothing is redirected, and
	// keeps the sets and their entries.
	removeRules() error
	// present reports whether rules that may redirect are in place.
	present() (bool, error)
	// remove removes the rules, then the sets; a set that someone else's
	// rule still uses (a successor that already took over) stays.
	remove() error
}

// Dataplane backends.
const (
	DataplaneAuto     = "auto"
	DataplaneIPTables = "iptables"
	DataplaneNFTables = "nftables"
	// DataplaneExternal programs nothing: another component redirects
	// the VIP to the agent (external.go).
	DataplaneExternal = "external"
)

// kubeProxyNFTTable is the table kube-proxy's nftables mode owns, in the
// ip and ip6 families.
const kubeProxyNFTTable = "kube-proxy"

// resolveDataplane picks the backend: the one asked for, or for auto,
// nftables where kube-proxy runs in nftables mode or iptables itself is
// the nf_tables backend (the redirect then runs at its own priority, ahead
// of every dstnat chain, instead of tying with them at dstnat), and
// iptables on legacy-iptables nodes. It returns a reason for logs.
func resolveDataplane(want string, k Kernel) (string, string, error) {
	switch want {
	case DataplaneIPTables:
		return DataplaneIPTables, "--dataplane=iptables", nil
	case DataplaneNFTables:
		if k.NFTables == nil {
			return "", "", errors.New("--dataplane=nftables: nftables is not available on this node")
		}
		return DataplaneNFTables, "--dataplane=nftables", nil
	case DataplaneExternal:
		return DataplaneExternal, "--dataplane=external", nil
	case DataplaneAuto, "":
	default:
		return "", "", fmt.Errorf("--dataplane %q must be auto, iptables, nftables or external", want)
	}
	if k.NFTables == nil {
		return DataplaneIPTables, "auto: nftables is not available", nil
	}
	for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
		tables, err := k.NFTables.Tables(f)
		if err != nil {
			return DataplaneIPTables, fmt.Sprintf("auto: listing nftables tables failed (%v)", err), nil
		}
		if slices.Contains(tables, kubeProxyNFTTable) {
			return DataplaneNFTables, fmt.Sprintf("auto: kube-proxy's nftables table %s %s exists", netrules.NFTFamilyName(f), kubeProxyNFTTable), nil
		}
	}
	if k.Backend == string(netrules.BackendNFT) {
		return DataplaneNFTables, "auto: iptables uses the nf_tables backend", nil
	}
	return DataplaneIPTables, fmt.Sprintf("auto: iptables uses the %s backend", k.Backend), nil
}

// newDataplanes returns one dataplane per IP family among cfg's VIPs, in
// the backend named (DataplaneIPTables or DataplaneNFTables).
func newDataplanes(cfg *Config, backend string, k Kernel) ([]*dataplane, error) {
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
		listen := cfg.listenAddress(f)
		if !listen.IsValid() || netrules.FamilyOf(listen.Addr()) != f {
			return nil, fmt.Errorf("no %s listen address for the %s Service VIPs", familyName(f), familyName(f))
		}
		d := &dataplane{
			backend: backend,
			family:  f,
			vips:    slices.Clone(vips),
			listen:  listen,
			// Both families share the link; each keeps its own address.
			addr: netrules.NewLocalAddress(k.Netlink, cfg.ListenLink, listen.Addr()),
		}
		var err error
		switch backend {
		case DataplaneNFTables:
			d.rules = newNFTRules(cfg, k, d)
		default:
			d.rules, err = newIPTablesRules(cfg, k, d)
		}
		if err != nil {
			return nil, err
		}
		// The detect-local match may not be known yet (NodeCIDR): sync
		// sets it before the rules are first written.
		d.setLocal(localMatch{})
		out = append(out, d)
	}
	return out, nil
}

// setLocal makes the redirect's prerouting entry carry m; it reports
// whether that changed what the next sync writes.
func (d *dataplane) setLocal(m localMatch) bool { return d.rules.setLocal(m) }

// sync makes the sets and rules exist as they should. It does not touch
// the sets' entries.
func (d *dataplane) sync() (setCreated bool, res netrules.SyncResult, err error) {
	return d.rules.sync()
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

// remove deletes the entries, then the rules and sets.
func (d *dataplane) remove() error {
	errClear := d.clear()
	if err := d.rules.remove(); err != nil {
		return errors.Join(errClear, err)
	}
	return errClear
}

// buildDataplanes picks the dataplane backend and builds the redirects in
// it, and in the other backend the same redirects as an agent that ran
// with that one (an upgrade, a changed --dataplane) left them, to be
// removed: never two redirects.
func (ic *Interceptor) buildDataplanes(k Kernel) error {
	if ic.cfg.external() {
		ic.buildExternal(k)
		return nil
	}
	var err error
	if ic.dataplane, ic.dataplaneReason, err = resolveDataplane(ic.cfg.Dataplane, k); err != nil {
		return err
	}
	if ic.planes, err = newDataplanes(ic.cfg, ic.dataplane, k); err != nil {
		return err
	}
	if other := otherDataplane(ic.dataplane); other == DataplaneIPTables || k.NFTables != nil {
		if ic.others, err = newDataplanes(ic.cfg, other, k); err != nil {
			// Without that backend on the node, it holds nothing.
			klog.Background().V(2).Info("The other dataplane is not available", "dataplane", other, "err", err)
			ic.others = nil
		}
	}
	return nil
}

// otherDataplane is the backend that is not b.
func otherDataplane(b string) string {
	if b == DataplaneNFTables {
		return DataplaneIPTables
	}
	return DataplaneNFTables
}

// othersCheckPeriod is how often a sync looks for the other backend's
// redirect: an agent of the other backend may still be running during an
// upgrade and put its rules back until it stops.
const othersCheckPeriod = time.Minute

// removeOthers removes the other backend's redirect, rules and sets, where
// one is in place, so that two redirects never stay on the node. It looks
// at most every othersCheckPeriod. ic.syncMu must be held.
func (ic *Interceptor) removeOthers(logger klog.Logger) {
	if len(ic.others) == 0 || ic.now().Before(ic.othersCheckAt) {
		return
	}
	ic.othersCheckAt = ic.now().Add(othersCheckPeriod)
	for _, d := range ic.others {
		present, err := d.rules.present()
		if err != nil {
			logger.V(2).Info("Looking for a redirect of the other dataplane", "dataplane", d.backend, "err", err)
			continue
		}
		if !present {
			continue
		}
		logger.Info("Removing the redirect of the other dataplane", "dataplane", d.backend, "family", d.family.String())
		_ = d.set.Clear(d.vips)
		if err := d.rules.remove(); err != nil {
			logger.Error(err, "Removing the redirect of the other dataplane", "dataplane", d.backend)
		}
	}
}
