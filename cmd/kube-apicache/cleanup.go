package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"

	"github.com/kube-apicache/kube-apicache/agent"
	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/netrules"
)

// newCleanupCommand returns `kube-apicache cleanup`, which removes the
// agent's rules, sets and addresses from the node.
func newCleanupCommand() *cobra.Command {
	var t interception.CleanupTarget
	var listen, listen6, backend string
	config := configFile{sections: cleanupSections}
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove every rule, set and address of the agent from this node",
		Long: `cleanup removes from this node the nat jumps and chain, the liveness ipsets,
the nftables tables and the listen addresses of the agent, in both IP families
and both iptables backends, and prints what it removed. Run it on the node (hostNetwork, with
NET_ADMIN) after the DaemonSet is gone: a running agent puts its state back
at its next sync. On a clean node it changes nothing. Give the same names
the agent ran with if they were not the defaults.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			applied, err := config.apply(cmd.Flags())
			if err != nil {
				return err
			}
			defer func() { err = applied.Annotate(err) }()
			if t.ListenAddress, err = parseListenIP("--listen-address", listen); err != nil {
				return err
			}
			if t.ListenAddressIPv6, err = parseListenIP("--listen-address-ipv6", listen6); err != nil {
				return err
			}
			var backends []interception.CleanupBackend
			switch backend {
			case "auto":
				backends = cleanupBackends(netrules.BackendNFT, netrules.BackendLegacy)
			case "nft", "legacy":
				backends = cleanupBackends(netrules.Backend(backend))
			default:
				return fmt.Errorf("--iptables-backend %q: must be auto (both), legacy or nft", backend)
			}
			nl, err := netlink.NewHandle()
			if err != nil {
				return fmt.Errorf("netlink: %w", err)
			}
			defer nl.Close()
			var nft netrules.NFTables
			if k, err := netrules.NewKernelNFTables(); err == nil {
				defer k.Close()
				nft = k
			}
			removed, err := interception.Cleanup(t, backends, nl, nl, nft)
			for _, r := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", r)
			}
			if err == nil && len(removed) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing of kube-apicache found on this node")
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&t.Chain, "iptables-chain", agent.DefaultChain, "Name of the agent's nat chain.")
	fs.StringVar(&t.LivenessSet, "fail-open-set", agent.DefaultLivenessSet, "Name of the agent's IPv4 fail-open ipset; the IPv6 one has a \"6\" suffix, and the sets derived from it (-PODS, -SKIP, -SEEN) go too.")
	fs.StringVar(&t.LivenessSet, "liveness-set", agent.DefaultLivenessSet, "Former name of --fail-open-set.")
	_ = fs.MarkDeprecated("liveness-set", "use --fail-open-set")
	config.addFlags(fs)
	fs.StringVar(&t.ListenLink, "listen-link", agent.DefaultListenLink, "Link the agent put its listen addresses on (loopback is always checked too).")
	fs.StringVar(&listen, "listen-address", agent.DefaultListenAddress, "The agent's IPv4 listen IP or IP:port.")
	fs.StringVar(&listen6, "listen-address-ipv6", agent.DefaultListenAddressIPv6, "The agent's IPv6 listen IP or [IP]:port.")
	fs.StringVar(&backend, "iptables-backend", "auto", "Backend to clean: auto cleans both legacy and nft.")
	fs.StringVar(&t.NFTablesTable, "nftables-table", agent.DefaultNFTablesTable, "Name of the agent's nftables table (ip and ip6), removed whole.")
	return cmd
}

// cleanupBackends returns the iptables of each backend for Cleanup.
func cleanupBackends(bs ...netrules.Backend) []interception.CleanupBackend {
	var out []interception.CleanupBackend
	for _, b := range bs {
		out = append(out, interception.CleanupBackend{
			Name: string(b),
			Open: func(f netrules.Family) (netrules.IPTables, error) { return netrules.OpenIPTables(b, f) },
		})
	}
	return out
}

// parseListenIP parses an IP or IP:port flag value into its IP.
func parseListenIP(flag, s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q: must be an IP or IP:port", flag, s)
	}
	return ip, nil
}
