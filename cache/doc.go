// Package cache will hold the node-local shared informer cache that answers
// covered reads (get, list, and the initial events of watch-lists) with
// kube-apiserver's semantics. The agent does not use it yet: every request
// is forwarded upstream.
package cache
