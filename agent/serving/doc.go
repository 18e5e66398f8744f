// Package serving is the agent's serving side: the TLS listeners with
// their connection bounds (fair shares per client IP, a first-request
// deadline), kube-apiserver's secure-serving limits, and the handler chain
// every request takes, composed once in Server.buildHandler: client
// certificates handed off, request info, deadlines and long-running
// bounds, then the cache for covered reads of authorized callers, and the
// forwarder, with its in-flight bounds and degraded mode's fast failures,
// for everything else.
//
// It must not touch the node's netfilter state (it imports no netrules):
// what it needs of the interception (sending a source to kube-proxy's
// path, telling a node address) comes as funcs in Options. It never
// changes a caller's credentials: forwarded requests carry exactly what
// the caller sent.
package serving
