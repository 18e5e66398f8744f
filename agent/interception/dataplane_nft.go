package interception

import (
	"github.com/kube-apicache/kube-apicache/netrules"
)

// The nftables dataplane (netrules/nft.go): a table of the agent's own per
// family whose prerouting and output base chains run at
// --nftables-priority, by default dstnat-1, so that the redirect always
// runs before kube-proxy's nftables chains and iptables-nft's nat chains,
// which all sit at dstnat, instead of tying with them.

// Set names inside the agent's table.
const (
	nftLivenessSet = "liveness"
	nftPodsSet     = "pods"
	nftSkipSet     = "skip"
	nftSeenSet     = "seen"
	nftChain       = "redirect"
)

// DefaultNFTablesTable is the agent's table, in the ip and ip6 families.
const DefaultNFTablesTable = "kube-apicache"

// DefaultNFTablesPriority is one before dstnat (NF_IP_PRI_NAT_DST, -100).
const DefaultNFTablesPriority = netrules.NFTPriorityDstNAT - 1

// nftRules is the nftables dataplane of one family.
type nftRules struct {
	cfg  *Config
	d    *dataplane
	live *netrules.NFTTimedSet
	pods *netrules.NFTAddressSet
	skip *netrules.NFTTimedSet
	seen *netrules.NFTAttemptSet
	r    *netrules.NFTRedirect
	// local is the detect-local match the spec carries; init is set once
	// setLocal has run.
	local localMatch
	init  bool
}

func newNFTRules(cfg *Config, k Kernel, d *dataplane) *nftRules {
	f, table := d.family, cfg.nftTable()
	r := &nftRules{cfg: cfg, d: d, live: netrules.NewNFTTimedSet(k.NFTables, f, table, nftLivenessSet, cfg.LivenessTimeout)}
	d.set = r.live
	if cfg.DetectLocalMode == DetectLocalPodIPs {
		r.pods = netrules.NewNFTAddressSet(k.NFTables, f, table, nftPodsSet)
		d.podsSet = r.pods
	}
	if cfg.PodPathCheckInterval > 0 && k.Conntrack != nil {
		r.skip = netrules.NewNFTTimedSet(k.NFTables, f, table, nftSkipSet, cfg.BypassDuration)
		r.seen = netrules.NewNFTAttemptSet(k.NFTables, f, table, nftSeenSet, attemptTTL)
		d.skip, d.seen = r.skip, r.seen
	}
	r.r = netrules.NewNFTRedirect(k.NFTables, r.spec(localMatch{}))
	return r
}

// spec is the table for local: the same rules as the iptables chain
// (redirectChain), in the same order.
func (r *nftRules) spec(local localMatch) netrules.NFTRedirectSpec {
	var rules []netrules.NFTRule
	if r.cfg.SocketMark != 0 {
		rules = append(rules, netrules.NFTRule{MarkMask: r.cfg.SocketMark, Return: true,
			Note: "kube-apicache: own upstream traffic"})
	}
	sets := []netrules.NFTSet{r.live.Def()}
	if r.pods != nil {
		sets = append(sets, r.pods.Def())
	}
	if r.skip != nil {
		sets = append(sets, r.skip.Def(), r.seen.Def())
		rules = append(rules, netrules.NFTRule{SrcSet: nftSkipSet, Return: true,
			Note: "kube-apicache: sources sent back to kube-proxy"})
	}
	for _, vip := range r.d.vips {
		match := netrules.NFTRule{DstAddr: vip, TCPDstPort: r.cfg.ServicePort, DstSet: nftLivenessSet}
		if r.seen != nil {
			record := match
			record.UpdateSet, record.Note = nftSeenSet, "kube-apicache: record each redirected connection attempt"
			rules = append(rules, record)
		}
		dnat := match
		dnat.DNAT, dnat.Note = r.d.listen, "kube-apicache: kubernetes Service VIP to the node-local agent while it is alive"
		rules = append(rules, dnat)
	}
	return netrules.NFTRedirectSpec{
		Family:   r.d.family,
		Table:    r.cfg.nftTable(),
		Priority: r.cfg.nftPriority(),
		Chain:    netrules.NFTChain{Name: nftChain, Rules: rules},
		Local:    local.nft(nftPodsSet),
		Sets:     sets,
	}
}

func (r *nftRules) setLocal(m localMatch) bool {
	if r.init && m == r.local {
		return false
	}
	r.local, r.init = m, true
	r.r.SetSpec(r.spec(m))
	return true
}

func (r *nftRules) sync() (bool, netrules.SyncResult, error) { return r.r.Sync() }
func (r *nftRules) removeRules() error                       { return r.r.RemoveRules() }
func (r *nftRules) present() (bool, error)                   { return r.r.Present() }

// remove deletes the table, sets and elements included: no rule of anyone
// else can use them.
func (r *nftRules) remove() error { return r.r.Remove() }
