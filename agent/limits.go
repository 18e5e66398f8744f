package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/filters"
)

// Limits bound what clients can make the agent hold: connections that never
// finish their headers, oversized headers, HTTP/2 streams and buffers, and
// requests in flight. The defaults are kube-apiserver's own secure-serving
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

	// HTTP2MaxStreams is the number of concurrent streams one HTTP/2
	// connection may have open.
	HTTP2MaxStreams int
	// HTTP2MaxFrameSize is the largest HTTP/2 frame the agent reads.
	HTTP2MaxFrameSize int
	// HTTP2MaxStreamBuffer is the flow-control window (the request body
	// the agent buffers) per stream; the per-connection window is this
	// times HTTP2MaxStreams.
	HTTP2MaxStreamBuffer int

	// MaxRequestsInFlight bounds the non-mutating requests (get, list)
	// being served at once; MaxMutatingRequestsInFlight the others. Above
	// either bound the request gets 429 with Retry-After. Long-running
	// requests (watches, exec, attach, port-forward, proxy, logs) are not
	// counted.
	MaxRequestsInFlight         int
	MaxMutatingRequestsInFlight int
}

// Defaults, as kube-apiserver serves.
const (
	DefaultReadHeaderTimeout           = 32 * time.Second
	DefaultIdleTimeout                 = 90 * time.Second
	DefaultMaxHeaderBytes              = 1 << 20
	DefaultHTTP2MaxStreams             = 100
	DefaultHTTP2MaxFrameSize           = 256 << 10
	DefaultHTTP2MaxStreamBuffer        = 256 << 10
	DefaultMaxRequestsInFlight         = 400
	DefaultMaxMutatingRequestsInFlight = 200
)

// DefaultLimits returns the limits the command line starts from.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout:           DefaultReadHeaderTimeout,
		IdleTimeout:                 DefaultIdleTimeout,
		MaxHeaderBytes:              DefaultMaxHeaderBytes,
		HTTP2MaxStreams:             DefaultHTTP2MaxStreams,
		HTTP2MaxFrameSize:           DefaultHTTP2MaxFrameSize,
		HTTP2MaxStreamBuffer:        DefaultHTTP2MaxStreamBuffer,
		MaxRequestsInFlight:         DefaultMaxRequestsInFlight,
		MaxMutatingRequestsInFlight: DefaultMaxMutatingRequestsInFlight,
	}
}

// AddFlags registers the limits' flags on fs, with l's values as defaults.
func (l *Limits) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", l.ReadHeaderTimeout, "Close connections whose request headers take longer than this to arrive.")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", l.IdleTimeout, "Close keep-alive connections idle this long.")
	fs.IntVar(&l.MaxHeaderBytes, "max-header-bytes", l.MaxHeaderBytes, "Largest request line plus headers accepted; larger requests get 431.")
	fs.IntVar(&l.HTTP2MaxStreams, "http2-max-streams-per-connection", l.HTTP2MaxStreams, "Concurrent streams allowed on one HTTP/2 connection.")
	fs.IntVar(&l.HTTP2MaxFrameSize, "http2-max-frame-size", l.HTTP2MaxFrameSize, "Largest HTTP/2 frame read from clients (16384 to 16777215).")
	fs.IntVar(&l.HTTP2MaxStreamBuffer, "http2-max-stream-buffer", l.HTTP2MaxStreamBuffer, "HTTP/2 receive window per stream; the connection window is this times --http2-max-streams-per-connection.")
	fs.IntVar(&l.MaxRequestsInFlight, "max-requests-inflight", l.MaxRequestsInFlight, "Non-mutating requests (get, list) served at once before 429; watches and other long-running requests are not counted. 0 means no limit.")
	fs.IntVar(&l.MaxMutatingRequestsInFlight, "max-mutating-requests-inflight", l.MaxMutatingRequestsInFlight, "Mutating requests forwarded at once before 429. 0 means no limit.")
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
	case l.HTTP2MaxStreams < 0:
		return errors.New("--http2-max-streams-per-connection must not be negative")
	case l.HTTP2MaxFrameSize != 0 && (l.HTTP2MaxFrameSize < 16<<10 || l.HTTP2MaxFrameSize > 1<<24-1):
		return errors.New("--http2-max-frame-size must be between 16384 and 16777215")
	case l.HTTP2MaxStreamBuffer < 0 || l.HTTP2MaxStreamBuffer > 1<<31-1:
		return errors.New("--http2-max-stream-buffer must be between 0 and 2147483647")
	case l.MaxRequestsInFlight < 0:
		return errors.New("--max-requests-inflight must not be negative")
	case l.MaxMutatingRequestsInFlight < 0:
		return errors.New("--max-mutating-requests-inflight must not be negative")
	}
	return nil
}

// withDefaults returns l with zero sizes and durations replaced by the
// defaults.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.HTTP2MaxStreams == 0 {
		l.HTTP2MaxStreams = d.HTTP2MaxStreams
	}
	if l.HTTP2MaxFrameSize == 0 {
		l.HTTP2MaxFrameSize = d.HTTP2MaxFrameSize
	}
	if l.HTTP2MaxStreamBuffer == 0 {
		l.HTTP2MaxStreamBuffer = d.HTTP2MaxStreamBuffer
	}
	return l
}

// http2Config is the HTTP/2 half of the limits. The connection window holds
// a full stream buffer for every stream allowed, as kube-apiserver sizes it,
// capped at HTTP/2's largest window.
func (l Limits) http2Config() *http.HTTP2Config {
	l = l.withDefaults()
	conn := int64(l.HTTP2MaxStreamBuffer) * int64(l.HTTP2MaxStreams)
	if conn > 1<<31-1 {
		conn = 1<<31 - 1
	}
	return &http.HTTP2Config{
		MaxConcurrentStreams:          l.HTTP2MaxStreams,
		MaxReadFrameSize:              l.HTTP2MaxFrameSize,
		MaxReceiveBufferPerStream:     l.HTTP2MaxStreamBuffer,
		MaxReceiveBufferPerConnection: int(conn),
	}
}

// longRunning is kube-apiserver's own test of which requests are
// long-running: they are exempt from the in-flight limits, since a watch or
// an exec session may stay open for hours.
var longRunning = filters.BasicLongRunningRequestCheck(
	sets.NewString("watch", "proxy"),
	sets.NewString("attach", "exec", "proxy", "log", "portforward"),
)

// limitInFlight bounds the requests h serves at once with kube-apiserver's
// max-in-flight filter: readOnly get and list requests and mutating ones
// that are not long-running; 0 means no bound. A request over the bound gets
// 429 with Retry-After: 1, which client-go honours by retrying, and is
// counted as rejected under handler. The request must carry its
// RequestInfo (withRequestInfo).
func (a *Agent) limitInFlight(handler string, h http.Handler, readOnly, mutating int) http.Handler {
	if readOnly == 0 && mutating == 0 {
		return h
	}
	admitted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served, ok := r.Context().Value(admittedKey{}).(*bool); ok {
			*served = true
		}
		h.ServeHTTP(w, r)
	})
	limited := filters.WithMaxInFlightLimit(admitted, readOnly, mutating, longRunning)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := request.RequestInfoFrom(r.Context())
		if !ok {
			// A path RequestInfo could not parse is still a request that
			// must be counted: treat it as the non-resource request it is.
			info = &request.RequestInfo{Path: r.URL.Path, Verb: strings.ToLower(r.Method)}
			r = r.WithContext(request.WithRequestInfo(r.Context(), info))
		}
		var served bool
		r = r.WithContext(context.WithValue(r.Context(), admittedKey{}, &served))
		limited.ServeHTTP(w, r)
		if !served {
			kind := "mutating"
			if info.Verb == "get" || info.Verb == "list" || info.Verb == "watch" {
				kind = "readOnly"
			}
			a.metrics.rejected.WithLabelValues(handler, kind).Inc()
		}
	})
}

// admittedKey marks, in a request's context, whether the max-in-flight
// filter let it through.
type admittedKey struct{}

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
