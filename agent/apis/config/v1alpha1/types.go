package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// AgentConfiguration configures the agent and the approver. Every field is
// optional: an unset field leaves its flag's default (or the command line's
// value). Fields are pointers or slices so that "unset" and "zero" differ.
type AgentConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// Cluster holds the facts about the cluster that the agents and the
	// approver must agree on.
	Cluster ClusterConfiguration `json:"cluster,omitzero"`
	// Interception holds what is redirected to the agent, and the kill
	// switch.
	Interception InterceptionConfiguration `json:"interception,omitzero"`
	// Dataplane holds how the redirect is written into the kernel.
	Dataplane DataplaneConfiguration `json:"dataplane,omitzero"`
	// Upstream holds how the agent reaches kube-apiserver.
	Upstream UpstreamConfiguration `json:"upstream,omitzero"`
	// Certificate holds the agent's serving certificate.
	Certificate CertificateConfiguration `json:"certificate,omitzero"`
	// Cache holds what the node cache answers.
	Cache CacheConfiguration `json:"cache,omitzero"`
	// Metrics holds the metrics and health endpoint.
	Metrics MetricsConfiguration `json:"metrics,omitzero"`
	// Rewriting holds the rewriting mode's profiles.
	Rewriting RewritingConfiguration `json:"rewriting,omitzero"`
}

// ClusterConfiguration is shared by the agents and the approver.
type ClusterConfiguration struct {
	ServiceVIPs       []string `json:"serviceVIPs,omitempty" flag:"service-vip"`
	ServicePort       *int32   `json:"servicePort,omitempty" flag:"service-port"`
	ListenAddress     *string  `json:"listenAddress,omitempty" flag:"listen-address"`
	ListenAddressIPv6 *string  `json:"listenAddressIPv6,omitempty" flag:"listen-address-ipv6"`
	ClusterDomain     *string  `json:"clusterDomain,omitempty" flag:"cluster-domain"`
	SignerName        *string  `json:"signerName,omitempty" flag:"signer-name"`
}

// InterceptionConfiguration is what the agent redirects, and when it hands
// the Service back to kube-proxy.
type InterceptionConfiguration struct {
	Enabled                *bool            `json:"enabled,omitempty" flag:"interception"`
	ConfigMap              *string          `json:"configMap,omitempty" flag:"interception-configmap"`
	FailOpenTimeout        *metav1.Duration `json:"failOpenTimeout,omitempty" flag:"fail-open-timeout"`
	DetectLocalMode        *string          `json:"detectLocalMode,omitempty" flag:"detect-local-mode"`
	ClusterCIDRs           []string         `json:"clusterCIDRs,omitempty" flag:"cluster-cidr"`
	PodBridgeInterface     *string          `json:"podBridgeInterface,omitempty" flag:"pod-bridge-interface"`
	PodInterfaceNamePrefix *string          `json:"podInterfaceNamePrefix,omitempty" flag:"pod-interface-name-prefix"`
	PodPathCheckInterval   *metav1.Duration `json:"podPathCheckInterval,omitempty" flag:"pod-path-check-interval"`
	BypassDuration         *metav1.Duration `json:"bypassDuration,omitempty" flag:"bypass-duration"`
	SyncPeriod             *metav1.Duration `json:"syncPeriod,omitempty" flag:"sync-period"`
	ShutdownGracePeriod    *metav1.Duration `json:"shutdownGracePeriod,omitempty" flag:"shutdown-grace-period"`
}

// DataplaneConfiguration is where the redirect lives in the kernel.
type DataplaneConfiguration struct {
	Mode *string `json:"mode,omitempty" flag:"dataplane"`
	// ExternalDrainDelay is how long an agent of the external mode keeps
	// serving after it turned not ready at shutdown.
	ExternalDrainDelay *metav1.Duration `json:"externalDrainDelay,omitempty" flag:"external-drain-delay"`
	NFTablesTable      *string          `json:"nftablesTable,omitempty" flag:"nftables-table"`
	NFTablesPriority   *int32           `json:"nftablesPriority,omitempty" flag:"nftables-priority"`
	IPTablesBackend    *string          `json:"iptablesBackend,omitempty" flag:"iptables-backend"`
	IPTablesChain      *string          `json:"iptablesChain,omitempty" flag:"iptables-chain"`
	FailOpenSet        *string          `json:"failOpenSet,omitempty" flag:"fail-open-set"`
	ListenLink         *string          `json:"listenLink,omitempty" flag:"listen-link"`
	UpstreamSocketMark *uint32          `json:"upstreamSocketMark,omitempty" flag:"upstream-socket-mark"`
}

// UpstreamConfiguration is how kube-apiserver is reached.
type UpstreamConfiguration struct {
	Endpoints    []string         `json:"endpoints,omitempty" flag:"upstream"`
	CAFile       *string          `json:"caFile,omitempty" flag:"upstream-ca-file"`
	ServerName   *string          `json:"serverName,omitempty" flag:"upstream-server-name"`
	CheckTimeout *metav1.Duration `json:"checkTimeout,omitempty" flag:"upstream-check-timeout"`
	HealthPeriod *metav1.Duration `json:"healthPeriod,omitempty" flag:"upstream-health-period"`
	TokenFile    *string          `json:"tokenFile,omitempty" flag:"token-file"`
}

// CertificateConfiguration is the agent's serving certificate.
type CertificateConfiguration struct {
	CertFile  *string          `json:"certFile,omitempty" flag:"tls-cert-file"`
	KeyFile   *string          `json:"keyFile,omitempty" flag:"tls-private-key-file"`
	PodCAFile *string          `json:"podCAFile,omitempty" flag:"pod-ca-file"`
	Lifetime  *metav1.Duration `json:"lifetime,omitempty" flag:"certificate-lifetime"`
	StateDir  *string          `json:"stateDir,omitempty" flag:"certificate-state-dir"`
}

// CacheConfiguration is what the node cache holds and answers.
type CacheConfiguration struct {
	Resources       *string          `json:"resources,omitempty" flag:"cache-resources"`
	PinnedResources *string          `json:"pinnedResources,omitempty" flag:"cache-pinned-resources"`
	WaitTimeout     *metav1.Duration `json:"waitTimeout,omitempty" flag:"cache-wait-timeout"`
	ConsistentReads *string          `json:"consistentReads,omitempty" flag:"cache-consistent-reads"`
	ProbeMaxObjects *int32           `json:"probeMaxObjects,omitempty" flag:"cache-probe-max-objects"`
	// ForwardConsistentReads is deprecated: consistentReads: forward.
	ForwardConsistentReads *bool            `json:"forwardConsistentReads,omitempty" flag:"cache-forward-consistent-reads"`
	IdleTimeout            *metav1.Duration `json:"idleTimeout,omitempty" flag:"cache-idle-timeout"`
	WarmupTimeout          *metav1.Duration `json:"warmupTimeout,omitempty" flag:"cache-warmup-timeout"`
	HistoryEvents          *int32           `json:"historyEvents,omitempty" flag:"cache-history-events"`
	HistoryBytes           *int64           `json:"historyBytes,omitempty" flag:"cache-history-bytes"`
	AsNode                 *bool            `json:"asNode,omitempty" flag:"cache-as-node"`
	DegradedDecisionTTL    *metav1.Duration `json:"degradedDecisionTTL,omitempty" flag:"degraded-decision-ttl"`
}

// MetricsConfiguration is the endpoint that serves metrics and health.
type MetricsConfiguration struct {
	BindAddress *string `json:"bindAddress,omitempty" flag:"metrics-bind-address"`
	CertFile    *string `json:"certFile,omitempty" flag:"metrics-tls-cert-file"`
	KeyFile     *string `json:"keyFile,omitempty" flag:"metrics-tls-private-key-file"`
	Profiling   *bool   `json:"profiling,omitempty" flag:"profiling"`
}

// RewritingConfiguration is the rewriting mode: which callers see the
// API under other names.
type RewritingConfiguration struct {
	ConfigFile *string `json:"configFile,omitempty" flag:"rewrite-config"`
}

// DeepCopyObject implements runtime.Object. The configuration is read once
// per start (and per kill-switch poll), so a JSON round trip is cheap
// enough and cannot miss a field.
func (c *AgentConfiguration) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	out := &AgentConfiguration{}
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}
