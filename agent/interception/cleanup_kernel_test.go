package interception

import (
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kube-apicache/kube-apicache/netrules"
	"github.com/kube-apicache/kube-apicache/netrules/netnstest"
)

// TestCleanupKernel leaves on a real kernel what a SIGKILLed agent leaves
// (address, sets, chains and jumps in both families; a chain in the legacy
// backend and the nftables dataplane's tables too, as after a node changed
// backends) and checks that Cleanup
// removes all of it, leaves kube-proxy's rules alone, and finds nothing the
// second time.
func TestCleanupKernel(t *testing.T) {
	netnstest.Run(t, 1, func(_ []netns.NsHandle, hs []*netlink.Handle) {
		h := hs[0]
		save := func(bin string) string {
			out, err := exec.Command(bin, "-t", "nat").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v: %s", bin, err, out)
			}
			return string(out)
		}
		cfg := dataplaneConfig()
		cfg.DetectLocalMode = DetectLocalPodIPs
		cfg.PodPathCheckInterval, cfg.BypassDuration = 250*time.Millisecond, 10*time.Minute
		var backends []CleanupBackend
		for _, b := range []netrules.Backend{netrules.BackendNFT, netrules.BackendLegacy} {
			backends = append(backends, CleanupBackend{Name: string(b), Open: func(f netrules.Family) (netrules.IPTables, error) {
				return netrules.OpenIPTables(b, f)
			}})
		}
		// kube-proxy's jumps, which must stay.
		ipt, err := netrules.OpenIPTables(netrules.BackendNFT, netrules.IPv4)
		if err != nil {
			t.Skipf("no nft backend: %v", err)
		}
		mustDo(t, ipt.NewChain("nat", "KUBE-SERVICES"))
		mustDo(t, ipt.Append("nat", "PREROUTING", "-j", "KUBE-SERVICES"))
		before := save("iptables-nft-save")

		// Given the state of an agent killed while intercepting,
		planes, err := newDataplanes(cfg, DataplaneIPTables, Kernel{
			IPTables: func(f netrules.Family) (netrules.IPTables, error) {
				return netrules.OpenIPTables(netrules.BackendNFT, f)
			},
			Netlink: h, IPSet: h, Conntrack: netrules.KernelConntrack{},
		})
		mustDo(t, err)
		for _, d := range planes {
			_, err := d.addr.Sync()
			mustDo(t, err)
			_, _, err = d.sync()
			mustDo(t, err)
			// The attempts set is bounded.
			if res, err := h.IpsetList(d.rules.(*iptablesRules).seen.Name()); err != nil || res.MaxElements != netrules.MaxAttempts {
				t.Errorf("%s: attempts set %+v, %v; want at most %d entries", familyName(d.family), res, err, netrules.MaxAttempts)
			}
			// The kernel prints the jump with its detect-local match as
			// the agent writes it: a second sync changes nothing.
			if _, res, err := d.sync(); err != nil || res.Changed() {
				t.Errorf("%s: second sync = %+v, %v; want no change", familyName(d.family), res, err)
			}
			_, err = d.syncLocalPods([]netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:244::5")})
			mustDo(t, err)
			mustDo(t, d.refresh())
		}
		legacy, err := netrules.OpenIPTables(netrules.BackendLegacy, netrules.IPv4)
		if err == nil {
			_, err = netrules.NewChainSyncer(legacy, redirectChain(cfg, cfg.LivenessSet, cfg.ServiceVIPs[:1], cfg.ListenAddress, nil, "", "")).Sync()
			mustDo(t, err)
		}
		// and the nftables dataplane's tables, as after a node changed
		// dataplanes,
		nft, err := netrules.NewKernelNFTables()
		mustDo(t, err)
		defer nft.Close()
		nftPlanes, err := newDataplanes(cfg, DataplaneNFTables, Kernel{Netlink: h, NFTables: nft, Conntrack: netrules.KernelConntrack{}})
		mustDo(t, err)
		for _, d := range nftPlanes {
			d.setLocal(localMatch{pods: true})
			_, _, err := d.sync()
			mustDo(t, err)
			mustDo(t, d.refresh())
		}
		// when cleanup runs,
		removed, err := Cleanup(CleanupTarget{}, backends, h, h, nft)
		mustDo(t, err)
		// then it reports each piece,
		got := strings.Join(removed, "\n")
		for _, want := range []string{
			"chain nat/KUBE-APICACHE and its jumps (nft, IPv4)", "chain nat/KUBE-APICACHE and its jumps (nft, IPv6)",
			"ipset KUBE-APICACHE-LIVE", "ipset KUBE-APICACHE-LIVE6", "ipset KUBE-APICACHE-LIVE-PODS", "ipset KUBE-APICACHE-LIVE-PODS6",
			"ipset KUBE-APICACHE-LIVE-SKIP", "ipset KUBE-APICACHE-LIVE-SEEN6",
			"address 169.254.25.10 from lo",
			"nftables table ip kube-apicache", "nftables table ip6 kube-apicache",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("removed:\n%s\nlacks %q", got, want)
			}
		}
		if legacy != nil && !strings.Contains(got, "(legacy, IPv4)") {
			t.Errorf("removed:\n%s\nlacks the legacy chain", got)
		}
		// only kube-proxy's rules are left,
		if after := save("iptables-nft-save"); stripComments(after) != stripComments(before) {
			t.Errorf("nat after cleanup:\n%s\nwant:\n%s", after, before)
		}
		for _, bin := range []string{"ip6tables-nft-save", "iptables-legacy-save"} {
			if out := save(bin); strings.Contains(out, "KUBE-APICACHE") {
				t.Errorf("%s still holds the agent's rules:\n%s", bin, out)
			}
		}
		if sets, err := h.IpsetListAll(); err != nil || len(sets) != 0 {
			t.Errorf("ipsets left: %v, %v", sets, err)
		}
		// and a second run finds nothing.
		for _, f := range []netrules.Family{netrules.IPv4, netrules.IPv6} {
			if tables, err := nft.Tables(f); err != nil || slices.Contains(tables, DefaultNFTablesTable) {
				t.Errorf("%s tables: %v, %v; want no %s", netrules.NFTFamilyName(f), tables, err, DefaultNFTablesTable)
			}
		}
		removed, err = Cleanup(CleanupTarget{}, backends, h, h, nft)
		if err != nil || len(removed) != 0 {
			t.Errorf("second cleanup = %v, %v; want nothing", removed, err)
		}
	})
}

// stripComments drops iptables-save's comment and counter lines.
func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
