package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
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
//   - Responses stream as they arrive (FlushInterval -1), so watches are
//     relayed event by event.
//   - Redirects are relayed, never followed.
//   - Upgrades (exec, attach, port-forward) are tunnelled only after the
//     upstream answered 101; any other answer is relayed and the client
//     connection closed, so no half-upgraded connection is ever reused.
func newForwarder(up *upstreams) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up.pick())
			pr.SetXForwarded()
			for k := range pr.Out.Header {
				if strings.HasPrefix(k, "X-Remote-") {
					delete(pr.Out.Header, k)
				}
			}
		},
		Transport:     up,
		FlushInterval: -1,
		ErrorLog:      newServerErrorLog(klog.Background()),
		ModifyResponse: func(resp *http.Response) error {
			if isUpgrade(resp.Request) && resp.StatusCode != http.StatusSwitchingProtocols {
				resp.Header.Set("Connection", "close")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				// The client went away; there is nobody to answer.
				return
			}
			klog.FromContext(r.Context()).V(2).Info("Forwarding failed", "method", r.Method, "path", r.URL.Path, "err", err)
			if isUpgrade(r) {
				w.Header().Set("Connection", "close")
			}
			writeStatus(w, r, apierrors.NewServiceUnavailable("the node-local API proxy could not reach kube-apiserver"))
		},
	}
}

// isUpgrade reports whether r asks for a protocol upgrade.
func isUpgrade(r *http.Request) bool {
	if r == nil || r.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}
