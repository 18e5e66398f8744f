package access

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestReviewGate: one source sending distinct bogus tokens spends its own
// share of reviews and is then forwarded without a review, while another
// source is still reviewed and answered; the node-wide bucket bounds all
// sources together.
func TestReviewGate(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.setPolicy(allowUser("alice"))
	d := newReviewer(t, f, Options{Gate: GateOptions{QPS: 1e-9, Burst: 12, UnverifiedQPS: 1e-9, UnverifiedBurst: 12,
		SourceQPS: 1e-9, SourceBurst: 5, ReservedQPS: 1e-9, ReservedBurst: 1}})

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
	// The node-wide unverified burst of 12 (4 spent by the attacker past
	// its reserve) is spent by 8 more sources' second unknown tokens (the
	// first comes from each one's reserve); a new source then has its
	// reserve only.
	for i := range 16 {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(fmt.Sprintf("other-%d", i)))
		r.RemoteAddr = fmt.Sprintf("10.0.1.%d:1", i/2)
		if res := d.Review(r, info); res.Reason != ReasonTokenRejected {
			t.Fatalf("source %d: %+v", i/2, res)
		}
	}
	for i, want := range []string{ReasonTokenRejected, ReasonThrottled} {
		r, info = newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(fmt.Sprintf("more-%d", i)))
		r.RemoteAddr = "10.0.2.1:1"
		if res := d.Review(r, info); res.Reason != want {
			t.Errorf("token %d of a new source once the node's unverified share is spent: %+v, want %s", i, res, want)
		}
	}
}

// TestBogusTokensLeaveOthersUnthrottled: twenty pods with no rights each
// send bogus tokens as fast as their shares allow. A legitimate caller on
// the same node (its token authenticated before) is reviewed every time,
// and the bogus tokens reach kube-apiserver within the sources' reserves
// and the node's unverified budget.
func TestBogusTokensLeaveOthersUnthrottled(t *testing.T) {
	f := newFakeAPIServer(t)
	f.tokens["alice-token"] = alice
	f.setPolicy(allowUser("alice"))
	d := newReviewer(t, f, Options{AllowTTL: time.Millisecond, DenyTTL: time.Millisecond, TokenTTL: time.Millisecond})
	victim := func(i int) Result {
		r, info := newRequest(t, fmt.Sprintf("/api/v1/namespaces/ns1/pods/p-%d", i), bearer("alice-token"))
		r.RemoteAddr = "10.0.0.7:5000"
		return d.Review(r, info)
	}
	// The victim's token was authenticated before the attack.
	if res := victim(-1); res.Verdict != Allowed {
		t.Fatalf("victim before the attack: %+v", res)
	}
	const sources, perSource = 20, 100
	throttled := 0
	for i := range sources * perSource {
		r, info := newRequest(t, "/api/v1/namespaces/ns1/pods", bearer(fmt.Sprintf("bogus-%d", i)))
		r.RemoteAddr = fmt.Sprintf("10.0.3.%d:4000", i%sources)
		if d.Review(r, info).Reason == ReasonThrottled {
			throttled++
		}
	}
	tokenReviews, _ := f.counts()
	// Each review of the victim renews its token (TTL 1 ms) and sends an
	// access review: two reviews each, all from the verified budget or
	// the victim's own reserve.
	const reads = 12
	victimThrottled := 0
	for i := range reads {
		time.Sleep(2 * time.Millisecond)
		if res := victim(i); res.Verdict != Allowed {
			victimThrottled++
			t.Logf("victim read %d: %v (%s)", i, res.Verdict, res.Reason)
		}
	}
	t.Logf("%d bogus tokens from %d sources: %d TokenReviews sent, %d throttled; victim's reads reviewed and allowed %d of %d",
		sources*perSource, sources, tokenReviews-1, throttled, reads-victimThrottled, reads)
	if victimThrottled > 0 {
		t.Errorf("%d of %d of the victim's reviews throttled by other sources' bogus tokens", victimThrottled, reads)
	}
	// Reserves (10 each) plus the unverified burst (40), plus what the
	// buckets refilled during the loop.
	if max := sources*DefaultReservedReviewBurst + DefaultUnverifiedReviewBurst + 60; tokenReviews-1 > max {
		t.Errorf("%d TokenReviews sent for bogus tokens, want at most %d", tokenReviews-1, max)
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
