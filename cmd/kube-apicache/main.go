// Command kube-apicache is the node-local Kubernetes API proxy. It only wires
// flags to package agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/coreos/go-iptables/iptables"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-apicache: %s\n", oneLine(err))
		os.Exit(1)
	}
}

// oneLine keeps start-up errors to a single line, as operators read them in
// `kubectl describe` and crash-loop events.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

type options struct {
	cfg           agent.Config
	listenAddress string
	serviceVIPs   []string
	upstreams     []string
	socketMark    uint32
}

func newCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "kube-apicache",
		Short: "Node-local proxy and cache for the Kubernetes API",
		Long: `kube-apicache redirects the kubernetes Service VIP on this node to a local
TLS listener and relays every request to kube-apiserver with the caller's own
credentials. Run it as a DaemonSet with hostNetwork and NET_ADMIN.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.complete(); err != nil {
				return err
			}
			return run(cmd.Context(), &o.cfg)
		},
	}
	fs := cmd.Flags()
	c := &o.cfg
	fs.StringVar(&c.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (default $NODE_NAME).")
	fs.StringVar(&o.listenAddress, "listen-address", agent.DefaultListenAddress, "Local IP:port to serve on; the Service VIP is redirected here. The IP is added to the node by the agent.")
	fs.StringVar(&c.ListenLink, "listen-link", agent.DefaultListenLink, "Dummy link to hold the listen IP; loopback is used where the kernel has no dummy links.")
	fs.StringSliceVar(&o.serviceVIPs, "service-vip", []string{agent.DefaultServiceVIP}, "Cluster IP(s) of the default/kubernetes Service.")
	fs.Uint16Var(&c.ServicePort, "service-port", agent.DefaultServicePort, "Port of the default/kubernetes Service.")
	fs.StringSliceVar(&o.upstreams, "upstream", nil, "kube-apiserver endpoint URL(s), https://host:port, dialled directly (never the Service VIP).")
	fs.StringVar(&c.UpstreamCAFile, "upstream-ca-file", agent.DefaultUpstreamCAFile, "CA bundle that verifies kube-apiserver's serving certificate.")
	fs.StringVar(&c.UpstreamServerName, "upstream-server-name", "", "Name to verify in kube-apiserver's certificate (default: each upstream's host).")
	fs.DurationVar(&c.UpstreamCheckTimeout, "upstream-check-timeout", agent.DefaultUpstreamCheckTimeout, "How long start-up waits for an upstream to answer its health check.")
	fs.Uint32Var(&o.socketMark, "upstream-socket-mark", agent.DefaultSocketMark, "Firewall mark set on upstream sockets; marked packets skip the redirect. 0 disables.")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", "", "Serving certificate chain (PEM), issued by the cluster CA for the Service VIP and kubernetes.default.svc names. Reloaded on change.")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", "", "Private key for --tls-cert-file (PEM). Reloaded on change.")
	fs.StringVar(&c.Chain, "iptables-chain", agent.DefaultChain, "Name of the nat chain the agent owns.")
	fs.DurationVar(&c.SyncPeriod, "sync-period", agent.DefaultSyncPeriod, "How often the redirect and address are checked and repaired.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", agent.DefaultMetricsBindAddress, "IP:port serving /metrics, /healthz and /readyz; empty disables.")
	fs.DurationVar(&c.ShutdownGracePeriod, "shutdown-grace-period", agent.DefaultShutdownGracePeriod, "On SIGTERM, how long in-flight requests may run after the redirect is removed.")

	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	fs.AddGoFlagSet(gofs)
	return cmd
}

// complete parses the flags that need more than pflag offers.
func (o *options) complete() error {
	c := &o.cfg
	ap, err := netip.ParseAddrPort(o.listenAddress)
	if err != nil {
		return fmt.Errorf("--listen-address %q: must be IP:port", o.listenAddress)
	}
	c.ListenAddress = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	c.ServiceVIPs = nil
	for _, s := range o.serviceVIPs {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--service-vip %q: not an IP address", s)
		}
		c.ServiceVIPs = append(c.ServiceVIPs, ip.Unmap())
	}
	c.Upstreams = nil
	for _, s := range o.upstreams {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--upstream %q: %w", s, errors.Unwrap(err))
		}
		c.Upstreams = append(c.Upstreams, u)
	}
	c.SocketMark = o.socketMark
	return c.Validate()
}

func run(ctx context.Context, cfg *agent.Config) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := klog.Background().WithName("kube-apicache")
	ctx = klog.NewContext(ctx, logger)

	// A bounded lock wait: an xtables lock held forever by someone else
	// must not hang syncs or shutdown.
	ipt, err := iptables.New(iptables.Timeout(5))
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	a, err := agent.New(cfg, ipt, nl)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
