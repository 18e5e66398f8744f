// Package cache is the node-local shared cache: one watch per configured
// resource, shared by every client on the node, whose Store answers covered
// reads with kube-apiserver's semantics and bytes.
//
// The store, its event history and the per-object encodings are
// cache/store, which knows nothing of HTTP requests.
//
// Files: resource.go (one configured resource and its read-your-writes
// barrier), informer.go (one run of its watch: discovery, the Reflector
// filling the Store, the watch's health), ondemand.go (when informers
// start and stop: pinned, or on demand until idle),
// classify.go (which requests the cache may answer), negotiate.go (the
// answer's encoding and shape), cache.go (the request path), watch.go
// (watches served from the history), watchwriter.go (a served watch's
// stream, framed as kube-apiserver frames it), table.go (Tables of
// custom resources), response.go (compressed lists), probe.go (the probes
// consistent reads wait for), probebudget.go (what probes may cost the
// agent's identity), write.go (the read-your-writes barrier), asnode.go
// (which identity each watch runs as), crd.go (the CRDs of cached custom
// resources), metrics.go.
package cache
