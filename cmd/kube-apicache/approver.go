package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent"
	"github.com/kube-apicache/kube-apicache/agent/approver"
	"github.com/kube-apicache/kube-apicache/agent/identity"
	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/agent/status"
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
	maxCSRAge      time.Duration
	qps            float32
	burst          int
	metricsAddress string
	metricsCert    string
	metricsKey     string
	leaderElect    bool
	leader         approver.LeaderElection
	signerName     string
	config         configFile
}

// Fleet-sized defaults. A rollout to 5,000 nodes approved within two
// minutes needs 5,000 / 120s ≈ 42 approvals/s, each one UPDATE of
// /approval (the informer's list and watch are a few requests in all):
// 100 QPS with a burst of 200 approves 5,000 in about 50s, leaving room
// for denials and conflicts. Each worker waits one round trip per
// decision; 10 keep 100/s going at up to 100ms per update.
const (
	defaultApproverQPS     = 100
	defaultApproverBurst   = 200
	defaultApproverWorkers = 10
	// defaultApproverMetricsAddress serves /metrics, /healthz, /livez and
	// /readyz over HTTPS on the pod's network for the kubelet's probes and
	// a scraper.
	defaultApproverMetricsAddress = ":10446"
	// inClusterNamespaceFile names the pod's namespace, the Lease's
	// default namespace.
	inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

func newApproverCommand() *cobra.Command {
	o := &approverOptions{config: configFile{sections: approverSections}}
	cmd := &cobra.Command{
		Use:   "approver",
		Short: "Approve the agents' serving certificate requests",
		Long: `approver approves a CertificateSigningRequest for its signer (--signer-name,
default kubernetes.io/kubelet-serving) only if the agent's ServiceAccount sent it, its CN names the node the
requester's token is bound to, and its SANs and usages are exactly those of an
agent's serving certificate. It denies, with the reason, every other such CSR
from the agent's ServiceAccount and every CSR that asks for the kubernetes
Service's names or IPs; it leaves all other CSRs alone.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			applied, err := o.config.apply(cmd.Flags())
			if err != nil {
				return err
			}
			discoverService(cmd.Flags(), &o.serviceVIPs, nil)
			discoverClusterDomain(cmd.Flags(), &o.clusterDomain)
			policy, err := o.policy()
			if err != nil {
				return applied.Annotate(err)
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
			return o.run(ctx, cfg, client, policy)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&o.serviceAccount, "agent-service-account", agent.DefaultAgentServiceAccount, "The agents' ServiceAccount, NAMESPACE/NAME.")
	o.config.addFlags(fs)
	fs.StringSliceVar(&o.serviceVIPs, "service-vip", nil, "Cluster IP(s) of the default/kubernetes Service, as the agents are given them. Default: $KUBERNETES_SERVICE_HOST, else "+agent.DefaultServiceVIP+".")
	fs.StringVar(&o.signerName, "signer-name", identity.DefaultSignerName, "Signer of the CSRs this approver decides (spec.signerName), as the agents are given it. Its RBAC must allow approve on signers/<this name>.")
	fs.StringVar(&o.listenAddress, "listen-address", agent.DefaultListenAddress, "The agents' --listen-address; its IP is in their certificates when a --service-vip is IPv4.")
	fs.StringVar(&o.listenIPv6, "listen-address-ipv6", agent.DefaultListenAddressIPv6, "The agents' --listen-address-ipv6; its IP is in their certificates when a --service-vip is IPv6.")
	fs.StringVar(&o.clusterDomain, "cluster-domain", agent.DefaultClusterDomain, "Cluster DNS domain, as the agents are given it. Unset, it is taken from the DNS search path in /etc/resolv.conf, as the agents take it.")
	fs.IntVar(&o.workers, "workers", defaultApproverWorkers, "CSRs decided in parallel.")
	fs.DurationVar(&o.maxLifetime, "max-certificate-lifetime", 7*24*time.Hour, "Longest lifetime (spec.expirationSeconds) an agent CSR may ask for; CSRs without one are denied. Must be at least the agents' --certificate-lifetime.")
	fs.DurationVar(&o.maxCSRAge, "max-csr-age", identity.PendingCSRTimeout, "Pending CSRs older than this are left undecided: the agents give up on a CSR after this long and send another. 0: no limit.")
	fs.Float32Var(&o.qps, "kube-api-qps", defaultApproverQPS, "Requests per second to kube-apiserver (one per decision).")
	fs.IntVar(&o.burst, "kube-api-burst", defaultApproverBurst, "Burst of requests to kube-apiserver.")
	fs.StringVar(&o.metricsAddress, "metrics-bind-address", defaultApproverMetricsAddress, "host:port serving /metrics, /healthz, /livez and /readyz over HTTPS. /metrics needs a bearer token that kube-apiserver authenticates and RBAC allows (get on the nonResourceURL, as in the kube-apicache:metrics-reader ClusterRole); the others answer anyone. Empty disables.")
	fs.StringVar(&o.metricsCert, "metrics-tls-cert-file", "", "Certificate chain (PEM) the metrics listener serves, reloaded as it changes; with --metrics-tls-private-key-file. Empty: a self-signed certificate made at start-up.")
	fs.StringVar(&o.metricsKey, "metrics-tls-private-key-file", "", "Private key (PEM) of --metrics-tls-cert-file.")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Decide CSRs only while holding the approver's Lease, so replicas can stand by.")
	fs.StringVar(&o.leader.Namespace, "leader-elect-resource-namespace", "", "Namespace of the Lease; empty: the pod's own namespace (kube-apicache outside a pod).")
	fs.StringVar(&o.leader.Name, "leader-elect-resource-name", "kube-apicache-approver", "Name of the Lease.")
	fs.DurationVar(&o.leader.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long standbys wait after the leader's last renewal before taking over.")
	fs.DurationVar(&o.leader.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader retries a renewal before it steps down; less than the lease duration.")
	fs.DurationVar(&o.leader.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "How often candidates try to acquire or renew the Lease.")
	return cmd
}

// run serves the probes and metrics and decides CSRs, as the leader if
// leader election is on.
func (o *approverOptions) run(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, policy *approver.Policy) error {
	logger := klog.FromContext(ctx)
	metrics := approver.NewMetrics()
	// The same build information as the agents', told apart by the
	// scrape's app_kubernetes_io_name label.
	metrics.Registry.MustRegister(status.BuildInfo())
	ctrl := approver.NewController(client, policy, approver.ControllerOptions{MaxAge: o.maxCSRAge, Metrics: metrics})
	var leading atomic.Bool
	lead := func(ctx context.Context) {
		leading.Store(true)
		defer leading.Store(false)
		if err := ctrl.Run(ctx, o.workers); err != nil && ctx.Err() == nil {
			logger.Error(err, "Approver stopped")
		}
	}
	// A standby is ready; the leader once its informer has synced.
	readyz := func(*http.Request) error {
		if leading.Load() && !ctrl.Synced() {
			return errors.New("leading, CertificateSigningRequest informer not synced yet")
		}
		return nil
	}
	health := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	if o.metricsAddress != "" {
		host, _ := os.Hostname()
		l, err := approver.NewListener(approver.ListenerConfig{
			Name:        host,
			TLSCertFile: o.metricsCert,
			TLSKeyFile:  o.metricsKey,
			RESTConfig:  cfg,
		}, metrics, health.Check, readyz)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", o.metricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-bind-address: %w", err)
		}
		serveErr := make(chan error, 1)
		srv, err := l.Start(ctx, ln, serveErr)
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer srv.Close()
		go func() {
			if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "Metrics listener stopped", "address", o.metricsAddress)
			}
		}()
	}
	if !o.leaderElect {
		lead(ctx)
		return nil
	}
	le := o.leader
	if le.Namespace == "" {
		le.Namespace = "kube-apicache"
		if b, err := os.ReadFile(inClusterNamespaceFile); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			le.Namespace = strings.TrimSpace(string(b))
		}
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	le.Identity = host + "_" + string(uuid.NewUUID())
	// Lease renewals get a client and a rate limiter of their own, so a
	// burst of decisions cannot make the leader miss its renewals.
	leCfg := rest.CopyConfig(cfg)
	leCfg.QPS, leCfg.Burst = 5, 10
	leCfg.Timeout = le.RenewDeadline / 2
	leCfg.UserAgent += "/leader-election"
	leClient, err := kubernetes.NewForConfig(leCfg)
	if err != nil {
		return err
	}
	return approver.RunAsLeader(ctx, leClient, le, metrics, health, lead)
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
	agents := &interception.Config{ServiceVIPs: vips, ListenAddress: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ListenAddressIPv6: ap6}
	listenIPs := agents.ListenIPs()
	if slices.ContainsFunc(listenIPs, func(ip netip.Addr) bool { return !ip.IsValid() }) {
		return nil, fmt.Errorf("--listen-address-ipv6 is required when a --service-vip is IPv6")
	}
	if len(validation.IsDNS1123Subdomain(o.clusterDomain)) > 0 {
		return nil, fmt.Errorf("--cluster-domain %q must be a DNS subdomain", o.clusterDomain)
	}
	if err := identity.ValidateSignerName(o.signerName); err != nil {
		return nil, fmt.Errorf("--signer-name: %w", err)
	}
	if o.workers < 1 {
		return nil, fmt.Errorf("--workers must be at least 1")
	}
	if o.maxLifetime < 10*time.Minute {
		return nil, fmt.Errorf("--max-certificate-lifetime must be at least 10m, the signer's minimum")
	}
	if o.maxCSRAge < 0 {
		return nil, fmt.Errorf("--max-csr-age must not be negative")
	}
	if (o.metricsCert == "") != (o.metricsKey == "") {
		return nil, fmt.Errorf("--metrics-tls-cert-file and --metrics-tls-private-key-file go together")
	}
	if o.qps <= 0 || o.burst < 1 {
		return nil, fmt.Errorf("--kube-api-qps must be positive and --kube-api-burst at least 1")
	}
	if o.leaderElect && (o.leader.RetryPeriod <= 0 || o.leader.RenewDeadline <= o.leader.RetryPeriod || o.leader.LeaseDuration <= o.leader.RenewDeadline) {
		return nil, fmt.Errorf("leader election needs 0 < --leader-elect-retry-period < --leader-elect-renew-deadline < --leader-elect-lease-duration")
	}
	return &approver.Policy{
		AgentUser:   "system:serviceaccount:" + ns + ":" + name,
		SANs:        identity.ServingSANs(vips, listenIPs, o.clusterDomain),
		SignerName:  o.signerName,
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
	cfg.QPS, cfg.Burst = o.qps, o.burst
	return cfg, nil
}
