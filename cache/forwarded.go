package cache

import (
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
)

// Requests the cache does not answer go to the forwarder as they came,
// with one exception. A watch forwarded only because its resource's cache
// is not ready yet (its informer starting, or its own watch broken and not
// back within the wait) would hold a watch upstream for its whole life:
// kube-apiserver's default is 30 to 60 minutes, and after an apiserver
// restart every watcher of every node comes back at once, which is the
// very storm that serving watches from the cache avoids. So its
// timeoutSeconds is capped at a short, jittered time (the client's own if
// shorter): the client watches again from its last resourceVersion soon,
// and is then served from the cache. The same holds for a watch from the
// current state forwarded because the probe budget was spent
// (probebudget.go): its client comes back from a resourceVersion, which
// needs no probe. Watches forwarded for reasons that
// last (a scope the cache does not hold, an uncached resource, a caller
// the cache cannot review) are left as they are.

// Bounds of the timeoutSeconds of a watch forwarded while its resource's
// cache is not ready: at least forwardedWatchTimeout, plus up to
// forwardedWatchJitter, so that clients that came together do not come
// back together.
var (
	forwardedWatchTimeout = 60 * time.Second
	forwardedWatchJitter  = 30 * time.Second
)

// firstWatchGrace is how long a new informer counts as starting while its
// own watch has never opened, and how long after its watch broke a
// resource still counts as coming back. Past it, the resource is not
// expected to be served soon (the agent may list it but not watch it, say),
// and capping its watches would only multiply the watches its clients open
// upstream.
const firstWatchGrace = 5 * time.Minute

// forward relays r upstream, for reason.
func (c *Cache) forward(w http.ResponseWriter, r *http.Request, info *request.RequestInfo, reason string, next http.Handler) {
	c.metrics.forwarded(info, reason)
	if info != nil && info.Verb == "watch" && c.servedSoon(info, reason) {
		limit := forwardedWatchTimeout + rand.N(forwardedWatchJitter+time.Second)
		if capped, ok := capWatchTimeout(r, int64(limit/time.Second)); ok {
			c.metrics.watchCapped(c.byGR[groupResource(info)].label)
			r = capped
		}
	}
	next.ServeHTTP(w, r)
}

// servedSoon reports whether a watch forwarded for reason would be served
// from the cache once its resource's cache is ready, and that is expected
// soon: the informer was just woken (idle), is starting (not-synced), or
// its own watch, which has opened before, broke and has not reopened yet
// (watch-unhealthy); or the watch, from the current state, found the
// probe budget spent (consistent-probe-budget).
func (c *Cache) servedSoon(info *request.RequestInfo, reason string) bool {
	res := c.byGR[groupResource(info)]
	if res == nil {
		return false
	}
	switch reason {
	case reasonIdle:
		return true
	case reasonProbeBudget:
		// A watch from the current state whose probe its source's share
		// or the node's budget could not pay for: it comes back from
		// its last resourceVersion, which needs no probe.
		return true
	case reasonNotSynced, reasonUnhealthy:
		inf := res.current.Load()
		if inf == nil {
			return false
		}
		if inf.watchOpened.Load() {
			// Broken for long (the agent lost watch but not list, a
			// partition from every apiserver): no cap, or every client
			// watch of the resource on every node would reopen upstream
			// every minute or so for as long as it lasts.
			down := inf.downSince.Load()
			return down == 0 || c.clock.Since(time.Unix(0, down)) < firstWatchGrace
		}
		return c.clock.Since(inf.started) < firstWatchGrace
	}
	return false
}

// capWatchTimeout returns a copy of r whose timeoutSeconds is max, and
// true, unless r's own is already at most max (or is one kube-apiserver
// would reject or end at once: that answer is kube-apiserver's to give).
// Only that parameter of the query changes; the forwarder builds the
// upstream request from the returned request's URL.
func capWatchTimeout(r *http.Request, max int64) (*http.Request, bool) {
	const key = "timeoutSeconds"
	var kept []string
	own, found := int64(0), false
	for _, part := range strings.Split(r.URL.RawQuery, "&") {
		k, v, _ := strings.Cut(part, "=")
		if name, err := url.QueryUnescape(k); err != nil || name != key {
			if part != "" {
				kept = append(kept, part)
			}
			continue
		}
		if !found {
			// kube-apiserver decodes the first value.
			s, err := url.QueryUnescape(v)
			if err != nil {
				return r, false
			}
			if own, err = strconv.ParseInt(s, 10, 64); err != nil {
				return r, false
			}
			found = true
		}
	}
	if found && (own < 0 || (own > 0 && own <= max)) {
		// 0 is no timeout: kube-apiserver's 30 to 60 minutes.
		return r, false
	}
	kept = append(kept, key+"="+strconv.FormatInt(max, 10))
	u := *r.URL
	u.RawQuery = strings.Join(kept, "&")
	out := r.WithContext(r.Context())
	out.URL = &u
	out.RequestURI = u.RequestURI()
	return out, true
}
