package upstream

import (
	"net/url"
	"syscall"
	"time"
)

// Config is what the upstream set needs: its endpoints to start from, how
// to verify them, and its bounds.
type Config struct {
	// Endpoints are the kube-apiserver endpoints to start from (--upstream);
	// the EndpointSlices replace them once read (WatchEndpoints).
	Endpoints []*url.URL
	// CAFile is the CA bundle every endpoint's certificate must chain to;
	// ServerName the name it must carry (empty: DefaultServerName).
	CAFile, ServerName string
	// DialControl is the dialer's Control for every upstream socket: it
	// sets the socket mark that lets it past the redirect (nil: none).
	DialControl func(network, address string, c syscall.RawConn) error
	// HealthPeriod is how often health is looked at (health.go).
	HealthPeriod time.Duration
	// MaxStreamBuffer is the HTTP/2 flow-control window per upstream
	// stream; MaxBufferedBodyBytes bounds the request bodies held for a
	// retry, all requests together.
	MaxStreamBuffer      int
	MaxBufferedBodyBytes int
}

// Defaults.
const (
	// DefaultServerName is the name every kube-apiserver serving
	// certificate carries (upstreamTLSConfig says why this one).
	DefaultServerName = "kubernetes.default.svc"
	// DefaultHealthPeriod is the default health period.
	DefaultHealthPeriod = 2 * time.Second
)
