// Package cache is the node-local shared cache: one watch per configured
// resource, shared by every client on the node, whose Store answers covered
// reads with kube-apiserver's semantics and bytes.
//
// Files: store.go (the Store and its resourceVersion), resource.go (one
// watched resource and its informer), ondemand.go (when informers start
// and stop: pinned, or on demand until idle), classify.go (which requests the cache may answer),
// cache.go (the request path), encode.go (JSON and protobuf from cached
// bytes), fields.go (kube-apiserver's field labels), probe.go (the probes
// consistent reads wait for), probebudget.go (what probes may cost the
// agent's identity), write.go (the read-your-writes barrier), asnode.go
// (which identity each watch runs as), metrics.go.
package cache
