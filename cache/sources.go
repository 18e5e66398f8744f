package cache

import (
	"net"
	"net/http"
	"sync"
)

// sourceLimiter bounds how many requests from one source (a client IP: one
// pod, or every host-network pod of the node together) the cache is
// deciding on at once: reviewing the caller and waiting for a
// resourceVersion, the steps a caller can make slow. It never waits: a
// source past its share is forwarded, and kube-apiserver's own fairness
// (API Priority and Fairness) takes over for it. So one pod that holds
// many requests in a review or a resourceVersion wait cannot take the
// cache from the others.
type sourceLimiter struct {
	// max is the bound per source; zero or less means none.
	max int

	mu       sync.Mutex // protects the field below
	inFlight map[string]int
}

func newSourceLimiter(max int) *sourceLimiter {
	return &sourceLimiter{max: max, inFlight: map[string]int{}}
}

// acquire takes one of r's source's slots. It returns false if the source
// has none left; otherwise the caller must call release exactly once.
func (l *sourceLimiter) acquire(r *http.Request) (release func(), ok bool) {
	if l.max <= 0 {
		return func() {}, true
	}
	src := sourceOf(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight[src] >= l.max {
		return nil, false
	}
	l.inFlight[src]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.inFlight[src]--; l.inFlight[src] <= 0 {
				delete(l.inFlight, src)
			}
		})
	}, true
}

// sourceOf returns r's source: the IP of its client's address, or the
// address itself if it has no port.
func sourceOf(r *http.Request) string {
	src, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return src
}
