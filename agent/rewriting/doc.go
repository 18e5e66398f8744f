// Package rewriting is the client path of the rewriting mode: it picks
// the callers a rewrite profile selects, by their reviewed identity, and
// renames their requests and restores the answers with package
// agent/rewrite, around the rest of the agent's request path (the cache
// and the forwarder), which then sees only the names the cluster stores.
//
// Callers no profile selects pass untouched: without profiles the filter
// is not in the chain at all, and with profiles an unselected caller costs
// one look at its token's claims (jwt.go). A caller whose token claims a
// selected ServiceAccount is confirmed with a TokenReview (cached, and
// bounded by the same per-source gate as the cache's reviews) before any
// byte is rewritten: the profile is chosen from what kube-apiserver says
// of the token, never from anything the request claims.
//
// Files: filter.go (selection and the request), response.go (the answer:
// whole bodies and watch streams), memo.go (rewritten objects and events
// kept per profile), metrics.go.
package rewriting
