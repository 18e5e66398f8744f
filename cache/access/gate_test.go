package access

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// TestReviewGate: one source sending distinct bogus tokens spends its own
// share of reviews and is then forwarded without a review, while another
// source is still reviewed and answered; the node-wide bucket bounds all
// sources together.
func TestReviewGate(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.setPolicy(allowUser("alice"))
	d := newReviewer(t, f, Options{Gate: GateOptions{QPS: 1e-9, Burst: 12, SourceQPS: 1e-9, SourceBurst: 5}})

	attacker := func(i int) Result {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(fmt.Sprintf("bogus-%d", i)))
		r.RemoteAddr = "10.0.0.66:4000"
		return d.Review(r, info)
	}
	for i := range 5 {
		if res := attacker(i); res.Reason != ReasonTokenRejected {
			t.Fatalf("bogus token %d within the share: %+v, want %s", i, res, ReasonTokenRejected)
		}
	}
	for i := 5; i < 300; i++ {
		if res := attacker(i); res.Verdict != Forward || res.Reason != ReasonThrottled {
			t.Fatalf("bogus token %d past the share: %+v, want forwarded as %s", i, res, ReasonThrottled)
		}
	}
	if tokens, _ := f.counts(); tokens != 5 {
		t.Errorf("TokenReviews sent for 300 bogus tokens: %d, want the source's burst of 5", tokens)
	}

	// A victim pod on another address is reviewed (token and access) and
	// allowed.
	r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer("alice-token"))
	r.RemoteAddr = "10.0.0.7:5000"
	if res := d.Review(r, info); res.Verdict != Allowed {
		t.Fatalf("victim: %+v, want allowed", res)
	}
	// The node-wide burst of 12 is spent by 5 more sources' reviews; the
	// next source is throttled by it.
	for i := range 5 {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(fmt.Sprintf("other-%d", i)))
		r.RemoteAddr = fmt.Sprintf("10.0.1.%d:1", i)
		if res := d.Review(r, info); res.Reason != ReasonTokenRejected {
			t.Fatalf("source %d: %+v", i, res)
		}
	}
	r, info = newRequest(t, "/api/v1/namespaces/ns1/pods", bearer("more"))
	r.RemoteAddr = "10.0.2.1:1"
	if res := d.Review(r, info); res.Reason != ReasonThrottled {
		t.Errorf("past the node-wide share: %+v, want %s", res, ReasonThrottled)
	}
}

// TestLargeReviewsForwarded: a request whose selectors, name and namespace
// exceed MaxReviewBytes is forwarded without any review, so distinct large
// selectors cannot fill the decision caches.
func TestLargeReviewsForwarded(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.setPolicy(allowUser("alice"))
	d := newReviewer(t, f, Options{})
	for i := range 100 {
		sel := fmt.Sprintf("metadata.name=%d-%s", i, strings.Repeat("x", 64<<10))
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods?fieldSelector="+url.QueryEscape(sel), bearer("alice-token"))
		if res := d.Review(r, info); res.Verdict != Forward || res.Reason != ReasonTooLarge {
			t.Fatalf("request %d with a 64 KiB selector: %+v, want forwarded as %s", i, res, ReasonTooLarge)
		}
	}
	if tokens, access := f.counts(); tokens != 0 || access != 0 {
		t.Errorf("reviews sent for oversized requests: %d token, %d access; want none", tokens, access)
	}
	// A metadata.name selector is also the review's name: it counts twice.
	sel := "metadata.name=" + strings.Repeat("x", (MaxReviewBytes-len("ns1")-len("metadata.name="))/2)
	r, info := newRequest(t, "/api/v1/namespaces/ns1/pods?fieldSelector="+url.QueryEscape(sel), bearer("alice-token"))
	if res := d.Review(r, info); res.Verdict != Allowed {
		t.Errorf("request at the bound (%d bytes): %+v, want allowed", reviewSize(r, info), res)
	}
}
