package cache

import "context"

type degradedKey struct{}

// WithDegraded marks ctx's request as made while the agent is in degraded
// mode: kube-apiserver is unreachable. A watch the cache can serve is then
// served even while the resource's own watch is broken (it resumes, or
// relists and ends the watches it serves, once kube-apiserver is back),
// since forwarding it could only fail.
func WithDegraded(ctx context.Context) context.Context {
	return context.WithValue(ctx, degradedKey{}, true)
}

// degraded reports whether ctx's request was marked by WithDegraded.
func degraded(ctx context.Context) bool {
	v, _ := ctx.Value(degradedKey{}).(bool)
	return v
}
