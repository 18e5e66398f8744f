package serving

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent/internal/apihttp"
	"github.com/kube-apicache/kube-apicache/agent/upstream"
)

// newForwarder returns the handler that relays a request to the active
// upstream unchanged, with the client's own credentials.
//
// What it guarantees:
//   - Authorization and the WebSocket bearer subprotocol pass untouched, and
//     the transport adds nothing of its own, so upstream authentication,
//     authorization, admission and audit see the real caller.
//   - X-Remote-* headers are dropped: they are how an authenticating front
//     proxy asserts identities, and a pod must not be able to assert one.
//   - The answers of long-running requests and upgrades, and every answer
//     of unknown length, stream as they arrive (FlushInterval -1), so
//     watches are relayed event by event. An answer of known length to
//     any other request is written as it is read and sent, in the
//     server's chunks, when the handler ends, as kube-apiserver sends
//     its own: its last bytes and the end of its stream go out together.
//   - Redirects are relayed, never followed.
//   - Upgrades (exec, attach, port-forward) are tunnelled only after the
//     upstream answered 101; any other answer is relayed and the client
//     connection closed, so no half-upgraded connection is ever reused.
//
// observe, if not nil, sees every upstream response before it is relayed
// (the cache's read-your-writes barrier); it may replace resp.Body with an
// equivalent reader.
func newForwarder(up *upstream.Set, observe func(*http.Response)) http.Handler {
	streaming := newReverseProxy(up, observe)
	// With FlushInterval 0 httputil.ReverseProxy still flushes every write
	// of an answer of unknown length (and of a text/event-stream).
	buffered := *streaming
	buffered.FlushInterval = 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if apihttp.IsLongRunning(r) || apihttp.IsUpgrade(r) {
			streaming.ServeHTTP(w, r)
			return
		}
		buffered.ServeHTTP(w, r)
	})
}

// newReverseProxy returns newForwarder's proxy, which flushes every write.
func newReverseProxy(up *upstream.Set, observe func(*http.Response)) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up.Pick())
			pr.SetXForwarded()
			for k := range pr.Out.Header {
				if strings.HasPrefix(k, "X-Remote-") {
					delete(pr.Out.Header, k)
				}
			}
		},
		Transport:     up,
		FlushInterval: -1,
		BufferPool:    copyBuffers,
		ErrorLog:      apihttp.ServerErrorLog(klog.Background()),
		ModifyResponse: func(resp *http.Response) error {
			if apihttp.IsUpgrade(resp.Request) && resp.StatusCode != http.StatusSwitchingProtocols {
				resp.Header.Set("Connection", "close")
			}
			if observe != nil {
				observe(resp)
			}
			if resp.StatusCode == http.StatusOK && apihttp.IsWatch(resp.Request) {
				resp.Body = &endCleanly{ReadCloser: resp.Body, ctx: resp.Request.Context()}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if timeout := bodyTimedOut(r); timeout != nil {
				// The client held its body back (the read deadline also
				// cancelled the request's context); it is still there to
				// be told.
				apihttp.WriteStatus(w, r, timeout)
				return
			}
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				// The client went away; there is nobody to answer.
				return
			}
			if upstream.IsPeerReset(err) {
				// kube-apiserver reset the stream without an answer (the
				// pod behind a proxy subresource closed): the client gets
				// the same reset, as it would without the agent.
				klog.FromContext(r.Context()).V(4).Info("Upstream reset the request's stream", "method", r.Method, "path", r.URL.Path)
				panic(http.ErrAbortHandler)
			}
			klog.FromContext(r.Context()).V(2).Info("Forwarding failed", "method", r.Method, "path", r.URL.Path, "err", err)
			if apihttp.IsUpgrade(r) {
				w.Header().Set("Connection", "close")
			}
			if apihttp.IsWatch(r) {
				// A direct client whose watch cannot reconnect gets
				// "connection refused", which client-go's reflector
				// retries with backoff from where it was; 503 would make
				// it relist. 429 with Retry-After is the answer it treats
				// the same way.
				apihttp.WriteStatus(w, r, apierrors.NewTooManyRequests("the node-local API proxy could not reach kube-apiserver; retry the watch", 1))
				return
			}
			apihttp.WriteStatus(w, r, apierrors.NewServiceUnavailable("the node-local API proxy could not reach kube-apiserver"))
		},
	}
}

// copyBuffers hands the forwarder the buffers it copies answers through:
// without a pool, httputil.ReverseProxy allocates 32 KiB for every request,
// however short its answer.
var copyBuffers = &bufferPool{pool: sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}

// copyBufferSize is httputil.ReverseProxy's own buffer size.
const copyBufferSize = 32 << 10

// bufferPool is an httputil.BufferPool of copyBufferSize buffers.
type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte { return p.pool.Get().(*[copyBufferSize]byte)[:] }

func (p *bufferPool) Put(b []byte) {
	if cap(b) == copyBufferSize {
		p.pool.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
	}
}

// endCleanly ends a relayed watch the way kube-apiserver ends one: when the
// upstream stream breaks (the apiserver restarted, its connection was lost,
// or the agent is draining), the client's response ends normally instead of
// being aborted. A direct client of a vanished apiserver sees its stream end
// and re-watches from its last resourceVersion; an aborted HTTP/2 stream
// (httputil.ReverseProxy's answer to a failed copy) would instead reach
// client-go as a decoding error, and its reflector would relist.
type endCleanly struct {
	io.ReadCloser
	ctx context.Context
}

func (b *endCleanly) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		if b.ctx.Err() == nil {
			klog.FromContext(b.ctx).V(2).Info("Upstream watch broke off; ending the relayed watch", "err", err)
		}
		err = io.EOF
	}
	return n, err
}
