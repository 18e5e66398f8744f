package cache

import "testing"

// TestWatchListForwardedWhileWatchBroken: while the Store's own watch is
// broken (an apiserver restarted, etcd compacted), a watch-list is
// forwarded rather than answered from a Store whose resourceVersion the
// upstream continuation may no longer know; once the watch is open again
// it is answered from the cache.
func TestWatchListForwardedWhileWatchBroken(t *testing.T) {
	tc := newHandlerCache(t)
	path := "/api/v1/namespaces/ns/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=1&timeoutSeconds=1"
	tc.services.watchState.Store(2 << 1) // watch generation 2, closed
	if got := tc.get(t, path); !got.forwarded() {
		t.Errorf("watch-list with the Store's watch broken: %d %s, want forwarded", got.code, got.body)
	}
	tc.services.watchState.Store(2<<1 | 1)
	if got := tc.get(t, path); got.forwarded() {
		t.Errorf("watch-list with the Store's watch open: forwarded, want answered from the cache")
	}
}
