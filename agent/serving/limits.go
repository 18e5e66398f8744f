package serving

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/fairshare"
	apicache "github.com/kube-apicache/kube-apicache/cache"
	"github.com/kube-apicache/kube-apicache/cache/access"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
)

// Limits bound what clients can make the agent hold: connections, those
// that never finish their headers or send no request, oversized headers,
// HTTP/2 streams and buffers, and requests in flight. The defaults are kube-apiserver's own secure-serving
// and max-in-flight defaults, so a pod meets the same front door through the
// agent as without it.
//
// A zero duration or size means the default; a zero in-flight limit means no
// limit, as in kube-apiserver.
type Limits struct {
	// ReadHeaderTimeout closes a connection whose request headers are not
	// complete within it (slowloris).
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle that long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers; larger requests
	// get 431 Request Header Fields Too Large.
	MaxHeaderBytes int

	// Client connections are shared among sources (client IPs) as package
	// fairshare says: every source may always have
	// GuaranteedConnectionsPerSource open; above that it draws on a pool of
	// MaxConnections shared by all sources, up to MaxConnectionsPerSource
	// in all. A connection past either bound is closed as soon as it is
	// accepted. Zero means the default; negative means no bound (no
	// guaranteed share).
	MaxConnections                 int
	MaxConnectionsPerSource        int
	GuaranteedConnectionsPerSource int
	// FirstRequestTimeout closes a connection that has not sent the
	// headers of a first request (TLS handshake included) within it from
	// its accept. Zero means the default.
	FirstRequestTimeout time.Duration

	// HTTP2MaxStreams is the number of concurrent streams one HTTP/2
	// connection may have open.
	HTTP2MaxStreams int
	// HTTP2MaxFrameSize is the largest HTTP/2 frame the agent reads.
	HTTP2MaxFrameSize int
	// HTTP2MaxStreamBuffer is the flow-control window (the request body
	// the agent buffers) per stream; the per-connection window is this
	// times HTTP2MaxStreams.
	HTTP2MaxStreamBuffer int
	// HTTP2MaxUpstreamStreamBuffer is the flow-control window per stream
	// towards kube-apiserver: how much of an answer the agent reads ahead
	// of its client. An answer the client does not read holds that much
	// until the request timeout; a larger window is faster on a path of
	// long round trips (a stream moves at most a window per round trip).
	HTTP2MaxUpstreamStreamBuffer int

	// MaxRequestsInFlight bounds the non-mutating requests (get, list)
	// being served at once; MaxMutatingRequestsInFlight the others. Each
	// is shared among sources (client IPs) as package fairshare says:
	// every source may always have GuaranteedRequestsInFlightPerSource of
	// either kind in flight; above that it draws on the bound, shared by
	// all sources, up to MaxRequestsInFlightPerSource (or
	// MaxMutatingRequestsInFlightPerSource) in all. Past either the
	// request gets 429 with Retry-After. Long-running requests (watches,
	// exec, attach, port-forward, proxy, logs) are not counted. A zero
	// bound of a kind means no bound of that kind at all; a zero per-source
	// or guaranteed share the default, a negative one none.
	MaxRequestsInFlight                  int
	MaxMutatingRequestsInFlight          int
	MaxRequestsInFlightPerSource         int
	MaxMutatingRequestsInFlightPerSource int
	GuaranteedRequestsInFlightPerSource  int
	// RequestTimeout is how long the answer to a request that is not
	// long-running may take, from its arrival to its last byte written:
	// kube-apiserver's --request-timeout. A client that does not read its
	// answer has it ended then (its HTTP/2 stream reset, its HTTP/1.1
	// connection closed), which frees the request's in-flight slot. Zero
	// means the default.
	RequestTimeout time.Duration

	// Long-running requests (watches, exec, attach, port-forward, proxy,
	// logs) are shared among sources (client IPs) as package fairshare
	// says: every source may always have
	// GuaranteedLongRunningRequestsPerSource open; above that it draws on
	// a pool of MaxLongRunningRequests shared by all sources, up to
	// MaxLongRunningRequestsPerSource in all. A request past either bound
	// gets 429 with Retry-After. Zero means the default; negative means no
	// bound (no guaranteed share).
	MaxLongRunningRequests                 int
	MaxLongRunningRequestsPerSource        int
	GuaranteedLongRunningRequestsPerSource int
	// MaxCacheRequestsPerSource bounds the requests of one source the
	// cache reviews or waits for a resourceVersion for at once; past it
	// the source's reads are forwarded. Zero means the default; negative
	// means no bound.
	MaxCacheRequestsPerSource int
	// RequestBodyTimeout is how long the body of a request that is not
	// long-running may take to arrive; a client that sends it slower gets
	// its request failed. Zero means the default.
	RequestBodyTimeout time.Duration
	// MaxBufferedBodyBytes bounds the request bodies held in memory at
	// once (to resend a write to another endpoint); past it bodies are
	// streamed. Zero means the default.
	MaxBufferedBodyBytes int

	// ReviewQPS and ReviewBurst bound the reviews the agent sends for
	// callers already authenticated, beyond each source's reserve;
	// ReviewQPSPerSource
	// and ReviewBurstPerSource those it sends for one source. A caller
	// past either share is forwarded, not reviewed. Zero means the
	// default.
	ReviewQPS            float64
	ReviewBurst          int
	ReviewQPSPerSource   float64
	ReviewBurstPerSource int
	// ReviewQPSUnverified and ReviewBurstUnverified bound the node's
	// TokenReviews of tokens never seen authenticated (ReviewQPS then
	// bounds those of callers already authenticated); ReviewQPSReserved
	// and ReviewBurstReserved are each source's own share, out of the
	// others' reach. Zero means the default.
	ReviewQPSUnverified   float64
	ReviewBurstUnverified int
	ReviewQPSReserved     float64
	ReviewBurstReserved   int

	// ProbeObjectsPerSecond and ProbeObjectsBurst bound the objects the
	// cache's consistent-read probes list in total, under the agent's own
	// identity; ProbeObjectsPerSecondPerSource and
	// ProbeObjectsBurstPerSource those of the probes one source's reads
	// start. A probe counts the objects of its scope beyond those the
	// read that starts it returns, at least 100. A
	// read whose probe either cannot pay for is forwarded. Zero means the
	// default; a negative rate means no bound.
	ProbeObjectsPerSecond          float64
	ProbeObjectsBurst              int
	ProbeObjectsPerSecondPerSource float64
	ProbeObjectsBurstPerSource     int
	// ProbesPerSecond and ProbesPerSecondPerSource bound the probe rounds
	// of the node and of one source, whatever they cost.
	ProbesPerSecond          float64
	ProbesPerSecondPerSource float64
}

// Defaults, as kube-apiserver serves.
const (
	DefaultReadHeaderTimeout    = 32 * time.Second
	DefaultIdleTimeout          = 90 * time.Second
	DefaultMaxHeaderBytes       = 1 << 20
	DefaultHTTP2MaxStreams      = 100
	DefaultHTTP2MaxFrameSize    = 256 << 10
	DefaultHTTP2MaxStreamBuffer = 256 << 10
	// kube-apiserver's own window per stream, as above, rather than Go's
	// 4 MiB: 1 GB/s per stream at a round trip of 0.25 ms, 128 MB/s at
	// 2 ms.
	DefaultHTTP2MaxUpstreamStreamBuffer = 256 << 10
	DefaultMaxRequestsInFlight          = 400
	DefaultMaxMutatingRequestsInFlight  = 200
	DefaultRequestTimeout               = time.Minute
)

// Defaults of the bounds kube-apiserver has no counterpart of: they are
// what one node's pods need, with room to spare.
const (
	// An idle connection costs about 35 KiB. A node holds at most
	// 1000 + 110 x 8 = 1880 (64 MiB); one source 300 (10 MiB), enough for
	// an HTTP/1.1 client (a connection per watch) at its bound of
	// long-running requests with requests beside them.
	DefaultMaxConnections                 = 1000
	DefaultMaxConnectionsPerSource        = 300
	DefaultGuaranteedConnectionsPerSource = 8
	// Clients connect when they have a request to send.
	DefaultFirstRequestTimeout = 10 * time.Second
	// A quarter of the node's bound: it takes four sources at their own
	// bound to use up the shared pool, and every pod may have a few
	// requests in flight whatever the others do (kube-apiserver confines
	// a flow to its own priority-and-fairness share). A node of 110 pods
	// serves at most 400 + 110 x 8 non-mutating requests per path.
	DefaultMaxRequestsInFlightPerSource         = 100
	DefaultMaxMutatingRequestsInFlightPerSource = 50
	DefaultGuaranteedRequestsInFlightPerSource  = 8
	// Every pod of a node (the kubelet's 110 by default) may hold a few
	// watches whatever the others do; the pool beyond that serves four
	// sources at their bound at once. A full node holds at most 1000 +
	// 110 x 8 = 1880, below the 2000 of one pool before.
	DefaultMaxLongRunningRequests                 = 1000
	DefaultGuaranteedLongRunningRequestsPerSource = 8
	// A controller with a watch per resource type of a large cluster.
	DefaultMaxLongRunningRequestsPerSource = 250
	// kube-apiserver's --request-timeout.
	DefaultRequestBodyTimeout = time.Minute
)

// DefaultLimits returns the limits the command line starts from.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout:            DefaultReadHeaderTimeout,
		IdleTimeout:                  DefaultIdleTimeout,
		MaxHeaderBytes:               DefaultMaxHeaderBytes,
		HTTP2MaxStreams:              DefaultHTTP2MaxStreams,
		HTTP2MaxFrameSize:            DefaultHTTP2MaxFrameSize,
		HTTP2MaxStreamBuffer:         DefaultHTTP2MaxStreamBuffer,
		HTTP2MaxUpstreamStreamBuffer: DefaultHTTP2MaxUpstreamStreamBuffer,
		MaxRequestsInFlight:          DefaultMaxRequestsInFlight,
		MaxMutatingRequestsInFlight:  DefaultMaxMutatingRequestsInFlight,

		MaxConnections:                 DefaultMaxConnections,
		MaxConnectionsPerSource:        DefaultMaxConnectionsPerSource,
		GuaranteedConnectionsPerSource: DefaultGuaranteedConnectionsPerSource,
		FirstRequestTimeout:            DefaultFirstRequestTimeout,

		MaxRequestsInFlightPerSource:         DefaultMaxRequestsInFlightPerSource,
		MaxMutatingRequestsInFlightPerSource: DefaultMaxMutatingRequestsInFlightPerSource,
		GuaranteedRequestsInFlightPerSource:  DefaultGuaranteedRequestsInFlightPerSource,
		RequestTimeout:                       DefaultRequestTimeout,

		MaxLongRunningRequests:                 DefaultMaxLongRunningRequests,
		MaxLongRunningRequestsPerSource:        DefaultMaxLongRunningRequestsPerSource,
		GuaranteedLongRunningRequestsPerSource: DefaultGuaranteedLongRunningRequestsPerSource,
		MaxCacheRequestsPerSource:              apicache.DefaultMaxInFlightPerSource,
		RequestBodyTimeout:                     DefaultRequestBodyTimeout,
		MaxBufferedBodyBytes:                   DefaultMaxBufferedBodyBytes,
		ReviewQPS:                              access.DefaultReviewQPS,
		ReviewBurst:                            access.DefaultReviewBurst,
		ReviewQPSPerSource:                     access.DefaultSourceReviewQPS,
		ReviewBurstPerSource:                   access.DefaultSourceReviewBurst,
		ReviewQPSUnverified:                    access.DefaultUnverifiedReviewQPS,
		ReviewBurstUnverified:                  access.DefaultUnverifiedReviewBurst,
		ReviewQPSReserved:                      access.DefaultReservedReviewQPS,
		ReviewBurstReserved:                    access.DefaultReservedReviewBurst,
		ProbeObjectsPerSecond:                  apicache.DefaultProbeObjectsPerSecond,
		ProbeObjectsBurst:                      apicache.DefaultProbeBurst,
		ProbeObjectsPerSecondPerSource:         apicache.DefaultProbeObjectsPerSecondPerSource,
		ProbeObjectsBurstPerSource:             apicache.DefaultProbeBurstPerSource,
		ProbesPerSecond:                        apicache.DefaultProbeRoundsPerSecond,
		ProbesPerSecondPerSource:               apicache.DefaultProbeRoundsPerSecondPerSource,
	}
}

// AddFlags registers the limits' flags on fs, with l's values as defaults.
func (l *Limits) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", l.ReadHeaderTimeout, "Close connections whose request headers take longer than this to arrive.")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", l.IdleTimeout, "Close keep-alive connections idle this long.")
	fs.IntVar(&l.MaxHeaderBytes, "max-header-bytes", l.MaxHeaderBytes, "Largest request line plus headers accepted; larger requests get 431.")
	fs.IntVar(&l.MaxConnections, "max-connections", l.MaxConnections, "Client connections open at once beyond the client IPs' guaranteed shares: the pool all clients draw on above --guaranteed-connections-per-source; a connection past it is closed as soon as it is accepted. A node holds at most this plus the guaranteed share of each of its pods. Negative means no limit.")
	fs.IntVar(&l.MaxConnectionsPerSource, "max-connections-per-source", l.MaxConnectionsPerSource, "Connections one client IP may have open at once, its guaranteed share included; past it a connection is closed as soon as it is accepted (host-network pods share the node's IP). HTTP/2 clients need one or two; HTTP/1.1 clients one per watch or request in flight. Negative means no limit.")
	fs.IntVar(&l.GuaranteedConnectionsPerSource, "guaranteed-connections-per-source", l.GuaranteedConnectionsPerSource, "Connections every client IP may have open whatever the others hold. Negative means none.")
	fs.DurationVar(&l.FirstRequestTimeout, "first-request-timeout", l.FirstRequestTimeout, "Close connections that have not sent the headers of a first request (TLS handshake included) this long after they were accepted.")
	fs.IntVar(&l.HTTP2MaxStreams, "http2-max-streams-per-connection", l.HTTP2MaxStreams, "Concurrent streams allowed on one HTTP/2 connection.")
	fs.IntVar(&l.HTTP2MaxFrameSize, "http2-max-frame-size", l.HTTP2MaxFrameSize, "Largest HTTP/2 frame read from clients (16384 to 16777215).")
	fs.IntVar(&l.HTTP2MaxStreamBuffer, "http2-max-stream-buffer", l.HTTP2MaxStreamBuffer, "HTTP/2 receive window per stream; the connection window is this times --http2-max-streams-per-connection.")
	fs.IntVar(&l.HTTP2MaxUpstreamStreamBuffer, "http2-max-upstream-stream-buffer", l.HTTP2MaxUpstreamStreamBuffer, "HTTP/2 receive window per stream towards kube-apiserver: how much of an answer is read ahead of its client, and so held by an answer the client does not read until --request-timeout. A stream moves at most this much per round trip to kube-apiserver.")
	fs.IntVar(&l.MaxRequestsInFlight, "max-requests-inflight", l.MaxRequestsInFlight, "Non-mutating requests (get, list) served at once beyond the client IPs' guaranteed shares before 429, per path: the cache and the forwarding path each have this many (so up to twice it in all). All clients draw on it above --guaranteed-requests-inflight-per-source. Watches and other long-running requests are not counted. 0 means no limit, in total or per client IP.")
	fs.IntVar(&l.MaxMutatingRequestsInFlight, "max-mutating-requests-inflight", l.MaxMutatingRequestsInFlight, "Mutating requests forwarded at once beyond the client IPs' guaranteed shares before 429. 0 means no limit, in total or per client IP.")
	fs.IntVar(&l.MaxRequestsInFlightPerSource, "max-requests-inflight-per-source", l.MaxRequestsInFlightPerSource, "Non-mutating requests of one client IP served at once before 429, per path, its guaranteed share included (host-network pods share the node's IP). Negative means no limit.")
	fs.IntVar(&l.MaxMutatingRequestsInFlightPerSource, "max-mutating-requests-inflight-per-source", l.MaxMutatingRequestsInFlightPerSource, "Mutating requests of one client IP forwarded at once before 429, its guaranteed share included. Negative means no limit.")
	fs.IntVar(&l.GuaranteedRequestsInFlightPerSource, "guaranteed-requests-inflight-per-source", l.GuaranteedRequestsInFlightPerSource, "Requests of each kind (non-mutating per path, mutating) every client IP may have in flight whatever the others hold: other pods can never make these get 429. Negative means none.")
	fs.DurationVar(&l.RequestTimeout, "request-timeout", l.RequestTimeout, "How long the answer to a request that is not long-running may take, from its arrival to its last byte: an answer its client does not read is ended then (its HTTP/2 stream reset, its HTTP/1.1 connection closed) and its in-flight slot freed, as kube-apiserver's --request-timeout does.")
	fs.IntVar(&l.MaxLongRunningRequests, "max-long-running-requests", l.MaxLongRunningRequests, "Long-running requests (watches, exec, attach, port-forward, proxy, logs) open at once beyond the client IPs' guaranteed shares: the pool all clients draw on above --guaranteed-long-running-requests-per-source; past it they get 429. A node holds at most this plus the guaranteed share of each of its pods. Negative means no limit.")
	fs.IntVar(&l.MaxLongRunningRequestsPerSource, "max-long-running-requests-per-source", l.MaxLongRunningRequestsPerSource, "Long-running requests one client IP may have open at once before 429, its guaranteed share included (host-network pods share the node's IP). Negative means no limit.")
	fs.IntVar(&l.GuaranteedLongRunningRequestsPerSource, "guaranteed-long-running-requests-per-source", l.GuaranteedLongRunningRequestsPerSource, "Long-running requests every client IP may have open whatever the others hold: other pods can never make these get 429. Negative means none.")
	fs.IntVar(&l.MaxCacheRequestsPerSource, "max-cache-requests-per-source", l.MaxCacheRequestsPerSource, "Reads of one client IP the cache reviews, or waits for a resourceVersion for, at once; past it that client's reads are forwarded. Negative means no limit.")
	fs.DurationVar(&l.RequestBodyTimeout, "request-body-timeout", l.RequestBodyTimeout, "How long the body of a request that is not long-running may take to arrive.")
	fs.IntVar(&l.MaxBufferedBodyBytes, "max-buffered-body-bytes", l.MaxBufferedBodyBytes, "Request bodies held in memory at once, all requests together, to resend a write to another endpoint; bodies past it are streamed.")
	fs.Float64Var(&l.ReviewQPS, "review-qps", l.ReviewQPS, "Reviews per second the agent sends for callers already authenticated (SubjectAccessReviews, and TokenReviews of tokens authenticated before), beyond each client IP's reserve; callers past it are forwarded instead of reviewed.")
	fs.Float64Var(&l.ReviewQPSUnverified, "review-qps-unverified", l.ReviewQPSUnverified, "TokenReviews per second the agent sends for tokens never seen authenticated, beyond each client IP's reserve; bogus tokens spend this budget and never --review-qps.")
	fs.IntVar(&l.ReviewBurstUnverified, "review-burst-unverified", l.ReviewBurstUnverified, "Burst of --review-qps-unverified.")
	fs.Float64Var(&l.ReviewQPSReserved, "review-qps-reserved-per-source", l.ReviewQPSReserved, "Reviews per second each client IP is sure of, whatever other clients spend: taken before the node's budgets, within --review-qps-per-source.")
	fs.IntVar(&l.ReviewBurstReserved, "review-burst-reserved-per-source", l.ReviewBurstReserved, "Burst of --review-qps-reserved-per-source.")
	fs.IntVar(&l.ReviewBurst, "review-burst", l.ReviewBurst, "Burst of --review-qps.")
	fs.Float64Var(&l.ReviewQPSPerSource, "review-qps-per-source", l.ReviewQPSPerSource, "Reviews per second the agent sends for one client IP; past it that client's reads are forwarded instead of reviewed, so one pod cannot use up the others' reviews.")
	fs.IntVar(&l.ReviewBurstPerSource, "review-burst-per-source", l.ReviewBurstPerSource, "Burst of --review-qps-per-source.")
	fs.Float64Var(&l.ProbeObjectsPerSecond, "probe-objects-per-second", l.ProbeObjectsPerSecond, "Objects per second the consistent-read probes may list in total, as the agent (a probe counts the objects of the cached scope it lists beyond what its read would cost forwarded: the objects it returns, at least 100); a consistent read whose probe is past it is forwarded, for its caller to pay. Negative means no limit.")
	fs.IntVar(&l.ProbeObjectsBurst, "probe-objects-burst", l.ProbeObjectsBurst, "Burst of --probe-objects-per-second. A probe larger than it is never sent: keep it at least --cache-probe-max-objects.")
	fs.Float64Var(&l.ProbeObjectsPerSecondPerSource, "probe-objects-per-second-per-source", l.ProbeObjectsPerSecondPerSource, "Objects per second the probes that one client IP's consistent reads start may list; past it that client's consistent reads are forwarded unless they can join a probe already due, so one pod cannot spend the others' probes. Negative means no limit.")
	fs.Float64Var(&l.ProbesPerSecond, "probes-per-second", l.ProbesPerSecond, "Consistent-read probe rounds per second the node may send, however small (burst: two seconds' worth); a consistent read whose probe is past it is forwarded. Negative means no limit.")
	fs.Float64Var(&l.ProbesPerSecondPerSource, "probes-per-second-per-source", l.ProbesPerSecondPerSource, "Consistent-read probe rounds per second one client IP's reads may start, however small (burst: two seconds' worth); past it that client's consistent reads are forwarded unless they can join a probe already due. Negative means no limit.")
	fs.IntVar(&l.ProbeObjectsBurstPerSource, "probe-objects-burst-per-source", l.ProbeObjectsBurstPerSource, "Burst of --probe-objects-per-second-per-source. A probe larger than it is never sent: keep it at least --cache-probe-max-objects.")
}

// Validate reports the first invalid limit, as a one-line error naming its
// flag.
func (l *Limits) Validate() error {
	switch {
	case l.ReadHeaderTimeout < 0:
		return errors.New("--read-header-timeout must not be negative")
	case l.IdleTimeout < 0:
		return errors.New("--idle-timeout must not be negative")
	case l.MaxHeaderBytes < 0:
		return errors.New("--max-header-bytes must not be negative")
	case l.FirstRequestTimeout < 0:
		return errors.New("--first-request-timeout must not be negative")
	case l.HTTP2MaxStreams < 0:
		return errors.New("--http2-max-streams-per-connection must not be negative")
	case l.HTTP2MaxFrameSize != 0 && (l.HTTP2MaxFrameSize < 16<<10 || l.HTTP2MaxFrameSize > 1<<24-1):
		return errors.New("--http2-max-frame-size must be between 16384 and 16777215")
	case l.HTTP2MaxStreamBuffer < 0 || l.HTTP2MaxStreamBuffer > 1<<31-1:
		return errors.New("--http2-max-stream-buffer must be between 0 and 2147483647")
	case l.HTTP2MaxUpstreamStreamBuffer < 0 || l.HTTP2MaxUpstreamStreamBuffer > 1<<31-1:
		return errors.New("--http2-max-upstream-stream-buffer must be between 0 and 2147483647")
	case l.MaxRequestsInFlight < 0:
		return errors.New("--max-requests-inflight must not be negative")
	case l.MaxMutatingRequestsInFlight < 0:
		return errors.New("--max-mutating-requests-inflight must not be negative")
	case l.RequestBodyTimeout < 0:
		return errors.New("--request-body-timeout must not be negative")
	case l.RequestTimeout < 0:
		return errors.New("--request-timeout must not be negative")
	case l.MaxBufferedBodyBytes < 0:
		return errors.New("--max-buffered-body-bytes must not be negative")
	case l.ReviewQPS < 0 || l.ReviewQPSPerSource < 0 || l.ReviewQPSUnverified < 0 || l.ReviewQPSReserved < 0:
		return errors.New("--review-qps, --review-qps-per-source, --review-qps-unverified and --review-qps-reserved-per-source must not be negative")
	case l.ReviewBurst < 0 || l.ReviewBurstPerSource < 0 || l.ReviewBurstUnverified < 0 || l.ReviewBurstReserved < 0:
		return errors.New("--review-burst, --review-burst-per-source, --review-burst-unverified and --review-burst-reserved-per-source must not be negative")
	case l.ProbeObjectsBurst < 0 || l.ProbeObjectsBurstPerSource < 0:
		return errors.New("--probe-objects-burst and --probe-objects-burst-per-source must not be negative")
	}
	return nil
}

// WithDefaults returns l with zero sizes and durations replaced by the
// defaults.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	setDefault(&l.ReadHeaderTimeout, d.ReadHeaderTimeout)
	setDefault(&l.IdleTimeout, d.IdleTimeout)
	setDefault(&l.MaxHeaderBytes, d.MaxHeaderBytes)
	setDefault(&l.MaxConnections, d.MaxConnections)
	setDefault(&l.MaxConnectionsPerSource, d.MaxConnectionsPerSource)
	setDefault(&l.GuaranteedConnectionsPerSource, d.GuaranteedConnectionsPerSource)
	setDefault(&l.FirstRequestTimeout, d.FirstRequestTimeout)
	setDefault(&l.HTTP2MaxStreams, d.HTTP2MaxStreams)
	setDefault(&l.HTTP2MaxFrameSize, d.HTTP2MaxFrameSize)
	setDefault(&l.HTTP2MaxStreamBuffer, d.HTTP2MaxStreamBuffer)
	setDefault(&l.HTTP2MaxUpstreamStreamBuffer, d.HTTP2MaxUpstreamStreamBuffer)
	setDefault(&l.MaxRequestsInFlightPerSource, d.MaxRequestsInFlightPerSource)
	setDefault(&l.MaxMutatingRequestsInFlightPerSource, d.MaxMutatingRequestsInFlightPerSource)
	setDefault(&l.GuaranteedRequestsInFlightPerSource, d.GuaranteedRequestsInFlightPerSource)
	setDefault(&l.RequestTimeout, d.RequestTimeout)
	setDefault(&l.MaxLongRunningRequests, d.MaxLongRunningRequests)
	setDefault(&l.MaxLongRunningRequestsPerSource, d.MaxLongRunningRequestsPerSource)
	setDefault(&l.GuaranteedLongRunningRequestsPerSource, d.GuaranteedLongRunningRequestsPerSource)
	setDefault(&l.MaxCacheRequestsPerSource, d.MaxCacheRequestsPerSource)
	setDefault(&l.RequestBodyTimeout, d.RequestBodyTimeout)
	setDefault(&l.MaxBufferedBodyBytes, d.MaxBufferedBodyBytes)
	return l
}

// setDefault sets *v to def if it is the zero value.
func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// GateOptions returns the review bounds of the access reviewer.
func (l Limits) GateOptions() access.GateOptions {
	return access.GateOptions{QPS: l.ReviewQPS, Burst: l.ReviewBurst,
		UnverifiedQPS: l.ReviewQPSUnverified, UnverifiedBurst: l.ReviewBurstUnverified,
		SourceQPS: l.ReviewQPSPerSource, SourceBurst: l.ReviewBurstPerSource,
		ReservedQPS: l.ReviewQPSReserved, ReservedBurst: l.ReviewBurstReserved}
}

// ProbeBudget returns the bounds of the cache's consistent-read probes.
func (l Limits) ProbeBudget() apicache.ProbeBudget {
	return apicache.ProbeBudget{ObjectsPerSecond: l.ProbeObjectsPerSecond, Burst: l.ProbeObjectsBurst,
		ObjectsPerSecondPerSource: l.ProbeObjectsPerSecondPerSource, BurstPerSource: l.ProbeObjectsBurstPerSource,
		RoundsPerSecond: l.ProbesPerSecond, RoundsPerSecondPerSource: l.ProbesPerSecondPerSource}
}

// http2Config is the HTTP/2 half of the limits. The connection window holds
// a full stream buffer for every stream allowed, as kube-apiserver sizes it,
// capped at HTTP/2's largest window. A connection the client stopped
// reading from altogether is closed once nothing could be written to it
// for the request timeout: its streams' write deadlines cannot end them
// while the connection's writer is stuck in TCP.
func (l Limits) http2Config() *http.HTTP2Config {
	l = l.WithDefaults()
	conn := int64(l.HTTP2MaxStreamBuffer) * int64(l.HTTP2MaxStreams)
	if conn > 1<<31-1 {
		conn = 1<<31 - 1
	}
	return &http.HTTP2Config{
		MaxConcurrentStreams:          l.HTTP2MaxStreams,
		MaxReadFrameSize:              l.HTTP2MaxFrameSize,
		MaxReceiveBufferPerStream:     l.HTTP2MaxStreamBuffer,
		MaxReceiveBufferPerConnection: int(conn),
		WriteByteTimeout:              l.RequestTimeout,
	}
}

// limitInFlight bounds the requests h serves at once as kube-apiserver's
// max-in-flight filter does: get and list requests (readOnly) apart from
// the others (mutating), long-running ones not counted. Unlike that
// filter it shares each bound among sources (fairshare.Pool): every
// source may always have its guaranteed share in flight, and only above
// it draws on the bound shared by all, up to its own. So one source, or a
// few, cannot take a node's whole budget, as kube-apiserver confines a
// flow to its own priority-and-fairness share. A request past either
// bound gets kube-apiserver's 429 with Retry-After: 1, which client-go
// honours by retrying, and is counted as rejected under handler. The
// request must carry its RequestInfo (apihttp.WithRequestInfo).
func (s *Server) limitInFlight(handler string, h http.Handler, readOnly, mutating fairshare.Limits) http.Handler {
	if readOnly.Unbounded() && mutating.Unbounded() {
		return h
	}
	// Per kind, built once: the pool and its gauge, off the request path.
	type bound struct {
		pool  *fairshare.Pool
		gauge prometheus.Gauge
	}
	bounds := map[string]bound{}
	for kind, lim := range map[string]fairshare.Limits{"readOnly": readOnly, "mutating": mutating} {
		bounds[kind] = bound{fairshare.New(lim), s.metrics.inFlight.WithLabelValues(handler, kind)}
	}
	refusals := newThrottledLog("Requests refused: too many in flight", handler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := request.RequestInfoFrom(r.Context())
		if !ok {
			// A path RequestInfo could not parse is still a request that
			// must be counted: treat it as the non-resource request it is.
			info = &request.RequestInfo{Path: r.URL.Path, Verb: strings.ToLower(r.Method)}
			r = r.WithContext(request.WithRequestInfo(r.Context(), info))
		}
		if apihttp.LongRunning(r, info) {
			h.ServeHTTP(w, r)
			return
		}
		kind := "mutating"
		if info.Verb == "get" || info.Verb == "list" || info.Verb == "watch" {
			kind = "readOnly"
		}
		b := bounds[kind]
		if b.pool.Limits().Unbounded() {
			h.ServeHTTP(w, r)
			return
		}
		src := requestSource(r)
		slot, refused := b.pool.Acquire(src)
		if refused != "" {
			s.metrics.rejected.WithLabelValues(handler, kind, string(refused)).Inc()
			refusals.log(klog.FromContext(r.Context()), "source", src, "kind", kind, "reason", refused)
			// kube-apiserver's answer (filters.WithMaxInFlightLimit).
			w.Header().Set("Retry-After", "1")
			http.Error(w, "Too many requests, please try again later.", http.StatusTooManyRequests)
			return
		}
		b.gauge.Inc()
		defer func() {
			slot.Release()
			b.gauge.Dec()
		}()
		h.ServeHTTP(w, r)
	})
}

// inFlightShares are how non-mutating and mutating requests in flight are
// shared among sources. l must have its defaults.
func (l Limits) inFlightShares() (readOnly, mutating fairshare.Limits) {
	share := func(shared, perSource int) fairshare.Limits {
		if shared == 0 {
			return noLimit
		}
		return fairshare.Limits{Guaranteed: l.GuaranteedRequestsInFlightPerSource, PerSource: perSource, Shared: shared}
	}
	return share(l.MaxRequestsInFlight, l.MaxRequestsInFlightPerSource),
		share(l.MaxMutatingRequestsInFlight, l.MaxMutatingRequestsInFlightPerSource)
}

// noLimit bounds nothing.
var noLimit = fairshare.Limits{PerSource: -1, Shared: -1}

// trackConn counts the client connections the server holds open; it is the
// server's ConnState hook.
func (m *metrics) trackConn(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		m.openConns.Inc()
	case http.StateHijacked, http.StateClosed:
		m.openConns.Dec()
	}
}

// limitLongRunning bounds the long-running requests open at once through
// h, shared fairly among sources (client IPs, fairshare.Pool), without
// waiting: a request past its source's bound, or past its guaranteed share
// with the shared pool used up, gets 429 with Retry-After: 1, which
// client-go's watches and kubectl retry. kube-apiserver's own in-flight
// limits leave these requests out, since each may stay open for hours;
// here each holds a goroutine, buffers and an upstream stream, so they are
// bounded separately. The request must carry its RequestInfo.
func (s *Server) limitLongRunning(h http.Handler) http.Handler {
	lim := s.limits.WithDefaults().longRunningShare()
	if lim.Unbounded() {
		return h
	}
	pool := fairshare.New(lim)
	gauge := s.metrics.inFlight.WithLabelValues("long-running", "long-running")
	refusals := newThrottledLog("Requests refused: too many long-running", "long-running")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := request.RequestInfoFrom(r.Context())
		if !ok || !apihttp.LongRunning(r, info) {
			h.ServeHTTP(w, r)
			return
		}
		src := requestSource(r)
		slot, refused := pool.Acquire(src)
		if refused != "" {
			s.metrics.rejected.WithLabelValues("long-running", "long-running", string(refused)).Inc()
			refusals.log(klog.FromContext(r.Context()), "source", src, "reason", refused)
			w.Header().Set("Retry-After", "1")
			apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests("too many long-running requests through the node-local API proxy, please try again later", 1))
			return
		}
		gauge.Inc()
		defer func() {
			slot.Release()
			gauge.Dec()
		}()
		h.ServeHTTP(w, r)
	})
}

// longRunningShare is how long-running requests are shared among sources.
// l must have its defaults.
func (l Limits) longRunningShare() fairshare.Limits {
	return fairshare.Limits{
		Guaranteed: l.GuaranteedLongRunningRequestsPerSource,
		PerSource:  l.MaxLongRunningRequestsPerSource,
		Shared:     l.MaxLongRunningRequests,
	}
}

// sourceOf returns the source of a request or connection from its remote
// address: the client IP, which is one pod (host-network pods all share
// the node's).
func sourceOf(remoteAddr string) string {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().String()
	}
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}

// withRequestTimeout gives the answer to a request that is not
// long-running (nor an upgrade) until timeout after its arrival to be
// written, as kube-apiserver's --request-timeout does: a client that does
// not read it has its HTTP/2 stream reset, or its HTTP/1.1 connection
// closed, at that deadline, which ends the handler's writes and so frees
// the in-flight slot the request holds. Without it, an answer never read
// holds its slot for as long as the client keeps its connection. (net/http
// lifts an HTTP/1.1 connection's write deadline after each request, so the
// next request on it starts without one.)
//
// Not inlined into the chain's constructor, where its handler would be
// compiled without http.NewResponseController inlined, which then
// allocates the controller on every request.
//
//go:noinline
func (s *Server) withRequestTimeout(h http.Handler, timeout time.Duration) http.Handler {
	timeouts := newThrottledLog("Ended answers not written within the request timeout", "")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if apihttp.IsUpgrade(r) || apihttp.IsLongRunning(r) {
			h.ServeHTTP(w, r)
			return
		}
		deadline := time.Now().Add(timeout)
		if http.NewResponseController(w).SetWriteDeadline(deadline) != nil {
			h.ServeHTTP(w, r)
			return
		}
		// Deferred: the forwarder ends a failed answer by panicking with
		// http.ErrAbortHandler.
		defer func() {
			if !time.Now().Before(deadline) {
				s.metrics.requestTimeouts.Inc()
				timeouts.log(klog.FromContext(r.Context()), "source", sourceOf(r.RemoteAddr), "method", r.Method, "path", r.URL.Path, "timeout", timeout)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// withoutIgnoredBody drops the body of a request whose body kube-apiserver
// never reads, a watch or a get of a pod's log, which may stay open for
// hours. kube-apiserver serves such a request as if it had no body, and so
// does the agent, but without holding the body meanwhile: HTTP/2 buffers up
// to a stream's window of it (256 KiB), which neither the cache nor
// kube-apiserver would ever read. Over HTTP/2 the body is closed at once,
// which makes net/http drop what it holds of it and discard what follows
// (a client can send no more than one window). It is never forwarded.
// Over HTTP/1.1 net/http itself reads at most 256 KiB of a body left
// unread before the answer starts, and closes the connection after the
// answer if more is left; the body is not closed here, since closing it
// would wait for those bytes. The request must carry its RequestInfo.
func withoutIgnoredBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || !bodyIgnored(r) {
			h.ServeHTTP(w, r)
			return
		}
		if r.ProtoMajor == 2 {
			_ = r.Body.Close()
		}
		r = r.Clone(r.Context())
		r.Body, r.ContentLength = http.NoBody, 0
		r.Header.Del("Content-Length")
		r.Header.Del("Transfer-Encoding")
		h.ServeHTTP(w, r)
	})
}

// bodyIgnored reports whether kube-apiserver ignores r's body: r is a
// watch, or a get of a log, both long-running.
func bodyIgnored(r *http.Request) bool {
	info, ok := request.RequestInfoFrom(r.Context())
	return ok && (info.Verb == "watch" || (info.Verb == "get" && info.Subresource == "log"))
}

// withBodyDeadline gives the body of a request that is not long-running
// (nor an upgrade) lim.RequestBodyTimeout to arrive: a client that holds
// the last bytes of a body back has its request failed, instead of holding
// the agent's buffers and an upstream stream for as long as it likes. The
// deadline is lifted as soon as the body has been read, so it never
// limits how long the answer takes. The request must carry its
// RequestInfo.
//
// Not inlined into the chain's constructor, where its handler would be
// compiled without http.NewResponseController inlined, which then
// allocates the controller on every request.
//
//go:noinline
func withBodyDeadline(h http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || apihttp.IsUpgrade(r) || apihttp.IsLongRunning(r) {
			h.ServeHTTP(w, r)
			return
		}
		deadline := time.Now().Add(timeout)
		// The controller is part of the body, not a second allocation.
		b := &deadlineBody{ReadCloser: r.Body, rc: *http.NewResponseController(w), timeout: timeout, deadline: deadline}
		if b.rc.SetReadDeadline(deadline) == nil {
			r = r.WithContext(context.WithValue(r.Context(), deadlineBodyKey{}, b))
			r.Body = b
		}
		h.ServeHTTP(w, r)
	})
}

// deadlineBodyKey carries a request's *deadlineBody in its context.
type deadlineBodyKey struct{}

// deadlineBody lifts the read deadline once the body has been read to its
// end, and remembers that it was. A body that ends otherwise keeps its
// deadline: after the handler, net/http reads what is left of a short
// body before it answers, and must not wait for it forever.
type deadlineBody struct {
	io.ReadCloser
	rc       http.ResponseController
	timeout  time.Duration
	deadline time.Time
	complete atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.complete.Swap(true) {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// bodyTimedOut returns the error to answer a request whose body did not
// arrive within its deadline, or nil: kube-apiserver's 504 for a request
// that did not complete in time. (The deadline's read error also cancels
// the request's context, which the forwarder may see first; so the
// deadline is checked, not the error.)
func bodyTimedOut(r *http.Request) error {
	// The forwarder's outgoing request wraps the body; the context
	// carries it unchanged.
	if b, ok := r.Context().Value(deadlineBodyKey{}).(*deadlineBody); ok && !b.complete.Load() && !time.Now().Before(b.deadline) {
		return apierrors.NewTimeoutError(fmt.Sprintf("request body did not arrive within %v", b.timeout), 0)
	}
	return nil
}

// DefaultMaxBufferedBodyBytes is the default bound of the request bodies
// buffered for retries at once: 8 bodies of the largest size, or hundreds
// of ordinary writes.
const DefaultMaxBufferedBodyBytes = 8 << 20
