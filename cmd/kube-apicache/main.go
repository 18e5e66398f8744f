// Command kube-apicache is the node-local Kubernetes API proxy. It only wires
// flags to package agent.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vishvananda/netlink"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent"
	"github.com/kube-apicache/kube-apicache/agent/audit"
	"github.com/kube-apicache/kube-apicache/agent/identity"
	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/agent/serving"
	"github.com/kube-apicache/kube-apicache/agent/status"
	"github.com/kube-apicache/kube-apicache/agent/version"
	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/netrules"
)

func init() {
	// A process applies the logging flags once per command it runs; a
	// second, unchanged application (tests run several commands in one
	// process) is a no-op rather than an error.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
}

func main() {
	err := newCommand().Execute()
	klog.Flush()
	if err == nil {
		return
	}
	code := 1
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			os.Exit(code)
		}
	}
	fmt.Fprintf(os.Stderr, "kube-apicache: %s\n", oneLine(err))
	os.Exit(code)
}

// oneLine keeps start-up errors to a single line, as operators read them in
// `kubectl describe` and crash-loop events.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

type options struct {
	cfg           agent.Config
	listenAddress string
	listenIPv6    string
	serviceVIPs   []string
	upstreams     []string
	socketMark    uint32
	cacheSpec     string
	// forwardConsistentReads is the deprecated --cache-forward-consistent-reads.
	forwardConsistentReads bool
	consistentReads        string
	pinnedSpec             string
	clusterCIDRs           []string
	interception           bool
	version                bool
	config                 configFile
}

func newCommand() *cobra.Command {
	o := &options{}
	var nfs cliflag.NamedFlagSets
	cmd := &cobra.Command{
		Use:   "kube-apicache",
		Short: "Node-local cache and proxy for the Kubernetes API",
		Long: `kube-apicache runs on every node (a DaemonSet with hostNetwork and NET_ADMIN)
and takes the node's pods' traffic to the kubernetes Service VIP, without any
change to the pods: it redirects the VIP to a local TLS listener whose
certificate the cluster CA issued. It answers reads (get, list and watch) of
the resources it caches from a node-local informer cache, with the answers,
errors and authorization decisions kube-apiserver would give, and forwards
every other request to kube-apiserver with the caller's own credentials. When
it is unhealthy, stopped or removed, the kernel hands the VIP back to
kube-proxy within --fail-open-timeout.

Most flags may also be set in one configuration file (--config, kind
AgentConfiguration): all but --node-name and the request limit, audit and
logging flags, which exist on the command line only. A flag on the command
line wins over the file, with a warning in the log for each field it
overrides.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.version {
				fmt.Fprintln(cmd.OutOrStdout(), version.Get())
				return nil
			}
			applied, err := o.config.apply(cmd.Flags())
			if err != nil {
				return err
			}
			discoverService(cmd.Flags(), &o.serviceVIPs, &o.cfg.ServicePort)
			discoverClusterDomain(cmd.Flags(), &o.cfg.ClusterDomain)
			if err := o.complete(); err != nil {
				return applied.Annotate(err)
			}
			return run(cmd.Context(), &o.cfg, &o.config)
		},
	}
	c := &o.cfg
	fs := nfs.FlagSet("node and cluster")
	fs.StringVar(&c.NodeName, "node-name", "", "Name of this node. Default: $NODE_NAME.")
	fs.StringSliceVar(&o.serviceVIPs, "service-vip", nil, "Cluster IP(s) of the default/kubernetes Service, the destinations redirected to the agent. Default: $KUBERNETES_SERVICE_HOST, as the kubelet gives it to every pod, else "+agent.DefaultServiceVIP+". The agent checks them against the Service itself: until it has read the Service, and while they differ, it does not intercept and is not ready.")
	fs.Uint16Var(&c.ServicePort, "service-port", agent.DefaultServicePort, "Port of the default/kubernetes Service. Default: $KUBERNETES_SERVICE_PORT where set.")
	fs.StringVar(&c.ClusterDomain, "cluster-domain", agent.DefaultClusterDomain, "Cluster DNS domain, for the kubernetes.default.svc.<domain> name in the serving certificate. Unset, it is taken from the svc.<domain> entry of the DNS search path the kubelet writes into /etc/resolv.conf, where there is one. Keep it in step with the approver (or set both in the configuration file).")
	fs.StringVar(&o.listenAddress, "listen-address", agent.DefaultListenAddress, "Local IP:port to serve on; the Service VIP is redirected here. The IP is added to the node by the agent.")
	fs.StringVar(&o.listenIPv6, "listen-address-ipv6", agent.DefaultListenAddressIPv6, "Local [IP]:port the IPv6 Service VIP is redirected to, used only when a --service-vip is IPv6 (dual-stack). A unique local address (fd00::/8) no network of the cluster uses: link-local and loopback addresses cannot take DNATed pod traffic.")

	fs = nfs.FlagSet("interception")
	fs.BoolVar(&o.interception, "interception", true, "Intercept the kubernetes Service. false is the kill switch: the agent keeps running (cache, metrics) but hands the VIP to kube-proxy. Set in the configuration (interception.enabled), it is followed while the agent runs: watched in --interception-configmap, else re-read from the --config file every 5 seconds.")
	fs.StringVar(&c.InterceptionConfigMap, "interception-configmap", "", "NAMESPACE/NAME of a ConfigMap holding this configuration (key "+interception.InterceptionConfigMapKey+", with the ConfigMap's other .yaml keys merged over it in name order as --config-dir merges drop-ins) whose interception.enabled the agent watches through the API, so the kill switch takes effect in about a second rather than at the kubelet's next sync of the mounted file; the --config file's own interception.enabled is then not re-read. Needs get, list and watch of that ConfigMap. Ignored when --interception is on the command line.")
	fs.DurationVar(&c.LivenessTimeout, "fail-open-timeout", agent.DefaultLivenessTimeout, "How long the kernel keeps redirecting after the agent's last successful health check: after a crash or hang, the VIP goes back to kube-proxy within this time. This is the redirect's dead-man switch, not the container's livenessProbe.")
	fs.DurationVar(&c.LivenessTimeout, "liveness-timeout", agent.DefaultLivenessTimeout, "Former name of --fail-open-timeout.")
	_ = fs.MarkDeprecated("liveness-timeout", "use --fail-open-timeout")
	fs.DurationVar(&c.SyncPeriod, "sync-period", agent.DefaultSyncPeriod, "How often the redirect and address are checked and repaired.")
	fs.StringVar(&c.DetectLocalMode, "detect-local-mode", interception.DetectLocalPodIPs, "How pod traffic of this node is told from Service VIP traffic routed in from elsewhere (BGP-advertised Service CIDRs), which is left to kube-proxy: "+strings.Join(interception.DetectLocalModes, ", ")+". PodIPs follows the IPs of this node's pods and works with any CNI; the others are kube-proxy's modes. Host-network traffic is always intercepted.")
	fs.StringSliceVar(&o.clusterCIDRs, "cluster-cidr", nil, "Pod CIDR of the cluster, one per IP family, for --detect-local-mode=ClusterCIDR.")
	fs.StringVar(&c.PodBridgeInterface, "pod-bridge-interface", "", "Bridge the node's pods are attached to, for --detect-local-mode=BridgeInterface.")
	fs.StringVar(&c.PodInterfaceNamePrefix, "pod-interface-name-prefix", "", "Prefix of the node's pod interfaces (cali, lxc, veth), for --detect-local-mode=InterfaceNamePrefix.")
	fs.DurationVar(&c.PodPathCheckInterval, "pod-path-check-interval", agent.DefaultPodPathCheckInterval, "How often the node's conntrack flows to the Service VIPs are checked for pod connections that were redirected to the agent and dropped on the way (a NetworkPolicy or host firewall), whose sources then go to kube-proxy's path, or that bypassed the agent; 0 turns the check off.")
	fs.DurationVar(&c.BypassDuration, "bypass-duration", agent.DefaultBypassDuration, "How long a source whose traffic to the agent was dropped, or that presented a TLS client certificate, goes to kube-proxy's path.")
	fs.DurationVar(&c.ShutdownGracePeriod, "shutdown-grace-period", agent.DefaultShutdownGracePeriod, "On SIGTERM, how long in-flight requests may run after the redirect is removed.")
	fs.DurationVar(&c.ExternalDrainDelay, "external-drain-delay", agent.DefaultExternalDrainDelay, "With --dataplane=external, how long the agent keeps serving on SIGTERM after it turned not ready, while the kubelet's readiness probe and the redirect's owner take it out of the redirect, before --shutdown-grace-period starts.")

	fs = nfs.FlagSet("dataplane")
	fs.StringVar(&c.Dataplane, "dataplane", interception.DataplaneAuto, "Where the redirect lives: auto (nftables where kube-proxy runs in nftables mode or iptables is the nf_tables backend, so that the redirect runs ahead of every dstnat chain; iptables on legacy-iptables nodes), iptables or nftables. The other one's redirect, left by an agent that used it, is removed. external: another component (a Cilium Local Redirect Policy) redirects the Service to this agent; it programs no netfilter (it only removes a redirect an agent left), listens on every address at the --listen-address ports, and its readiness is the only switch.")
	fs.StringVar(&c.NFTablesTable, "nftables-table", agent.DefaultNFTablesTable, "Name of the agent's nftables table (ip and ip6 families) in the nftables dataplane.")
	fs.Int32Var(&c.NFTablesPriority, "nftables-priority", agent.DefaultNFTablesPriority, "Priority of the nftables dataplane's nat prerouting and output chains, in [-199, -101] (strictly before dstnat, where the order of equal priorities is undefined); the default, dstnat-1, runs ahead of kube-proxy's nftables mode and iptables-nft, which run at dstnat (-100).")
	fs.StringVar(&c.IPTablesBackend, "iptables-backend", agent.DefaultIPTablesBackend, "iptables backend for the redirect: auto (the one kube-proxy uses, found by its KUBE-IPTABLES-HINT chain), legacy or nft.")
	fs.StringVar(&c.Chain, "iptables-chain", agent.DefaultChain, "Name of the nat chain the agent owns.")
	fs.StringVar(&c.LivenessSet, "fail-open-set", agent.DefaultLivenessSet, "ipset holding the VIP(s) while the agent is healthy, each entry timing out after --fail-open-timeout; the iptables redirect applies only to VIPs in it (IPv6 set: this name with a 6 suffix).")
	fs.StringVar(&c.LivenessSet, "liveness-set", agent.DefaultLivenessSet, "Former name of --fail-open-set.")
	_ = fs.MarkDeprecated("liveness-set", "use --fail-open-set")
	fs.StringVar(&c.ListenLink, "listen-link", agent.DefaultListenLink, "Dummy link to hold the listen IP; loopback is used where the kernel has no dummy links.")
	fs.Uint32Var(&o.socketMark, "upstream-socket-mark", agent.DefaultSocketMark, "Firewall mark set on upstream sockets; marked packets skip the redirect. 0 disables.")

	fs = nfs.FlagSet("upstream")
	fs.StringSliceVar(&o.upstreams, "upstream", nil, "kube-apiserver endpoint URL(s), https://host:port, to start from; the default/kubernetes EndpointSlices replace them once read. Default: the kubernetes Service from $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT, reached through kube-proxy's rules.")
	fs.StringVar(&c.UpstreamCAFile, "upstream-ca-file", agent.DefaultUpstreamCAFile, "CA bundle that verifies kube-apiserver's serving certificate. Point it at a dedicated apiserver CA where the cluster has one: the cluster CA also signs kubelet-serving certificates.")
	fs.StringVar(&c.UpstreamServerName, "upstream-server-name", agent.DefaultUpstreamServerName, "DNS name (or IP) every kube-apiserver endpoint's certificate must carry, whichever endpoint IP is dialled; change it only for an apiserver certificate without the default name. Certificates of system:nodes are refused whatever the name.")
	fs.DurationVar(&c.UpstreamCheckTimeout, "upstream-check-timeout", agent.DefaultUpstreamCheckTimeout, "How long start-up waits for an upstream to answer its health check.")
	fs.DurationVar(&c.UpstreamHealthPeriod, "upstream-health-period", agent.DefaultUpstreamHealthPeriod, "How often upstream health is looked at: the ping interval of a silent upstream HTTP/2 connection and the probe interval of a failing endpoint; a healthy endpoint is probed (GET /readyz) only after 2 minutes without an answer from it.")
	fs.StringVar(&c.TokenFile, "token-file", agent.DefaultTokenFile, "The agent's own ServiceAccount token, for its informers, access reviews and CSRs (never for forwarded requests).")

	fs = nfs.FlagSet("serving certificate")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", "", "Serving certificate chain (PEM), issued by the cluster CA for the Service VIP and kubernetes.default.svc names. Reloaded on change. Without it the certificate is requested through the CSR API (signer --signer-name) and its key kept in memory.")
	fs.StringVar(&c.TLSKeyFile, "tls-private-key-file", "", "Private key for --tls-cert-file (PEM). Reloaded on change.")
	fs.StringVar(&c.PodCAFile, "pod-ca-file", agent.DefaultPodCAFile, "CA bundle pods verify the agent with (the ServiceAccount ca.crt, from kube-root-ca.crt). The agent intercepts only while its certificate verifies against it for every name and IP pods dial. Reloaded on change.")
	fs.StringVar(&c.SignerName, "signer-name", identity.DefaultSignerName, "Signer the serving certificate is requested from (CSR spec.signerName). Its CA must be one the pods' CA bundle trusts. Keep it in step with the approver (or set both in the configuration file).")
	fs.DurationVar(&c.CertificateLifetime, "certificate-lifetime", agent.DefaultCertificateLifetime, "Lifetime requested for a CSR-issued serving certificate (at least 10m); it is renewed at a random 70-90% of its lifetime, and at once on SIGHUP.")
	fs.StringVar(&c.CertificateStateDir, "certificate-state-dir", "", "In CSR mode, a directory (mount a memory-backed emptyDir) where the key, certificate, pending CSR and last denial are kept 0600, so a restarted container serves a still-valid certificate without a new CSR. Empty: the key is kept in the process only.")

	fs = nfs.FlagSet("cache")
	fs.StringVar(&o.cacheSpec, "cache-resources", cache.DefaultResources, "Resources whose get and list requests are answered from the node-local cache, as RESOURCE[.GROUP][/VERSION] (custom resources included); pods and nodes are cached for this node only. Secrets are cached only if listed. Empty disables the cache.")
	fs.StringVar(&o.pinnedSpec, "cache-pinned-resources", "", "Resources of --cache-resources (same syntax) watched from start-up. Every other cached resource is watched only from the first read of it by a caller allowed to make it (that read, and the next ones until the watch has synced, are forwarded) until --cache-idle-timeout passes without such a read.")
	fs.DurationVar(&c.CacheWaitTimeout, "cache-wait-timeout", cache.DefaultWaitTimeout, "How long a read waits for the cache to reach the resourceVersion it needs (a requested one, or a write this agent forwarded) before it is forwarded instead.")
	fs.StringVar(&o.consistentReads, "cache-consistent-reads", string(cache.ConsistentProbe), "How reads with resourceVersion unset (consistent reads) are answered. probe: from the cache once a metadata-only consistent list of the cached scope (at most one in flight per resource, shared by the reads waiting) shows that the cache holds at least kube-apiserver's current state, as linearizable as kube-apiserver's own; forwarded if it does not catch up within --cache-wait-timeout, or if the scope holds more than --cache-probe-max-objects objects. local-writes: from the cache once it has seen every write this agent forwarded, without asking kube-apiserver (a write made elsewhere a moment earlier may not be seen yet). forward: every one is forwarded.")
	fs.IntVar(&c.CacheProbeMaxObjects, "cache-probe-max-objects", cache.DefaultProbeMaxObjects, "With --cache-consistent-reads=probe, consistent reads of a resource whose cached scope holds more objects than this are forwarded: the probe would cost kube-apiserver about as much as the read. Negative: no bound.")
	fs.BoolVar(&o.forwardConsistentReads, "cache-forward-consistent-reads", false, "Forward every consistent read; the same as --cache-consistent-reads=forward.")
	_ = fs.MarkDeprecated("cache-forward-consistent-reads", "use --cache-consistent-reads=forward")
	fs.DurationVar(&c.CacheIdleTimeout, "cache-idle-timeout", cache.DefaultIdleTimeout, "How long the watch of a resource that is not pinned runs without a read it answers before it stops and its objects are dropped; 0 never stops it. It also bounds restarts: each resource is listed at most once per this period.")
	fs.DurationVar(&c.CacheWarmupTimeout, "cache-warmup-timeout", agent.DefaultCacheWarmupTimeout, "How long, after start-up, the agent waits for the first lists of the pinned resources before it intercepts; until then pods reach kube-apiserver through kube-proxy. An agent that cannot hold them (a memory limit too low for the cluster) dies before it takes the node's traffic. 0 does not wait.")
	fs.IntVar(&c.CacheHistoryEvents, "cache-history-events", cache.DefaultHistoryEvents, "Events each cached resource keeps for watches from a resourceVersion; a watch from before the oldest is forwarded to kube-apiserver, which serves it or answers 410 Gone as it would directly.")
	fs.IntVar(&c.CacheHistoryBytes, "cache-history-bytes", cache.DefaultHistoryBytes, "Estimated bytes of objects each cached resource's event window may keep alive; the oldest events go first past it.")
	fs.DurationVar(&c.DegradedDecisionTTL, "degraded-decision-ttl", agent.DefaultDegradedDecisionTTL, "Degraded mode: when no kube-apiserver endpoint has answered for a few seconds and kube-proxy's own path to the Service VIP fails too, the agent keeps the redirect and answers cached reads to callers kube-apiserver allowed the same request (same token, same attributes) within this long, with a JWT not past its expiry; everything else fails fast (503 with Retry-After, consistent reads 504). A revoked RoleBinding is honoured at most this long after revocation. 0 disables degraded mode: the agent then hands the VIP back to kube-proxy whenever no upstream is healthy.")
	fs.BoolVar(&c.CacheAsNode, "cache-as-node", true, "List and watch this node's pods and Node as the node itself (Impersonate-User: system:node:<node>, Kubernetes 1.36+ constrained impersonation, feature gate ConstrainedImpersonation), so the Node authorizer limits what the agent's token reads; needs the kube-apicache:node-impersonation RBAC and a pod-bound token. false: watch them as the agent, whose RBAC must then allow cluster-wide list and watch of pods and nodes (clusters without the gate).")

	c.Limits = serving.DefaultLimits()
	c.Limits.AddFlags(nfs.FlagSet("request limits"))
	c.Audit = audit.NewOptions()
	c.Audit.AddFlags(nfs.FlagSet("audit"))
	nfs.FlagSet("rewriting").StringVar(&c.RewriteConfigFile, "rewrite-config", "", "A RewriteConfiguration file (apiVersion config.kube-apicache.io/v1alpha1): the rewrite profiles, each renaming API groups, kinds, resources and metadata keys for the ServiceAccounts it selects (docs/concepts/rewriting.md). Checked at start-up against what the cluster serves; any mistake stops the agent. Empty: no caller is rewritten, at no cost.")

	fs = nfs.FlagSet("metrics and health")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", agent.DefaultMetricsBindAddress, "host:port serving /metrics, /healthz, /livez, /readyz, /intercepting and "+status.StatuszPath+" over HTTPS. /metrics and "+status.StatuszPath+" need a bearer token that kube-apiserver authenticates and RBAC allows (get on the nonResourceURL, as in the kube-apicache:metrics-reader and kube-apicache:status-reader ClusterRoles); the health paths answer anyone. Empty disables.")
	fs.StringVar(&c.MetricsTLSCertFile, "metrics-tls-cert-file", "", "Certificate chain (PEM) the metrics listener serves, reloaded as it changes; with --metrics-tls-private-key-file. Empty: a self-signed certificate made at start-up.")
	fs.StringVar(&c.MetricsTLSKeyFile, "metrics-tls-private-key-file", "", "Private key (PEM) of --metrics-tls-cert-file.")
	fs.BoolVar(&c.Profiling, "profiling", false, "Serve Go profiles (net/http/pprof) under /debug/pprof/ on --metrics-bind-address, to tokens RBAC allows; refused unless that address is on loopback.")

	o.config.addFlags(nfs.FlagSet("generic"))
	nfs.FlagSet("generic").BoolVar(&o.version, "version", false, "Print the version and exit.")
	logging := nfs.FlagSet("logging")
	logCfg := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logCfg, logging)
	// The split streams need the LoggingAlphaOptions feature gate, which
	// this command has no flag to turn on.
	for _, name := range []string{"log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"} {
		if logging.Lookup(name) != nil {
			_ = logging.MarkHidden(name)
		}
	}
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		if err := logsapi.ValidateAndApply(logCfg, nil); err != nil {
			return fmt.Errorf("logging: %w", err)
		}
		return nil
	}

	for _, name := range nfs.Order {
		if name == "logging" {
			cmd.PersistentFlags().AddFlagSet(nfs.FlagSets[name])
			continue
		}
		cmd.Flags().AddFlagSet(nfs.FlagSets[name])
	}
	cmd.AddCommand(newApproverCommand(), newCleanupCommand(), newVersionCommand(), newStatusCommand(), newDiffCommand(), newWebhookProxyCommand(), newDocsCommand(cmd))
	rootHelp(cmd, nfs)
	for _, sub := range cmd.Commands() {
		subcommandHelp(sub, nfs.FlagSet("logging"))
	}
	return cmd
}

// rootHelp gives the agent's command a help and usage that name the
// subcommands, a line each, ahead of the flag sections.
func rootHelp(cmd *cobra.Command, nfs cliflag.NamedFlagSets) {
	usage := func(w io.Writer, c *cobra.Command) {
		fmt.Fprintf(w, "Usage:\n  %s\n  %s [command]\n\nCommands:\n", c.UseLine(), c.CommandPath())
		subs := listedSubcommands(c)
		width := 10
		for _, sub := range subs {
			width = max(width, len(sub.Name()))
		}
		for _, sub := range subs {
			fmt.Fprintf(w, "  %-*s %s\n", width, sub.Name(), sub.Short)
		}
		fmt.Fprintf(w, "\nUse \"%s [command] --help\" for a command's flags.\n", c.CommandPath())
		cliflag.PrintSections(w, nfs, helpColumns)
	}
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		usage(c.OutOrStderr(), c)
		return nil
	})
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) {
		fmt.Fprintf(c.OutOrStdout(), "%s\n\n", c.Long)
		usage(c.OutOrStdout(), c)
	})
}

// listedSubcommands are the subcommands --help names: not the hidden ones,
// nor cobra's own help and completion.
func listedSubcommands(c *cobra.Command) []*cobra.Command {
	var subs []*cobra.Command
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() && sub.Name() != "help" && sub.Name() != "completion" {
			subs = append(subs, sub)
		}
	}
	return subs
}

// subcommandHelp gives sub a help of its own, its flags and then the
// logging flags it inherits, rather than the agent's sections.
func subcommandHelp(sub *cobra.Command, logging *pflag.FlagSet) {
	var nfs cliflag.NamedFlagSets
	nfs.FlagSet(sub.Name()).AddFlagSet(sub.LocalNonPersistentFlags())
	nfs.FlagSet("logging").AddFlagSet(logging)
	cliflag.SetUsageAndHelpFunc(sub, nfs, helpColumns)
}

// complete parses the flags that need more than pflag offers.
func (o *options) complete() error {
	c := &o.cfg
	if c.NodeName == "" {
		c.NodeName = os.Getenv("NODE_NAME")
	}
	ap, err := netip.ParseAddrPort(o.listenAddress)
	if err != nil {
		return fmt.Errorf("--listen-address %q: must be IP:port", o.listenAddress)
	}
	c.ListenAddress = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if c.ListenAddressIPv6, err = parseListenIPv6(o.listenIPv6); err != nil {
		return err
	}
	c.ClusterCIDRs = nil
	for _, s := range o.clusterCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--cluster-cidr %q: must be a CIDR", s)
		}
		c.ClusterCIDRs = append(c.ClusterCIDRs, p)
	}
	c.ServiceVIPs = nil
	for _, s := range o.serviceVIPs {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--service-vip %q: not an IP address", s)
		}
		c.ServiceVIPs = append(c.ServiceVIPs, ip.Unmap())
	}
	c.Upstreams = nil
	if len(o.upstreams) == 0 {
		o.upstreams = inClusterUpstream()
	}
	for _, s := range o.upstreams {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--upstream %q: %w", s, errors.Unwrap(err))
		}
		c.Upstreams = append(c.Upstreams, u)
	}
	c.SocketMark = o.socketMark
	c.InterceptionDisabled = !o.interception
	if o.config.cliInterception && c.InterceptionConfigMap != "" {
		// The command line's --interception wins over every other source.
		c.InterceptionConfigMap = ""
	}
	if c.CacheResources, err = cache.ParseResources(o.cacheSpec); err != nil {
		return err
	}
	c.CacheConsistentReads = cache.ConsistentReads(o.consistentReads)
	if !slices.Contains(cache.ConsistentReadModes, o.consistentReads) {
		return fmt.Errorf("--cache-consistent-reads %q: must be one of %s", o.consistentReads, strings.Join(cache.ConsistentReadModes, ", "))
	}
	if o.forwardConsistentReads {
		if c.CacheConsistentReads == cache.ConsistentLocalWrites {
			return errors.New("--cache-forward-consistent-reads contradicts --cache-consistent-reads=local-writes")
		}
		c.CacheConsistentReads = cache.ConsistentForward
	}
	if c.CachePinnedResources, err = cache.ParsePinned(o.pinnedSpec, c.CacheResources); err != nil {
		return err
	}
	return c.Validate()
}

// inClusterUpstream is the bootstrap upstream without --upstream: the
// kubernetes Service as the kubelet gives it to every pod. The agent dials
// it with its socket mark, so kube-proxy's rules, not the agent's own
// redirect, carry it to an apiserver; the EndpointSlices then name the
// apiservers themselves.
func inClusterUpstream() []string {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil
	}
	return []string{"https://" + net.JoinHostPort(host, port)}
}

// parseListenIPv6 parses --listen-address-ipv6; empty means none.
func parseListenIPv6(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("--listen-address-ipv6 %q: must be [IP]:port", s)
	}
	return ap, nil
}

func run(ctx context.Context, cfg *agent.Config, config *configFile) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := klog.Background().WithName("kube-apicache")
	ctx = klog.NewContext(ctx, logger)

	backend, why := netrules.ResolveBackend(ctx, netrules.Backend(cfg.IPTablesBackend), netrules.ExecSave)
	logger.Info("Using iptables backend", "backend", backend, "reason", why)
	nl, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	k := interception.Kernel{
		IPTables:  func(f netrules.Family) (netrules.IPTables, error) { return netrules.OpenIPTables(backend, f) },
		Backend:   string(backend),
		Netlink:   nl,
		IPSet:     nl,
		Conntrack: netrules.KernelConntrack{},
	}
	if nft, err := netrules.NewKernelNFTables(); err != nil {
		logger.Info("nftables is not available; the iptables dataplane only", "err", err)
	} else {
		defer nft.Close()
		k.NFTables = nft
	}
	a, err := agent.New(cfg, k)
	if err != nil {
		return err
	}
	if cfg.InterceptionConfigMap == "" {
		go config.watchKillSwitch(ctx, a)
	}
	// SIGHUP renews the serving certificate now.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.RenewCertificate()
			}
		}
	}()
	return a.Run(ctx)
}
