package cache

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-apicache/kube-apicache/cache/access"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// DefaultResources is the default --cache-resources: this node's pods and
// Node, and the cluster's services, endpointslices and namespaces.
const DefaultResources = "pods,nodes,services,endpointslices.discovery.k8s.io,namespaces"

// DefaultMaxInFlightPerSource is the default Config.MaxInFlightPerSource:
// a quarter of kube-apiserver's default --max-requests-inflight, so that
// no single pod can take the cache's whole in-flight budget.
const DefaultMaxInFlightPerSource = 100

// DefaultIdleTimeout is the default Config.IdleTimeout: how long an
// informer started on demand runs without a read before it stops.
const DefaultIdleTimeout = 10 * time.Minute

// DefaultWaitTimeout bounds how long a read waits for the cache to reach the
// resourceVersion it needs before it is forwarded instead.
const DefaultWaitTimeout = time.Second

// Default bounds of a resource's event window: the Store's own.
const (
	DefaultHistoryEvents = store.DefaultHistoryEvents
	DefaultHistoryBytes  = store.DefaultHistoryBytes
)

// ConsistentReads says how reads with resourceVersion unset are answered.
type ConsistentReads string

const (
	// ConsistentProbe answers a consistent read from the cache only once a
	// probe of kube-apiserver has shown that the cache holds at least the
	// current state (probe.go): linearizable, as kube-apiserver's own.
	ConsistentProbe ConsistentReads = "probe"
	// ConsistentLocalWrites answers a consistent read once the cache has
	// seen every write this agent relayed (the read-your-writes barrier),
	// without asking kube-apiserver: a write made elsewhere a moment
	// earlier may not be seen yet.
	ConsistentLocalWrites ConsistentReads = "local-writes"
	// ConsistentForward forwards every consistent read.
	ConsistentForward ConsistentReads = "forward"
)

// ConsistentReadModes are the valid ConsistentReads values.
var ConsistentReadModes = []string{string(ConsistentProbe), string(ConsistentLocalWrites), string(ConsistentForward)}

// DefaultProbeMaxObjects is the default Config.ProbeMaxObjects.
const DefaultProbeMaxObjects = 2000

// ProbeBudget bounds the consistent-read probes the agent sends under its
// own identity (probebudget.go): the objects they list beyond what their
// reads would cost forwarded, and their rounds. Zero values mean the
// defaults; a negative rate means no bound of that kind.
type ProbeBudget struct {
	// ObjectsPerSecond and Burst bound the probes of all resources and
	// all sources together.
	ObjectsPerSecond float64
	Burst            int
	// ObjectsPerSecondPerSource and BurstPerSource bound the probes that
	// one source's reads start (a client IP: one pod, or every
	// host-network pod of the node together).
	ObjectsPerSecondPerSource float64
	BurstPerSource            int
	// RoundsPerSecond and RoundsPerSecondPerSource bound the probe rounds
	// of the node and of one source, whatever they cost; the bursts are
	// two seconds' worth.
	RoundsPerSecond          float64
	RoundsPerSecondPerSource float64
}

// Defaults of ProbeBudget. Objects beyond the reads' own: per node 500 a
// second, per source a fifth of that; a source's burst holds one probe of
// the largest scope probed (DefaultProbeMaxObjects), the node's two.
// Rounds: 100 a second per source (a controller's read-after-write loop
// fits), 400 per node. At 5,000 nodes, every node at its budget, the
// agents' flow carries at most 2 million probes a second, each costing
// no more than a read its caller would otherwise have sent, and 2.5
// million objects beyond those reads.
const (
	DefaultProbeObjectsPerSecond          = 500
	DefaultProbeBurst                     = 2 * DefaultProbeMaxObjects
	DefaultProbeObjectsPerSecondPerSource = 100
	DefaultProbeBurstPerSource            = DefaultProbeMaxObjects
	DefaultProbeRoundsPerSecond           = 400
	DefaultProbeRoundsPerSecondPerSource  = 100
)

func (b *ProbeBudget) complete() {
	if b.ObjectsPerSecond == 0 {
		b.ObjectsPerSecond = DefaultProbeObjectsPerSecond
	}
	if b.Burst <= 0 {
		b.Burst = DefaultProbeBurst
	}
	if b.ObjectsPerSecondPerSource == 0 {
		b.ObjectsPerSecondPerSource = DefaultProbeObjectsPerSecondPerSource
	}
	if b.BurstPerSource <= 0 {
		b.BurstPerSource = DefaultProbeBurstPerSource
	}
	if b.RoundsPerSecond == 0 {
		b.RoundsPerSecond = DefaultProbeRoundsPerSecond
	}
	if b.RoundsPerSecondPerSource == 0 {
		b.RoundsPerSecondPerSource = DefaultProbeRoundsPerSecondPerSource
	}
}

// ResourceSpec names one resource to cache.
type ResourceSpec struct {
	Group    string
	Resource string
	// Version is empty for the group's preferred version.
	Version string
}

// GroupResource returns the spec's group and resource.
func (s ResourceSpec) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: s.Group, Resource: s.Resource}
}

// String returns the spec in the --cache-resources syntax.
func (s ResourceSpec) String() string {
	out := s.Resource
	if s.Group != "" {
		out += "." + s.Group
	}
	if s.Version != "" {
		out += "/" + s.Version
	}
	return out
}

// ParseResources parses a comma-separated list of RESOURCE[.GROUP][/VERSION]
// entries, for example "pods,endpointslices.discovery.k8s.io,widgets.example.com/v1".
// pods and nodes are always scoped to this node.
func ParseResources(s string) ([]ResourceSpec, error) {
	return parseResources("--cache-resources", s)
}

// ParsePinned parses --cache-pinned-resources, in the syntax of
// ParseResources, and checks that every entry is one of resources.
func ParsePinned(s string, resources []ResourceSpec) ([]ResourceSpec, error) {
	pinned, err := parseResources("--cache-pinned-resources", s)
	if err != nil {
		return nil, err
	}
	return pinned, CheckPinned(pinned, resources)
}

// CheckPinned returns an error unless every pinned resource is one of
// resources (with the same version, if the pinned entry names one).
func CheckPinned(pinned, resources []ResourceSpec) error {
	for _, p := range pinned {
		found := false
		for _, r := range resources {
			if r.GroupResource() == p.GroupResource() && (p.Version == "" || p.Version == r.Version) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("--cache-pinned-resources lists %s, which --cache-resources does not", p)
		}
	}
	return nil
}

func parseResources(flag, s string) ([]ResourceSpec, error) {
	var out []ResourceSpec
	seen := map[schema.GroupResource]bool{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		var spec ResourceSpec
		gr, version, hasVersion := strings.Cut(entry, "/")
		if hasVersion {
			if errs := validation.IsDNS1035Label(version); len(errs) > 0 {
				return nil, fmt.Errorf("%s entry %q: version %q is not valid", flag, entry, version)
			}
			spec.Version = version
		}
		spec.Resource, spec.Group, _ = strings.Cut(gr, ".")
		if errs := validation.IsDNS1123Label(spec.Resource); len(errs) > 0 || strings.ToLower(spec.Resource) != spec.Resource {
			return nil, fmt.Errorf("%s entry %q: resource %q must be a lower-case plural resource name", flag, entry, spec.Resource)
		}
		if spec.Group != "" {
			if errs := validation.IsDNS1123Subdomain(spec.Group); len(errs) > 0 {
				return nil, fmt.Errorf("%s entry %q: group %q is not valid", flag, entry, spec.Group)
			}
		}
		if spec.Group == "" && (spec.Resource == "pods" || spec.Resource == "nodes") && spec.Version != "" && spec.Version != "v1" {
			return nil, fmt.Errorf("%s entry %q: core resources are served at v1 only", flag, entry)
		}
		if seen[spec.GroupResource()] {
			return nil, fmt.Errorf("%s lists %s twice", flag, spec.GroupResource())
		}
		seen[spec.GroupResource()] = true
		out = append(out, spec)
	}
	return out, nil
}

// Config configures a Cache.
type Config struct {
	// NodeName scopes pods (spec.nodeName) and nodes (metadata.name).
	NodeName string
	// Resources are the resources to cache.
	Resources []ResourceSpec
	// RESTConfig is the agent's own client configuration, used for the
	// watches and discovery; never for client requests.
	RESTConfig *rest.Config
	// AsNode runs the watches of this node's pods and Node as the node
	// (Impersonate-User: system:node:<NodeName>, KEP-5284 constrained
	// impersonation), so the Node authorizer limits them, not the agent's
	// RBAC; every other watch runs as RESTConfig's identity (asnode.go).
	AsNode bool
	// Reviewer decides who may read from the cache. Nil forwards every
	// request.
	Reviewer access.Reviewer
	// WaitTimeout bounds waits for the cache to catch up with a requested
	// or written resourceVersion.
	WaitTimeout time.Duration
	// ConsistentReads says how reads with resourceVersion unset are
	// answered; empty means ConsistentProbe.
	ConsistentReads ConsistentReads
	// ProbeMaxObjects: with ConsistentProbe, a consistent read of a
	// resource whose cached scope holds more objects than this is
	// forwarded, since the probe (the metadata of every object in the
	// scope) would cost kube-apiserver about as much as the read. Zero
	// means DefaultProbeMaxObjects; negative means no bound.
	ProbeMaxObjects int
	// ProbeBudget: with ConsistentProbe, a consistent read that would
	// start a probe its source's share or the node's budget cannot pay
	// for is forwarded, so that its caller pays for it in its own
	// priority-and-fairness flow. A probe costing more than a burst is
	// never sent: keep the bursts at least ProbeMaxObjects.
	ProbeBudget ProbeBudget
	// MaxInFlightPerSource bounds the requests from one source (client
	// IP) the cache is deciding on at once (reviews and resourceVersion
	// waits); past it the source's requests are forwarded. Zero means
	// DefaultMaxInFlightPerSource; negative means no bound.
	MaxInFlightPerSource int
	// OnDemand starts a resource's informer only when a read it would
	// answer comes from a caller the Reviewer allows (that read and the
	// next ones are forwarded until it has synced), and stops it, dropping
	// its Store, after IdleTimeout without such reads. Pinned resources
	// run from Run until it ends, as every resource does without OnDemand
	// (ondemand.go).
	OnDemand bool
	// Pinned are resources of Resources whose informers always run.
	Pinned []ResourceSpec
	// IdleTimeout is how long, with OnDemand, an informer runs without a
	// read it served or would have served before it stops; zero never
	// stops an informer once started.
	IdleTimeout time.Duration
	// HistoryEvents and HistoryBytes bound each resource's event window,
	// which watches from a resourceVersion are served from (store/history.go):
	// a watch from before it is forwarded to kube-apiserver. Zero means
	// DefaultHistoryEvents and DefaultHistoryBytes.
	HistoryEvents, HistoryBytes int
	// Registerer receives the cache's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}
