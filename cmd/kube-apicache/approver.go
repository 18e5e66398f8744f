package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent"
	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/agent/identity"
)

type approverOptions struct {
	kubeconfig     string
	serviceAccount string
	serviceVIPs    []string
	listenAddress  string
	listenIPv6     string
	clusterDomain  string
	workers        int
	maxLifetime    time.Duration
}

func newApproverCommand() *cobra.Command {
	o := &approverOptions{}
	cmd := &cobra.Command{
		Use:   "approver",
		Short: "Approve the agents' serving certificate requests",
		Long: `approver approves a kubernetes.io/kubelet-serving CertificateSigningRequest
only if the agent's ServiceAccount sent it, its CN names the node the
requester's token is bound to, and its SANs and usages are exactly those of an
agent's serving certificate. It denies, with the reason, every other such CSR
from the agent's ServiceAccount and every CSR that asks for the kubernetes
Service's names or IPs; it leaves all other CSRs alone.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			policy, err := o.policy()
			if err != nil {
				return err
			}
			cfg, err := o.restConfig()
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("approver"))
			return approver.NewController(client, policy).Run(ctx, o.workers)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&o.serviceAccount, "agent-service-account", agent.DefaultAgentServiceAccount, "The agents' ServiceAccount, NAMESPACE/NAME.")
	fs.StringSliceVar(&o.serviceVIPs, "service-vip", []string{agent.DefaultServiceVIP}, "Cluster IP(s) of the default/kubernetes Service, as the agents are given them.")
	fs.StringVar(&o.listenAddress, "listen-address", agent.DefaultListenAddress, "The agents' --listen-address; its IP is in their certificates when a --service-vip is IPv4.")
	fs.StringVar(&o.listenIPv6, "listen-address-ipv6", agent.DefaultListenAddressIPv6, "The agents' --listen-address-ipv6; its IP is in their certificates when a --service-vip is IPv6.")
	fs.StringVar(&o.clusterDomain, "cluster-domain", agent.DefaultClusterDomain, "Cluster DNS domain, as the agents are given it.")
	fs.IntVar(&o.workers, "workers", 2, "CSRs decided in parallel.")
	fs.DurationVar(&o.maxLifetime, "max-certificate-lifetime", 7*24*time.Hour, "Longest lifetime (spec.expirationSeconds) an agent CSR may ask for; CSRs without one are denied. Must be at least the agents' --certificate-lifetime.")
	return cmd
}

// policy turns the flags into the approval policy.
func (o *approverOptions) policy() (*approver.Policy, error) {
	ns, name, ok := strings.Cut(o.serviceAccount, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, fmt.Errorf("--agent-service-account %q must be NAMESPACE/NAME", o.serviceAccount)
	}
	var vips []netip.Addr
	for _, s := range o.serviceVIPs {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("--service-vip %q: not an IP address", s)
		}
		vips = append(vips, ip.Unmap())
	}
	if len(vips) == 0 {
		return nil, fmt.Errorf("--service-vip is required")
	}
	ap, err := netip.ParseAddrPort(o.listenAddress)
	if err != nil {
		return nil, fmt.Errorf("--listen-address %q: must be IP:port", o.listenAddress)
	}
	if !ap.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("--listen-address %s must be IPv4 (IPv6: --listen-address-ipv6)", ap.Addr())
	}
	ap6, err := parseListenIPv6(o.listenIPv6)
	if err != nil {
		return nil, err
	}
	if ap6.IsValid() && (!ap6.Addr().Is6() || ap6.Addr().Is4In6()) {
		return nil, fmt.Errorf("--listen-address-ipv6 %s must be IPv6 (IPv4: --listen-address)", ap6.Addr())
	}
	// The agents' own rule picks the listen IPs their certificates name:
	// one per IP family among the VIPs.
	agents := &agent.Config{ServiceVIPs: vips, ListenAddress: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ListenAddressIPv6: ap6}
	listenIPs := agents.ListenIPs()
	if slices.ContainsFunc(listenIPs, func(ip netip.Addr) bool { return !ip.IsValid() }) {
		return nil, fmt.Errorf("--listen-address-ipv6 is required when a --service-vip is IPv6")
	}
	if len(validation.IsDNS1123Subdomain(o.clusterDomain)) > 0 {
		return nil, fmt.Errorf("--cluster-domain %q must be a DNS subdomain", o.clusterDomain)
	}
	if o.workers < 1 {
		return nil, fmt.Errorf("--workers must be at least 1")
	}
	if o.maxLifetime < 10*time.Minute {
		return nil, fmt.Errorf("--max-certificate-lifetime must be at least 10m, the signer's minimum")
	}
	return &approver.Policy{
		AgentUser:   "system:serviceaccount:" + ns + ":" + name,
		SANs:        identity.ServingSANs(vips, listenIPs, o.clusterDomain),
		MaxLifetime: o.maxLifetime,
	}, nil
}

func (o *approverOptions) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("client configuration: %w", err)
	}
	cfg.UserAgent = "kube-apicache-approver"
	return cfg, nil
}
