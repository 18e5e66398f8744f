package cache

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kube-apicache/kube-apicache/cache/access"
)

// blockingReviewer allows every request once released, and counts the
// reviews waiting.
type blockingReviewer struct {
	waiting sync.WaitGroup
	release chan struct{}
}

func (b *blockingReviewer) Review(*http.Request, *request.RequestInfo) access.Result {
	b.waiting.Done()
	<-b.release
	return access.Result{Verdict: access.Allowed}
}

// TestSourceShare: one source holding its whole share of the cache (its
// requests stuck in a review) has its next request forwarded at once, while
// another source is still answered from the cache; slots come back when
// requests finish.
func TestSourceShare(t *testing.T) {
	tc := newHandlerCache(t)
	tc.sources = newSourceLimiter(2)
	b := &blockingReviewer{release: make(chan struct{})}
	tc.cfg.Reviewer = b
	tc.handler = tc.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) }),
		func(h http.Handler) http.Handler { return h })

	do := func(remote string) int {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns/services", nil)
		req.RemoteAddr = remote
		req.Header.Set("Authorization", "Bearer token")
		info, _ := handlerInfoFactory.NewRequestInfo(req)
		rec := httptest.NewRecorder()
		tc.handler.ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
		return rec.Code
	}
	codes := make(chan int, 3)
	b.waiting.Add(2)
	for range 2 {
		go func() { codes <- do("10.0.0.66:1000") }()
	}
	b.waiting.Wait()
	if code := do("10.0.0.66:1001"); code != 299 {
		t.Errorf("a third request of a source with 2 stuck: %d, want forwarded", code)
	}
	b.waiting.Add(1)
	go func() { codes <- do("10.0.0.7:1000") }()
	b.waiting.Wait()
	close(b.release)
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a request within its source's share: %d, want 200 from the cache", code)
		}
	}
	b.waiting.Add(1)
	if code := do("10.0.0.66:1002"); code != http.StatusOK {
		t.Errorf("the source's request after its others finished: %d, want 200 from the cache", code)
	}
	if n := len(tc.sources.inFlight); n != 0 {
		t.Errorf("%d sources still hold slots", n)
	}
}
