package cache

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// TestForwardedWatchTimeoutCapped: a watch forwarded only because its
// resource's cache is not ready yet reaches the forwarder with its
// timeoutSeconds capped at 60 to 90 seconds (its own if shorter), the
// rest of its query as it came, so that its client comes back soon to be
// served from the cache; a watch forwarded for a reason that lasts
// reaches it untouched.
func TestForwardedWatchTimeoutCapped(t *testing.T) {
	node := "&fieldSelector=" + url.QueryEscape("spec.nodeName=node-a")
	for _, tc := range []struct {
		name string
		// state puts the pods' informer in the state the case is about.
		state func(c *Cache)
		path  string
		// capped: the forwarded query has timeoutSeconds in [60, 90];
		// otherwise it is the query sent.
		capped bool
	}{{
		// The cache's own watch broke (an apiserver restarted) and did
		// not reopen within the wait.
		name:   "watch-unhealthy",
		state:  brokenWatch,
		path:   "/api/v1/pods?watch=true&resourceVersion=100" + node,
		capped: true,
	}, {
		name:   "watch-unhealthy, a longer timeout of its own",
		state:  brokenWatch,
		path:   "/api/v1/pods?watch=true&timeoutSeconds=3600&resourceVersion=100" + node,
		capped: true,
	}, {
		name:  "watch-unhealthy, a shorter timeout of its own",
		state: brokenWatch,
		path:  "/api/v1/pods?watch=true&timeoutSeconds=30&resourceVersion=100" + node,
	}, {
		name:   "not-synced: the informer is starting",
		state:  func(c *Cache) { startingInformer(c, time.Now()) },
		path:   "/api/v1/pods?watch=true&allowWatchBookmarks=true" + node,
		capped: true,
	}, {
		// Its watch never opened in all that time: the agent may list
		// the resource but not watch it.
		name:  "not-synced long after the informer started",
		state: func(c *Cache) { startingInformer(c, time.Now().Add(-2*firstWatchGrace)) },
		path:  "/api/v1/pods?watch=true&allowWatchBookmarks=true" + node,
	}, {
		// Its watch has been broken for longer than the grace: capping
		// would only make every client watch reopen upstream each minute.
		name: "watch-unhealthy for long",
		state: func(c *Cache) {
			brokenWatch(c)
			c.resources[0].current.Load().downSince.Store(time.Now().Add(-2 * firstWatchGrace).UnixNano())
		},
		path: "/api/v1/pods?watch=true&timeoutSeconds=3600&resourceVersion=100" + node,
	}, {
		name:  "out-of-scope: another node's pods, while the watch is broken",
		state: brokenWatch,
		path:  "/api/v1/pods?watch=true&fieldSelector=" + url.QueryEscape("spec.nodeName=node-b"),
	}, {
		// A watch from the current state whose probe the node's budget
		// cannot pay for (its rounds are spent): it comes back from a
		// resourceVersion.
		name: "consistent-probe-budget",
		state: func(c *Cache) {
			c.probes = newProbeBudget(ProbeBudget{ObjectsPerSecond: -1, ObjectsPerSecondPerSource: -1, RoundsPerSecondPerSource: -1, RoundsPerSecond: 1e-9})
			c.probes.take(time.Now(), "elsewhere", 0)
		},
		path:   "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true" + node,
		capped: true,
	}, {
		name: "not-cached",
		path: "/api/v1/configmaps?watch=true",
	}, {
		// Its client comes back from a recent resourceVersion only once
		// kube-apiserver's stream has moved it on: a reason that lasts.
		name: "resource-version-too-old: from before the event window",
		path: "/api/v1/pods?watch=true&timeoutSeconds=3600&allowWatchBookmarks=true&resourceVersion=1" + node,
	}, {
		name:  "a list is never capped",
		state: brokenWatch,
		path:  "/api/v1/pods?timeoutSeconds=3600" + node,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			up := &fakeUpstream{respond: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }}
			c, _ := testCache(t, up, wlPod("a", "80"))
			if tc.state != nil {
				tc.state(c)
			}
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			req.Header.Set("Authorization", "Bearer token-a")
			info, _ := testInfoFactory.NewRequestInfo(req)
			sent := req.URL.RawQuery
			rec := httptest.NewRecorder()
			c.Handler(up, func(h http.Handler) http.Handler { return h }).ServeHTTP(rec, req.WithContext(request.WithRequestInfo(req.Context(), info)))
			got := up.got()
			if rec.Code != http.StatusTeapot || len(got) != 1 {
				t.Fatalf("status %d after %d upstream requests, want it forwarded", rec.Code, len(got))
			}
			fwd := got[0].URL.Query()
			capped := testutil.ToFloat64(c.metrics.watchesCapped.WithLabelValues("pods"))
			if !tc.capped {
				if got[0].URL.RawQuery != sent {
					t.Errorf("forwarded query %q, want %q as sent", got[0].URL.RawQuery, sent)
				}
				if capped != 0 {
					t.Errorf("%v watches counted as capped, want none", capped)
				}
				return
			}
			if secs, err := strconv.Atoi(fwd.Get("timeoutSeconds")); err != nil || secs < 60 || secs > 90 || len(fwd["timeoutSeconds"]) != 1 {
				t.Errorf("forwarded timeoutSeconds %q, want one between 60 and 90", fwd["timeoutSeconds"])
			}
			want, _ := url.ParseQuery(sent)
			fwd.Del("timeoutSeconds")
			want.Del("timeoutSeconds")
			if fwd.Encode() != want.Encode() {
				t.Errorf("forwarded query %q, want %q but for timeoutSeconds", got[0].URL.RawQuery, sent)
			}
			if capped != 1 {
				t.Errorf("%v watches counted as capped, want 1", capped)
			}
			if req.URL.RawQuery != sent {
				t.Errorf("the client's request was changed: %q", req.URL.RawQuery)
			}
		})
	}
}

// brokenWatch makes the pods' informer one whose watch has opened before
// and is broken now.
func brokenWatch(c *Cache) {
	inf := c.resources[0].current.Load()
	inf.watchOpened.Store(true)
	inf.watchState.Store(2 << 1)
	inf.downSince.Store(time.Now().UnixNano())
}

// startingInformer replaces the pods' informer with one started at
// started that has not synced yet.
func startingInformer(c *Cache, started time.Time) {
	inf := newInformer(c.resources[0])
	inf.started = started
	c.resources[0].current.Store(inf)
}

// TestCapWatchTimeout: only the timeoutSeconds parameter changes, however
// the query spells it; a timeout of the client's own at most the cap, or
// one kube-apiserver would reject or end at once, is left to it.
func TestCapWatchTimeout(t *testing.T) {
	for _, tc := range []struct {
		query, want string
	}{
		{"", "timeoutSeconds=75"},
		{"watch=true&resourceVersion=5", "watch=true&resourceVersion=5&timeoutSeconds=75"},
		{"watch=true&timeoutSeconds=600&labelSelector=a%3Db", "watch=true&labelSelector=a%3Db&timeoutSeconds=75"},
		{"timeout%53econds=600&watch=1", "watch=1&timeoutSeconds=75"},
		{"timeoutSeconds=600&timeoutSeconds=5", "timeoutSeconds=75"},
		{"timeoutSeconds=0", "timeoutSeconds=75"},
		{"timeoutSeconds=75", ""},
		{"timeoutSeconds=5&timeoutSeconds=600", ""},
		{"timeoutSeconds=-1", ""},
		{"timeoutSeconds=abc", ""},
	} {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/pods?"+tc.query, nil)
		got, ok := capWatchTimeout(r, 75)
		switch {
		case tc.want == "" && (ok || got != r):
			t.Errorf("%q: capped to %q, want it left alone", tc.query, got.URL.RawQuery)
		case tc.want != "" && (!ok || got.URL.RawQuery != tc.want || got.RequestURI != "/api/v1/pods?"+tc.want):
			t.Errorf("%q: %q (%v), RequestURI %q; want %q", tc.query, got.URL.RawQuery, ok, got.RequestURI, tc.want)
		}
		if r.URL.RawQuery != tc.query {
			t.Errorf("%q: the original request changed to %q", tc.query, r.URL.RawQuery)
		}
	}
}
