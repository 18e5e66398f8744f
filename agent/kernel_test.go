package agent

import (
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

// fakeKernel is an empty node of stateful fakes: enough for New, which
// changes nothing on the node. The interceptor's own tests drive these
// fakes through syncs.
type fakeKernel struct {
	ipt, ip6t *fake.IPTables
	ipset     *fake.IPSet
	nl        *fake.Netlink
	nft       *fake.NFTables
	ct        *fake.Conntrack
}

func newFakeKernel(t *testing.T) *fakeKernel {
	t.Helper()
	clock := clocktesting.NewFakeClock(time.Now())
	k := &fakeKernel{ipt: fake.NewIPTables(), ip6t: fake.NewIP6Tables(), nl: fake.NewNetlink(),
		ipset: fake.NewIPSet(clock), nft: fake.NewNFTables(clock), ct: &fake.Conntrack{}}
	k.ipt.UseSets(k.ipset)
	k.ip6t.UseSets(k.ipset)
	return k
}

func (k *fakeKernel) kernel() interception.Kernel {
	return interception.Kernel{
		IPTables: func(f netrules.Family) (netrules.IPTables, error) {
			if f == netrules.IPv6 {
				return k.ip6t, nil
			}
			return k.ipt, nil
		},
		Backend:   "fake",
		Netlink:   k.nl,
		IPSet:     k.ipset,
		NFTables:  k.nft,
		Conntrack: k.ct,
	}
}

// dataplaneConfig is validConfig, dual-stack and with the socket mark.
func dataplaneConfig() *Config {
	c := validConfig()
	c.SocketMark = DefaultSocketMark
	c.ServiceVIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:10:96::1")}
	return c
}
