package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kube-apicache/kube-apicache/agent/audit"
	"github.com/kube-apicache/kube-apicache/agent/identity"
	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/agent/serving"
	"github.com/kube-apicache/kube-apicache/agent/upstream"
	"github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/netrules"
)

// Config holds everything the agent needs to run. The command line fills it
// in; Validate checks it before anything touches the node.
type Config struct {
	// Config is the interception's part: the node, the listen addresses,
	// the Service VIPs and the redirect's names and timings.
	interception.Config

	// Upstreams are kube-apiserver endpoints, dialled directly and never
	// through the Service VIP.
	Upstreams []*url.URL
	// UpstreamCAFile is the CA bundle that verifies the upstream serving
	// certificates (in a pod: the ServiceAccount ca.crt). Where
	// kube-apiserver's serving certificate comes from a CA of its own, this
	// should be that CA alone: the cluster CA also signs kubelet-serving
	// certificates, the agents' among them.
	UpstreamCAFile string
	// UpstreamServerName is the DNS name (or IP) every upstream certificate
	// must carry, whichever endpoint IP was dialled. Empty means
	// DefaultUpstreamServerName; set it only for an apiserver certificate
	// that lacks that name (see upstreamTLSConfig).
	UpstreamServerName string
	// UpstreamCheckTimeout bounds the start-up health check of the upstream.
	UpstreamCheckTimeout time.Duration
	// TokenFile is the agent's own ServiceAccount token, used only for the
	// agent's own requests (informers, reviews, CSRs), never for forwarded
	// ones.
	TokenFile string

	// TLSCertFile and TLSKeyFile hold the serving certificate chain and key.
	// Both empty: the certificate is obtained through the CSR API instead.
	TLSCertFile string
	TLSKeyFile  string
	// PodCAFile is the CA bundle pods verify the agent with: their
	// ServiceAccount ca.crt, filled by the kubelet from kube-root-ca.crt.
	// The serving certificate must verify against it before the agent
	// intercepts. Empty means DefaultPodCAFile.
	PodCAFile string
	// ClusterDomain is the cluster's DNS domain, for the
	// kubernetes.default.svc.<domain> name in the serving certificate.
	// Empty means DefaultClusterDomain.
	ClusterDomain string
	// CertificateLifetime is the lifetime requested for a CSR-issued
	// serving certificate (CSR spec.expirationSeconds). Zero means
	// DefaultCertificateLifetime.
	CertificateLifetime time.Duration
	// CertificateStateDir, in CSR mode, is a directory (a memory-backed
	// volume) where the serving key and certificate, a pending CSR and
	// the last denial are kept for the next container in the pod. Empty:
	// the key lives in the process only and every start sends a CSR.
	CertificateStateDir string
	// SignerName, in CSR mode, is the signer the serving certificate is
	// requested from (CSR spec.signerName). Empty means
	// identity.DefaultSignerName, kubernetes.io/kubelet-serving. Another
	// signer (cert-manager's clusterissuers.cert-manager.io/<name>, a
	// platform's own such as EKS's beta.eks.amazonaws.com/app-serving)
	// must issue from a CA the pods' CA bundle trusts, and the approver
	// must be configured for the same name. Unused with TLSCertFile.
	SignerName string

	// IPTablesBackend is "auto", "legacy" or "nft": which iptables the
	// rules are written with. auto follows kube-proxy.
	IPTablesBackend string
	// UpstreamHealthPeriod is how often upstream health is looked at: the
	// ping interval of a silent upstream connection and the probe interval
	// of a failing endpoint (package upstream, health.go).
	UpstreamHealthPeriod time.Duration

	// MetricsBindAddress (host:port) serves /metrics, /healthz, /livez,
	// /readyz and /intercepting over HTTPS; empty disables it. Every path
	// but the health ones needs a bearer token that kube-apiserver
	// authenticates (TokenReview) and authorizes (SubjectAccessReview, a
	// nonResourceURL get) (package status).
	MetricsBindAddress string
	// MetricsTLSCertFile and MetricsTLSKeyFile hold the metrics listener's
	// certificate chain and key, reloaded as they change. Both empty: a
	// self-signed certificate is made at start-up.
	MetricsTLSCertFile string
	MetricsTLSKeyFile  string
	// Profiling adds net/http/pprof's handlers under /debug/pprof/ to the
	// MetricsBindAddress listener, which must then be a loopback address.
	Profiling bool

	// ShutdownGracePeriod bounds how long in-flight requests and watches
	// may run after the redirect is removed on shutdown.
	ShutdownGracePeriod time.Duration
	// ExternalDrainDelay is, with the external dataplane, how long the
	// agent keeps serving at shutdown after it turned not ready, before
	// it closes its listeners: the time the kubelet's readiness probe and
	// the redirect's owner (a Cilium Local Redirect Policy) take to send
	// the Service elsewhere. Unused with a dataplane of the agent's own,
	// which removes its redirect itself.
	ExternalDrainDelay time.Duration

	// Limits bound what clients can make the agent hold (package serving).
	Limits serving.Limits

	// CacheResources are the resources whose covered reads are answered
	// from the node-local cache; empty disables the cache.
	CacheResources []cache.ResourceSpec
	// CacheWaitTimeout bounds how long a read waits for the cache to reach
	// the resourceVersion it needs before it is forwarded.
	CacheWaitTimeout time.Duration
	// CacheConsistentReads says how reads with resourceVersion unset are
	// answered (cache.ConsistentProbe when empty).
	CacheConsistentReads cache.ConsistentReads
	// CacheProbeMaxObjects bounds the scopes consistent reads probe
	// (cache.Config.ProbeMaxObjects).
	CacheProbeMaxObjects int
	// CacheAsNode watches this node's pods and Node as the node
	// (constrained impersonation of system:node:<NodeName>) rather than as
	// the agent, whose RBAC then needs no pods or nodes at all.
	CacheAsNode bool
	// CachePinnedResources (a subset of CacheResources) are watched from
	// start-up; every other cached resource is watched only from the
	// first read an allowed caller makes of it until CacheIdleTimeout
	// passes without one.
	CachePinnedResources []cache.ResourceSpec
	// CacheIdleTimeout is how long an unpinned resource's watch runs
	// without reads before it stops; zero never stops one.
	CacheIdleTimeout time.Duration
	// CacheWarmupTimeout bounds how long the agent waits, after start-up,
	// for the pinned resources' first lists before it intercepts: an agent
	// that cannot hold them (a memory limit too low for the cluster) dies
	// while it lists, before it has taken the node's traffic. Once it has
	// passed, the agent intercepts and forwards what is not synced yet.
	CacheWarmupTimeout time.Duration
	// CacheHistoryEvents and CacheHistoryBytes bound each cached
	// resource's event window, from which watches are served.
	CacheHistoryEvents, CacheHistoryBytes int
	// DegradedDecisionTTL is how long after kube-apiserver allowed a
	// caller a read the agent may still answer it from the cache in
	// degraded mode (every kube-apiserver unreachable, through the agent
	// and kube-proxy's path alike). Zero disables degraded mode: the
	// agent then steps aside whenever no upstream is healthy.
	DegradedDecisionTTL time.Duration

	// Audit configures the audit log of the requests the agent answers
	// itself (kube-apiserver's audit options); nil or without a policy
	// file, nothing is recorded.
	Audit *audit.Options

	// RewriteConfigFile is the RewriteConfiguration of the rewriting
	// mode (package agent/rewriting); empty: no caller is rewritten.
	RewriteConfigFile string
}

// Default values for Config fields.
const (
	DefaultListenAddress        = interception.DefaultListenAddress
	DefaultListenAddressIPv6    = interception.DefaultListenAddressIPv6
	DefaultListenLink           = interception.DefaultListenLink
	DefaultServiceVIP           = "10.96.0.1"
	DefaultServicePort          = 443
	DefaultUpstreamCAFile       = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	DefaultUpstreamServerName   = upstream.DefaultServerName
	DefaultUpstreamCheckTimeout = 10 * time.Second
	DefaultTokenFile            = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultSocketMark           = 0x1000
	DefaultChain                = interception.DefaultChain
	DefaultPodCAFile            = DefaultUpstreamCAFile
	DefaultClusterDomain        = "cluster.local"
	// DefaultCertificateLifetime is short because every agent's
	// certificate names the kubernetes Service (its DNS names and VIP) and
	// chains to the CA every pod trusts: a key taken from one node passes
	// for kube-apiserver to any pod whose VIP traffic an attacker can
	// redirect (CVE-2020-8554), and Kubernetes cannot revoke a certificate,
	// so its lifetime bounds how long the attack outlives the node's
	// eviction (a deleted pod's bound token can request no successor).
	// 6h keeps renewals cheap (every 4.2-5.4h, at 70-90%: about one CSR
	// per node per 5h) and leaves the approver at least 36 minutes (the
	// last 10%) to approve a renewal before the old certificate expires,
	// after which the node fails open to kube-proxy. kube-controller-
	// manager's signer honours expirationSeconds from 10m up to its
	// --cluster-signing-duration (default 1 year), and backdates NotBefore
	// by 5m.
	DefaultCertificateLifetime = 6 * time.Hour
	// DefaultAgentServiceAccount is the agents' ServiceAccount in the
	// shipped manifests, NAMESPACE/NAME.
	DefaultAgentServiceAccount = "kube-apicache/kube-apicache"
	DefaultIPTablesBackend     = "auto"
	DefaultLivenessSet         = interception.DefaultLivenessSet
	DefaultNFTablesTable       = interception.DefaultNFTablesTable
	DefaultNFTablesPriority    = interception.DefaultNFTablesPriority
	// DefaultLivenessTimeout: see interception.DefaultLivenessTimeout.
	DefaultLivenessTimeout      = interception.DefaultLivenessTimeout
	DefaultUpstreamHealthPeriod = upstream.DefaultHealthPeriod
	DefaultSyncPeriod           = 10 * time.Second
	// A local handshake takes microseconds: a flow DNATed to the agent
	// without a reply over two scans 250ms apart was dropped, found before
	// TCP's first SYN retry (after one second).
	DefaultPodPathCheckInterval = 250 * time.Millisecond
	DefaultBypassDuration       = 10 * time.Minute
	DefaultMetricsBindAddress   = "127.0.0.1:10445"
	DefaultShutdownGracePeriod  = 30 * time.Second
	// DefaultExternalDrainDelay covers a readiness probe every second
	// that fails once, the kubelet's status update and the redirect
	// owner's reaction to the pod's Ready condition (Cilium batches its
	// Local Redirect Policy work by 100ms), with room to spare.
	DefaultExternalDrainDelay = 5 * time.Second
	DefaultCacheWarmupTimeout = 30 * time.Second
	// DefaultDegradedDecisionTTL bounds how long a revoked RoleBinding
	// (or a deleted pod's token) may still be honoured for cached reads
	// during an outage of every kube-apiserver.
	DefaultDegradedDecisionTTL = 5 * time.Minute
)

// builtinChains are the nat table's own chains.
var builtinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "OUTPUT": true, "POSTROUTING": true, "FORWARD": true}

// Validate reports the first problem with c, as a one-line error.
func (c *Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("--node-name is required")
	case !c.ListenAddress.IsValid() || c.ListenAddress.Port() == 0:
		return errors.New("--listen-address must be an IP:port")
	case c.ListenAddress.Addr().IsUnspecified():
		return errors.New("--listen-address must be a specific IP, not a wildcard")
	case len(c.ServiceVIPs) == 0:
		return errors.New("--service-vip is required")
	case c.ServicePort == 0:
		return errors.New("--service-port must be 1-65535")
	case len(c.Upstreams) == 0:
		return errors.New("--upstream is required where $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT are not set")
	case (c.TLSCertFile == "") != (c.TLSKeyFile == ""):
		return errors.New("--tls-cert-file and --tls-private-key-file go together (neither: the certificate is requested through the CSR API)")
	case c.ClusterDomain != "" && len(validation.IsDNS1123Subdomain(c.ClusterDomain)) > 0:
		return fmt.Errorf("--cluster-domain %q must be a DNS subdomain", c.ClusterDomain)
	case c.CertificateLifetime != 0 && c.CertificateLifetime < identity.MinLifetime:
		return fmt.Errorf("--certificate-lifetime must be at least %s, the signers' floor", identity.MinLifetime)
	case c.Chain == "" || len(c.Chain) > 28:
		return errors.New("--iptables-chain must be 1-28 characters")
	case builtinChains[c.Chain] || (strings.HasPrefix(c.Chain, "KUBE-") && !strings.HasPrefix(c.Chain, "KUBE-APICACHE")):
		return fmt.Errorf("--iptables-chain %s belongs to the kernel or kube-proxy; the agent flushes its own chain", c.Chain)
	case c.ListenLink == "" || len(c.ListenLink) > 15 || strings.ContainsAny(c.ListenLink, "/ "):
		return errors.New("--listen-link must be a valid link name of 1-15 characters")
	case !c.ListenAddress.Addr().Is4():
		return fmt.Errorf("--listen-address %s must be IPv4 (IPv6: --listen-address-ipv6)", c.ListenAddress.Addr())
	case c.ListenAddress.Addr().IsLoopback():
		return errors.New("--listen-address must not be a loopback address: the kernel drops pod traffic DNATed to loopback")
	case c.HasFamily(netrules.IPv6) && !c.ListenAddressIPv6.IsValid():
		return errors.New("--listen-address-ipv6 is required when a --service-vip is IPv6")
	}
	if c.SignerName != "" {
		if err := identity.ValidateSignerName(c.SignerName); err != nil {
			return fmt.Errorf("--signer-name: %w", err)
		}
	}
	if err := c.ValidateDetectLocal(); err != nil {
		return err
	}
	switch {
	case c.PodPathCheckInterval < 0 || (c.PodPathCheckInterval > 0 && c.PodPathCheckInterval < 100*time.Millisecond):
		return errors.New("--pod-path-check-interval must be 0 (off) or at least 100ms")
	case c.PodPathCheckInterval > 0 && (c.BypassDuration < time.Second || c.BypassDuration > 24*time.Hour):
		return errors.New("--bypass-duration must be between 1s and 24h")
	}
	if err := c.validateListenIPv6(); err != nil {
		return err
	}
	if c.InterceptionConfigMap != "" {
		ns, name, ok := strings.Cut(c.InterceptionConfigMap, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return fmt.Errorf("--interception-configmap %q must be NAMESPACE/NAME", c.InterceptionConfigMap)
		}
	}
	if err := c.validateMetricsBindAddress(); err != nil {
		return err
	}
	switch {
	case c.LivenessSet == "" || len(c.LivenessSet) > 30 || strings.ContainsAny(c.LivenessSet, " \t\"'"):
		return errors.New("--fail-open-set must be 1-30 characters without spaces or quotes")
	case c.LivenessTimeout < time.Second || c.LivenessTimeout > time.Hour:
		return errors.New("--fail-open-timeout must be between 1s and 1h: the kernel counts whole seconds")
	case c.Dataplane != "" && c.Dataplane != interception.DataplaneAuto && c.Dataplane != interception.DataplaneIPTables && c.Dataplane != interception.DataplaneNFTables && c.Dataplane != interception.DataplaneExternal:
		return fmt.Errorf("--dataplane %q must be auto, iptables, nftables or external", c.Dataplane)
	case c.ExternalDrainDelay < 0 || c.ExternalDrainDelay > 5*time.Minute:
		return errors.New("--external-drain-delay must be between 0 and 5m")
	case c.NFTablesPriority != 0 && (c.NFTablesPriority < -199 || c.NFTablesPriority >= netrules.NFTPriorityDstNAT):
		return fmt.Errorf("--nftables-priority %d must be in [-199, -101]: after conntrack (-200), and strictly before dstnat (-100), where kube-proxy's nat chains run (at the same priority the order is undefined)", c.NFTablesPriority)
	case c.NFTablesTable != "" && !validNFTName(c.NFTablesTable):
		return fmt.Errorf("--nftables-table %q must be 1-64 letters, digits, '-' or '_', starting with a letter", c.NFTablesTable)
	case c.IPTablesBackend != "auto" && c.IPTablesBackend != "legacy" && c.IPTablesBackend != "nft":
		return fmt.Errorf("--iptables-backend %q must be auto, legacy or nft", c.IPTablesBackend)
	case c.UpstreamHealthPeriod <= 0:
		return errors.New("--upstream-health-period must be positive")
	case c.SyncPeriod <= 0:
		return errors.New("--sync-period must be positive")
	case c.Profiling && c.MetricsBindAddress == "":
		return errors.New("--profiling needs --metrics-bind-address, which serves it")
	case c.Profiling && !isLoopbackHostPort(c.MetricsBindAddress):
		return fmt.Errorf("--profiling needs a loopback --metrics-bind-address (such as %s), not %q: profiles expose the process's memory", DefaultMetricsBindAddress, c.MetricsBindAddress)
	case (c.MetricsTLSCertFile == "") != (c.MetricsTLSKeyFile == ""):
		return errors.New("--metrics-tls-cert-file and --metrics-tls-private-key-file go together (neither: a self-signed certificate)")
	case c.MetricsTLSCertFile != "" && c.MetricsBindAddress == "":
		return errors.New("--metrics-tls-cert-file needs --metrics-bind-address, which serves it")
	case c.UpstreamCheckTimeout <= 0:
		return errors.New("--upstream-check-timeout must be positive")
	case c.ShutdownGracePeriod < 0:
		return errors.New("--shutdown-grace-period must not be negative")
	case len(c.CacheResources) > 0 && (c.CacheWaitTimeout <= 0 || c.CacheWaitTimeout > time.Minute):
		return errors.New("--cache-wait-timeout must be positive and at most 1m")
	case c.CacheIdleTimeout < 0 || (c.CacheIdleTimeout > 0 && c.CacheIdleTimeout < time.Second):
		return errors.New("--cache-idle-timeout must be 0 (never stop) or at least 1s")
	case c.CacheHistoryEvents < 0 || c.CacheHistoryBytes < 0:
		return errors.New("--cache-history-events and --cache-history-bytes must not be negative")
	case c.CacheWarmupTimeout < 0:
		return errors.New("--cache-warmup-timeout must not be negative")
	case c.DegradedDecisionTTL < 0 || c.DegradedDecisionTTL > time.Hour:
		return errors.New("--degraded-decision-ttl must be 0 (no degraded mode) or positive and at most 1h")
	}
	if err := cache.CheckPinned(c.CachePinnedResources, c.CacheResources); err != nil {
		return err
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	for i, vip := range c.ServiceVIPs {
		for _, other := range c.ServiceVIPs[:i] {
			if other.Unmap() == vip.Unmap() {
				return fmt.Errorf("--service-vip %s is given twice", vip)
			}
		}
		for _, ap := range []netip.AddrPort{c.ListenAddress, c.ListenAddressIPv6} {
			if ap.IsValid() && vip.Unmap() == ap.Addr() {
				return fmt.Errorf("--service-vip %s is a listen address of the agent", vip)
			}
		}
	}
	for _, u := range c.Upstreams {
		if u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
			return fmt.Errorf("--upstream %q must be an https://host:port URL", u.Redacted())
		}
		if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
			ip = ip.Unmap()
			for _, vip := range c.ServiceVIPs {
				// Through the VIP, only marked sockets pass the agent's own
				// redirect and reach kube-proxy's rules.
				if ip == vip && c.SocketMark == 0 {
					return fmt.Errorf("--upstream %s is the Service VIP, which only works with --upstream-socket-mark: unmarked, the agent's connections would be redirected to itself", u.Host)
				}
			}
			if ip == c.ListenAddress.Addr() || (c.ListenAddressIPv6.IsValid() && ip == c.ListenAddressIPv6.Addr()) {
				return fmt.Errorf("--upstream %s is the agent's own listen address", u.Host)
			}
		}
	}
	return nil
}

// validateMetricsBindAddress checks that a set MetricsBindAddress is
// host:port.
func (c *Config) validateMetricsBindAddress() error {
	if c.MetricsBindAddress == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(c.MetricsBindAddress)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address %q must be host:port ([IP]:port for IPv6): %w", c.MetricsBindAddress, err)
	}
	if host == "" && strings.HasPrefix(c.MetricsBindAddress, "[") {
		// "[$(HOST_IP)]:port" with HOST_IP unset: listening on every
		// address (the listen address among them) was not asked for.
		return fmt.Errorf("--metrics-bind-address %q has empty brackets for its host (an unset variable?); give an IP, or leave the host out to listen on every address", c.MetricsBindAddress)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("--metrics-bind-address %q must have a port in 1-65535", c.MetricsBindAddress)
	}
	return nil
}

// isLoopbackHostPort says whether hostport's host is a loopback IP or
// localhost.
func isLoopbackHostPort(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// validateListenIPv6 checks the IPv6 listen address, when one is set.
func (c *Config) validateListenIPv6() error {
	ap := c.ListenAddressIPv6
	ip := ap.Addr()
	switch {
	case !ap.IsValid():
		return nil
	case ap.Port() == 0:
		return errors.New("--listen-address-ipv6 must be an [IP]:port")
	case !ip.Is6() || ip.Is4In6():
		return fmt.Errorf("--listen-address-ipv6 %s must be IPv6 (IPv4: --listen-address)", ip)
	case ip.Zone() != "":
		return fmt.Errorf("--listen-address-ipv6 %s must not have a zone", ip)
	case ip.IsUnspecified():
		return errors.New("--listen-address-ipv6 must be a specific IP, not a wildcard")
	case ip.IsLoopback():
		return errors.New("--listen-address-ipv6 must not be loopback: the kernel drops pod traffic DNATed to ::1")
	case ip.IsLinkLocalUnicast():
		return errors.New("--listen-address-ipv6 must not be link-local: an fe80:: address belongs to one link and cannot take DNATed pod traffic; use a unique local address (fd00::/8)")
	case ip.IsMulticast():
		return errors.New("--listen-address-ipv6 must be a unicast address")
	}
	return nil
}

// validNFTName reports whether s is a table name nft accepts unquoted.
func validNFTName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i, r := range s {
		letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '-' || r == '_')) {
			return false
		}
	}
	return true
}
