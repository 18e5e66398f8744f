package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
	"sigs.k8s.io/yaml"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// formCase is one request of TestDifferentialForms, sent the same way
// through the agent and straight to kube-apiserver.
type formCase struct {
	name string
	path string
	// accept are the Accept header's values, one header each; none sends
	// no Accept header.
	accept []string
	// code, when set, is the status both must answer: kube-apiserver's
	// answer, pinned where an agent once answered differently.
	code int
	// hit: the agent must answer it from its cache, so that the comparison
	// tests the cache and not only the forwarder.
	hit bool
	// watch: the answer is a watch stream, compared as watchSequence.
	watch bool
	// added and bookmark, for a watch both answer with 200: how many
	// initial ADDED events kube-apiserver sends and whether it ends them
	// with an initial-events-end BOOKMARK (pinned).
	added    int
	bookmark bool
}

// uaForms prefixes the User-Agent of each request of TestDifferentialForms,
// one per request, so that the audit log tells which case reached
// kube-apiserver.
const uaForms = "kube-apicache-e2e/forms/"

// idleRewriteProfile selects a ServiceAccount no test has: with it the
// rewriting is in the agent's chain, for callers it leaves alone.
const idleRewriteProfile = `apiVersion: config.kube-apicache.io/v1alpha1
kind: RewriteConfiguration
profiles:
- name: elsewhere
  selector:
    serviceAccounts: [e2e-rewrite-none/nobody]
  groups:
  - from: e2e.kube-apicache.io
    to: forms.rewrite.e2e.example.net
  kindPrefix: Elsewhere
`

// TestDifferentialForms is the request-forms scenario.
//
// Given an agent whose cache has synced, with a rewrite profile that
// selects another ServiceAccount, and a pod allowed to get, list and
// watch the objects it caches,
// when the pod sends the same request through the agent and directly with
// the same token, in every Accept form a client may send (plain, weighted,
// protobuf, wildcards the cache must not answer such as application/*,
// YAML, parameters, transformations, upper case, two headers, a trailing
// comma), along odd paths (trailing and double slashes, percent-encoding,
// dot segments, a namespace path for a cluster-scoped resource, unknown
// resources and versions), with repeated, conflicting or malformed query
// parameters, and as watches with and without initial events and
// bookmarks,
// then both answer with the same status code, Content-Type and body (a
// list's own resourceVersion and a Table's ages aside); a watch sends the
// same initial events in the same order, and an initial-events-end
// BOOKMARK exactly when kube-apiserver does (only to clients that allow
// bookmarks); the forms the cache covers were answered by the cache, and
// those reached kube-apiserver as no get, list or initial-events watch
// (audit log); and a watch of services from resourceVersion=1, older than
// the agent's event window, is forwarded and carries the same events as
// kube-apiserver's direct answer.
func TestDifferentialForms(t *testing.T) {
	c := requireCluster(t)
	dumpOnFailure(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reader, _ := setUpCacheScenario(t, ctx, c)
	grantClusterRead(t, ctx, c, "e2e-differential-watch",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: reader.Spec.ServiceAccount, Namespace: cacheNS},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: readVerbs})
	if err := reader.WaitAllowed(ctx, "watch", "services"); err != nil {
		t.Fatal(err)
	}
	// The agent runs with a rewrite profile that selects someone else:
	// every answer below is also one to a caller the rewriting does not
	// select, which must be kube-apiserver's byte for byte.
	idle := filepath.Join(t.TempDir(), "rewrite.yaml")
	if err := os.WriteFile(idle, []byte(idleRewriteProfile), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := startAgent(t, ctx, c, "--rewrite-config="+idle)
	waitCacheSynced(t, ctx, agent)
	viaAgent, direct := podClients(t, c, reader)

	nsSvcs := "/api/v1/namespaces/" + cacheNS + "/services"
	// An RV the cache has certainly reached: that of its own RV=0 list.
	var listed metav1.List
	r0 := viaAgent.do(t, ctx, "GET", nsSvcs+"?resourceVersion=0", acceptJSON, uaOther, nil)
	if err := json.Unmarshal(r0.body, &listed); err != nil || listed.ResourceVersion == "" {
		t.Fatalf("listing services: %v %s", err, r0.body)
	}
	svcRV := listed.ResourceVersion

	cases := formCases(nsSvcs, svcRV)
	outcomes := map[string]int{}
	hitUAs := map[string]string{}
	same := 0
	for i, tc := range cases {
		ua := fmt.Sprintf("%s%d", uaForms, i)
		same += boolInt(t.Run(tc.name, func(t *testing.T) {
			before := readCacheMetrics(t, ctx, agent)
			got := doAccepts(t, ctx, viaAgent, tc.path, tc.accept, ua)
			outcome := cacheOutcome(before, readCacheMetrics(t, ctx, agent))
			want := doAccepts(t, ctx, direct, tc.path, tc.accept, uaDirect)
			outcomes[outcome]++
			if outcome == "cache" {
				hitUAs[ua] = tc.name
			}
			t.Logf("%s %v: %d %q, agent outcome %s", tc.path, tc.accept, want.code, want.contentType, outcome)
			if tc.hit && outcome != "cache" {
				t.Errorf("the agent did not answer from its cache: %s", outcome)
			}
			compareForm(t, tc, got, want)
		}))
	}
	hits := outcomes["cache"]
	figuref(t, "%d of %d request forms answered the same through the agent as direct; %d answered from the cache, %d not (by outcome: %v)",
		same, len(cases), hits, len(cases)-hits, outcomes)

	// When the pod watches every namespace's services from
	// resourceVersion=1, a revision before the agent's event window (which
	// starts at the agent's own list), through the agent and directly,
	// then the agent forwards the watch and both streams carry the same
	// events up to the state listed just before: the history
	// kube-apiserver still serves, or its own 410 where etcd has compacted
	// it (an agent once answered 410 from its window where kube-apiserver
	// streamed ADDED events).
	t.Run("watch from resourceVersion 1", func(t *testing.T) {
		listed, err := c.Admin.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		upTo, err := strconv.ParseUint(listed.ResourceVersion, 10, 64)
		if err != nil {
			t.Fatalf("listed at resourceVersion %q: %v", listed.ResourceVersion, err)
		}
		const path = "/api/v1/services?watch=1&timeoutSeconds=3&resourceVersion=1"
		before := readCacheMetrics(t, ctx, agent)
		got := viaAgent.do(t, ctx, "GET", path, acceptJSON, uaOther, nil)
		outcome := cacheOutcome(before, readCacheMetrics(t, ctx, agent))
		want := direct.do(t, ctx, "GET", path, acceptJSON, uaDirect, nil)
		if outcome != "forwarded/resource-version-too-old" {
			t.Errorf("the agent took the watch as %s, want it forwarded as older than its window", outcome)
		}
		if got.code != want.code || want.code != http.StatusOK {
			t.Fatalf("code through the agent %d, direct %d, want 200\nagent:  %.2000s\ndirect: %.2000s", got.code, want.code, got.body, want.body)
		}
		wantEvs, err := watchHistory(want, upTo)
		if err != nil {
			t.Fatalf("direct watch: %v (after %q)", err, wantEvs)
		}
		gotEvs, err := watchHistory(got, upTo)
		if err != nil {
			t.Errorf("watch through the agent: %v (after %q)", err, gotEvs)
		}
		if diff := cmp.Diff(wantEvs, gotEvs); diff != "" {
			t.Errorf("events up to resourceVersion %d differ (-direct +agent):\n%s", upTo, diff)
		}
		added := 0
		for _, ev := range wantEvs {
			added += boolInt(strings.HasPrefix(ev, string(watch.Added)))
		}
		if added == 0 && !slices.Contains(wantEvs, "ERROR 410 Expired") {
			t.Errorf("kube-apiserver sent no ADDED event and no 410 for services from resourceVersion=1: %q", wantEvs)
		}
		figuref(t, "watch of services from resourceVersion=1: forwarded by the agent; %d events up to %d (%d ADDED) the same through the agent and direct",
			len(wantEvs), upTo, added)
	})

	t.Run("cache hits reached no apiserver", func(t *testing.T) {
		forwarded, upstream := 0, 0
		for _, ev := range auditEvents(t, c, func(ev *auditv1.Event) bool { return strings.HasPrefix(ev.UserAgent, uaForms) }) {
			switch {
			case hitUAs[ev.UserAgent] == "":
				forwarded++
			case initialRead(&ev):
				upstream++
				t.Errorf("%s: a read the cache answered reached kube-apiserver: %s %s", hitUAs[ev.UserAgent], ev.Verb, ev.RequestURI)
			}
		}
		// The audit log does record this test's forwarded requests, so a
		// hit that went upstream would have shown up.
		if forwarded == 0 {
			t.Errorf("no forwarded request of this test in the audit log; cannot tell hits apart")
		}
		figuref(t, "audit: %d events of forwarded forms; %d of %d cache-answered forms read upstream", forwarded, upstream, len(hitUAs))
	})
}

// initialRead reports whether an audit event is a get, a list or a watch
// that reads more than the events after a resourceVersion the cache
// reached (a watch-list's continuation): one whose resourceVersion is
// unset or "0", or that asks for initial events.
func initialRead(ev *auditv1.Event) bool {
	switch ev.Verb {
	case "get", "list":
		return true
	case "watch":
		u, err := url.ParseRequestURI(ev.RequestURI)
		if err != nil {
			return true
		}
		q := u.Query()
		rv := q.Get("resourceVersion")
		return rv == "" || rv == "0" || q.Has("sendInitialEvents")
	}
	return false
}

// formCases are TestDifferentialForms' requests against the services of
// nsSvcs, svcRV a resourceVersion the cache has reached.
func formCases(nsSvcs, svcRV string) []formCase {
	const (
		jsonMT  = "application/json"
		protoMT = "application/vnd.kubernetes.protobuf"
		asPOM   = ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		asPML   = ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
	)
	get := nsSvcs + "/svc-a"
	var cases []formCase

	// Accept forms, on a cached list and on a cached get.
	for _, a := range []struct {
		name   string
		accept []string
		// listCode and listHit apply to the list; getCode and getHit to
		// the get.
		listCode, getCode int
		listHit, getHit   bool
	}{
		{name: "no Accept", listHit: true, getHit: true},
		{name: "JSON", accept: []string{jsonMT}, listHit: true, getHit: true},
		{name: "JSON q=0.5", accept: []string{jsonMT + ";q=0.5"}, listHit: true, getHit: true},
		{name: "protobuf", accept: []string{protoMT}, listHit: true, getHit: true},
		{name: "protobuf, JSON", accept: []string{protoMT + ", " + jsonMT}, listHit: true, getHit: true},
		{name: "*/*", accept: []string{"*/*"}, listHit: true, getHit: true},
		// kube-apiserver refuses application/*; an agent that read it as
		// JSON answered 200.
		{name: "application/*", accept: []string{"application/*"}, listCode: http.StatusNotAcceptable, getCode: http.StatusNotAcceptable},
		{name: "text/*", accept: []string{"text/*"}},
		{name: "text/plain", accept: []string{"text/plain"}},
		{name: "YAML", accept: []string{"application/yaml"}},
		{name: "JSON charset=utf-8", accept: []string{jsonMT + ";charset=utf-8"}},
		{name: "JSON stream=watch", accept: []string{jsonMT + ";stream=watch"}},
		{name: "Table v1", accept: []string{jsonMT + ";as=Table;g=meta.k8s.io;v=v1"}},
		{name: "kubectl's Table Accept", accept: []string{jsonMT + ";as=Table;v=v1;g=meta.k8s.io," + jsonMT + ";as=Table;v=v1beta1;g=meta.k8s.io," + jsonMT}},
		{name: "PartialObjectMetadataList v1", accept: []string{jsonMT + asPML}, listHit: true},
		{name: "PartialObjectMetadataList v1 protobuf", accept: []string{protoMT + asPML}, listHit: true},
		{name: "PartialObjectMetadataList v1beta1", accept: []string{jsonMT + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1"}},
		{name: "PartialObjectMetadata v1", accept: []string{jsonMT + asPOM}, getHit: true},
		{name: "unknown as", accept: []string{jsonMT + ";as=Bogus;g=meta.k8s.io;v=v1"}},
		{name: "upper case", accept: []string{"APPLICATION/JSON"}},
		{name: "two Accept headers", accept: []string{jsonMT, protoMT}},
		{name: "two Accept headers, protobuf first", accept: []string{protoMT, jsonMT}},
		{name: "trailing comma", accept: []string{jsonMT + ","}},
		{name: "drop=metadata.managedFields", accept: []string{jsonMT + ";drop=metadata.managedFields"}},
	} {
		cases = append(cases,
			formCase{name: "accept/list/" + a.name, path: nsSvcs, accept: a.accept, code: a.listCode, hit: a.listHit},
			formCase{name: "accept/get/" + a.name, path: get, accept: a.accept, code: a.getCode, hit: a.getHit})
	}

	// Odd paths and query parameters, in JSON and in protobuf.
	for _, p := range []struct {
		name string
		path string
		hit  bool
	}{
		{"path/list", nsSvcs, true},
		{"path/list, trailing slash", nsSvcs + "/", false},
		{"path/get, trailing slash", get + "/", false},
		{"path/double slash before the resource", "/api/v1/namespaces/" + cacheNS + "//services", false},
		// RequestInfo trims leading slashes, kube-apiserver's routing
		// does not: its 404, which an agent once answered from its cache.
		{"path/double slash at the start", "/" + nsSvcs, false},
		{"path/double slash at the start of a get", "/" + get, false},
		{"path/encoded slash at the start", "/%2F" + nsSvcs[1:], false},
		{"path/encoded slash after the prefix", "/api%2Fv1/namespaces/" + cacheNS + "/services", false},
		{"path/list, two trailing slashes", nsSvcs + "//", false},
		{"path/get, two trailing slashes", get + "//", false},
		{"path/empty namespace", "/api/v1/namespaces//services", false},
		{"path/double slash before the name", nsSvcs + "//svc-a", false},
		{"path/percent-encoded name", nsSvcs + "/svc%2Da", false},
		{"path/percent-encoded namespace", "/api/v1/namespaces/e2e%2Dcache/services", false},
		{"path/encoded slash in the name", nsSvcs + "/svc-a%2Fstatus", false},
		{"path/dot segment", "/api/v1/namespaces/" + cacheNS + "/./services", false},
		{"path/dot-dot out of another namespace", "/api/v1/namespaces/other/../" + cacheNS + "/services", false},
		{"path/dot-dot out of a name", get + "/../svc-b", false},
		{"path/namespaces, trailing slash", "/api/v1/namespaces/", false},
		{"path/namespace, trailing slash", "/api/v1/namespaces/" + cacheNS + "/", false},
		{"path/cluster-scoped under a namespace", "/api/v1/namespaces/x/nodes", false},
		{"path/this node under a namespace", "/api/v1/namespaces/" + cacheNS + "/nodes/" + sandbox.NodeName, false},
		{"path/unknown resource", "/api/v1/namespaces/" + cacheNS + "/bogus", false},
		{"path/unknown version", "/api/v9/namespaces/" + cacheNS + "/services", false},
		{"path/unknown group version", "/apis/discovery.k8s.io/v9/endpointslices", false},

		{"query/resourceVersion twice, 0 first", nsSvcs + "?resourceVersion=0&resourceVersion=" + svcRV, true},
		{"query/resourceVersion twice, N first", nsSvcs + "?resourceVersion=" + svcRV + "&resourceVersion=0", true},
		{"query/labelSelector twice", nsSvcs + "?labelSelector=tier%3Da&labelSelector=tier%3Db", true},
		{"query/fieldSelector twice", nsSvcs + "?fieldSelector=metadata.name%3Dsvc-a&fieldSelector=metadata.name%3Dsvc-b", true},
		{"query/limit=abc", nsSvcs + "?limit=abc", true},
		{"query/limit=-1", nsSvcs + "?limit=-1", true},
		{"query/limit=0", nsSvcs + "?limit=0", true},
		{"query/resourceVersionMatch without resourceVersion", nsSvcs + "?resourceVersionMatch=NotOlderThan", false},
		{"query/resourceVersionMatch=Bogus", nsSvcs + "?resourceVersion=0&resourceVersionMatch=Bogus", false},
		{"query/watch=0&watch=1 is a list", nsSvcs + "?watch=0&watch=1", false},
		{"query/timeoutSeconds=abc", nsSvcs + "?timeoutSeconds=abc", true},
		{"query/unknown parameter", nsSvcs + "?bogus=1", false},
		{"query/pretty=true", nsSvcs + "?pretty=true", false},
		{"query/pretty=false", nsSvcs + "?pretty=false", false},
		{"query/empty labelSelector", nsSvcs + "?labelSelector=", true},
		{"query/empty fieldSelector", nsSvcs + "?fieldSelector=", true},
		{"query/empty resourceVersion", nsSvcs + "?resourceVersion=", true},
		{"query/resourceVersion=abc", nsSvcs + "?resourceVersion=abc", false},
		{"query/get, resourceVersion twice", get + "?resourceVersion=0&resourceVersion=" + svcRV, true},
		{"query/get, limit", get + "?limit=1", false},
	} {
		for _, accept := range []string{jsonMT, protoMT + ", " + jsonMT} {
			cases = append(cases, formCase{name: p.name + " (" + strings.SplitN(accept, ",", 2)[0] + ")",
				path: p.path, accept: []string{accept}, hit: p.hit})
		}
	}

	// Watches, in JSON and protobuf; timeoutSeconds ends each stream.
	const wl = "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	for _, w := range []struct {
		name     string
		query    string
		code     int
		added    int
		bookmark bool
		hit      bool
	}{
		// A legacy watch from "0" or unset gets initial events (its
		// sendInitialEvents defaults to true), but the initial-events-end
		// BOOKMARK only if it allows bookmarks; an agent that always sent
		// it answered differently.
		{name: "RV=0", query: "&resourceVersion=0", added: 3, hit: true},
		{name: "RV=0, bookmarks", query: "&resourceVersion=0&allowWatchBookmarks=true", added: 3, bookmark: true, hit: true},
		{name: "RV unset", added: 3, hit: true},
		{name: "RV unset, bookmarks", query: "&allowWatchBookmarks=true", added: 3, bookmark: true, hit: true},
		{name: "watch-list", query: wl, added: 3, bookmark: true, hit: true},
		{name: "watch-list from 0", query: wl + "&resourceVersion=0", added: 3, bookmark: true, hit: true},
		{name: "watch-list from N", query: wl + "&resourceVersion=" + svcRV, added: 3, bookmark: true, hit: true},
		{name: "watch-list by label", query: wl + "&labelSelector=tier%21%3Db", added: 2, bookmark: true, hit: true},
		// RequestInfo names the object a metadata.name selector picks: a
		// watch of one object, which the cache serves (only the
		// deprecated /watch/.../<name> path form is forwarded).
		{name: "watch-list by name", query: wl + "&fieldSelector=metadata.name%3Dsvc-b", added: 1, bookmark: true, hit: true},
		{name: "initial events without bookmarks", query: "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", added: 3, hit: true},
		{name: "sendInitialEvents=false from N", query: "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=" + svcRV},
		{name: "sendInitialEvents=false, RV unset", query: "&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"},
		{name: "sendInitialEvents=false alone", query: "&sendInitialEvents=false", code: http.StatusUnprocessableEntity},
		{name: "sendInitialEvents without resourceVersionMatch", query: "&sendInitialEvents=true&allowWatchBookmarks=true", code: http.StatusUnprocessableEntity},
		{name: "plain watch from N", query: "&resourceVersion=" + svcRV + "&allowWatchBookmarks=true"},
		{name: "watch=1&watch=0 is a watch", query: "&watch=0&resourceVersion=0", added: 3, hit: true},
	} {
		code := w.code
		if code == 0 {
			code = http.StatusOK
		}
		for _, accept := range []string{jsonMT, protoMT} {
			cases = append(cases, formCase{name: "watch/" + w.name + " (" + accept + ")",
				path: nsSvcs + "?watch=1&timeoutSeconds=2" + w.query, accept: []string{accept},
				code: code, hit: w.hit, watch: true, added: w.added, bookmark: w.bookmark})
		}
	}
	return cases
}

// doAccepts sends a GET with c, one Accept header per value of accept.
func doAccepts(t *testing.T, ctx context.Context, c rawClient, path string, accept []string, ua string) rawResponse {
	t.Helper()
	if len(accept) <= 1 {
		return c.do(t, ctx, "GET", path, strings.Join(accept, ""), ua, nil)
	}
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header["Accept"] = accept
	req.Header.Set("User-Agent", ua)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", path, err)
	}
	return rawResponse{code: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: b}
}

// cacheOutcome says how the cache took the one request made between two
// reads of its metrics: "cache" (answered, allowed or denied),
// "forwarded/<reason>", or "unseen" (the request never reached the cache).
func cacheOutcome(before, after cacheMetrics) string {
	answered := after.outcomes["hit"] - before.outcomes["hit"] + after.outcomes["denied"] - before.outcomes["denied"]
	if answered > 0 {
		return "cache"
	}
	for reason := range diffOutcomes(before.outcomes, after.outcomes) {
		return "forwarded/" + reason
	}
	return "unseen"
}

// compareForm fails t unless got (through the agent) and want (direct)
// are the same answer, and the same as tc pins.
func compareForm(t *testing.T, tc formCase, got, want rawResponse) {
	t.Helper()
	if got.code != want.code || (tc.code != 0 && want.code != tc.code) {
		t.Errorf("code through the agent %d, direct %d, want %d\nagent:  %q %.2000s\ndirect: %q %.2000s",
			got.code, want.code, tc.code, got.contentType, got.body, want.contentType, want.body)
		return
	}
	if got.contentType != want.contentType {
		t.Errorf("Content-Type through the agent %q, direct %q", got.contentType, want.contentType)
	}
	if !tc.watch || want.code != http.StatusOK {
		if diff := cmp.Diff(normalizeForm(want), normalizeForm(got)); diff != "" {
			t.Errorf("bodies differ (-direct +agent):\n%s", diff)
		}
		return
	}
	wantSeq, err := watchSequence(want)
	if err != nil {
		t.Fatalf("direct watch: %v (after %q)", err, wantSeq)
	}
	gotSeq, err := watchSequence(got)
	if err != nil {
		t.Errorf("watch through the agent: %v (after %q)", err, gotSeq)
	}
	added, bookmark := 0, false
	for _, ev := range wantSeq {
		added += boolInt(strings.HasPrefix(ev, string(watch.Added)))
		bookmark = bookmark || ev == initialEventsEnd
	}
	if added != tc.added || bookmark != tc.bookmark {
		t.Errorf("kube-apiserver sent %d initial ADDED events and initial-events-end bookmark %v, want %d and %v: %q",
			added, bookmark, tc.added, tc.bookmark, wantSeq)
	}
	if diff := cmp.Diff(wantSeq, gotSeq); diff != "" {
		sorted := func(s []string) []string { s = append([]string(nil), s...); sort.Strings(s); return s }
		t.Errorf("watch events differ (-direct +agent); same set in another order: %v\n%s",
			cmp.Equal(sorted(wantSeq), sorted(gotSeq)), diff)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// initialEventsEnd stands for the initial-events-end bookmark in a watch
// sequence.
const initialEventsEnd = "BOOKMARK initial-events-end"

// watchSequence decodes a watch stream, in whatever framing and encoding
// its Content-Type names, into its events up to and including the first
// that is not an initial ADDED event: each ADDED as "ADDED ns/name@rv", the
// initial-events-end bookmark as initialEventsEnd, an ERROR as "ERROR
// reason", any other event by its type. Other bookmarks are left out:
// when they come depends on timing, and they carry no object.
func watchSequence(r rawResponse) ([]string, error) {
	mt, _, err := mime.ParseMediaType(r.contentType)
	if err != nil {
		return nil, err
	}
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), mt)
	if !ok || info.StreamSerializer == nil {
		return nil, fmt.Errorf("no stream decoder for %q", r.contentType)
	}
	frames := info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(r.body)))
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer), scheme.Codecs.UniversalDeserializer())
	var seq []string
	for {
		typ, obj, err := dec.Decode()
		if errors.Is(err, io.EOF) {
			return seq, nil
		}
		if err != nil {
			return seq, err
		}
		switch typ {
		case watch.Error:
			reason := "?"
			if st, ok := obj.(*metav1.Status); ok {
				reason = string(st.Reason)
			}
			return append(seq, "ERROR "+reason), nil
		case watch.Bookmark:
			m, err := meta.Accessor(obj)
			if err != nil {
				return seq, err
			}
			if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				return append(seq, initialEventsEnd), nil
			}
		case watch.Added:
			m, err := meta.Accessor(obj)
			if err != nil {
				return seq, err
			}
			seq = append(seq, fmt.Sprintf("%s %s/%s@%s", typ, m.GetNamespace(), m.GetName(), m.GetResourceVersion()))
		default:
			return append(seq, string(typ)), nil
		}
	}
}

// watchHistory decodes a JSON watch stream into its events up to
// resourceVersion upTo, each as "TYPE Kind namespace/name", and an ERROR as
// "ERROR code reason"; bookmarks and the events after upTo (made while or
// after the streams were read) are left out.
func watchHistory(r rawResponse, upTo uint64) ([]string, error) {
	var seq []string
	dec := json.NewDecoder(bytes.NewReader(r.body))
	for {
		var ev struct {
			Type   string
			Object json.RawMessage
		}
		if err := dec.Decode(&ev); errors.Is(err, io.EOF) {
			return seq, nil
		} else if err != nil {
			return seq, err
		}
		switch ev.Type {
		case string(watch.Bookmark):
			continue
		case string(watch.Error):
			var st metav1.Status
			if err := json.Unmarshal(ev.Object, &st); err != nil {
				return seq, err
			}
			seq = append(seq, fmt.Sprintf("ERROR %d %s", st.Code, st.Reason))
			continue
		}
		var obj metav1.PartialObjectMetadata
		if err := json.Unmarshal(ev.Object, &obj); err != nil {
			return seq, err
		}
		rv, err := strconv.ParseUint(obj.ResourceVersion, 10, 64)
		if err != nil {
			return seq, fmt.Errorf("%s %s/%s: resourceVersion %q: %w", ev.Type, obj.Namespace, obj.Name, obj.ResourceVersion, err)
		}
		if rv <= upTo {
			seq = append(seq, fmt.Sprintf("%s %s %s/%s", ev.Type, obj.Kind, obj.Namespace, obj.Name))
		}
	}
}

// tableAgeRE matches a Table cell holding a human-readable age.
var tableAgeRE = regexp.MustCompile(`^` + ageRE.String() + `$`)

// normalizeForm is what of an answer two answers given moments apart must
// agree on: JSON, YAML and protobuf bodies as generic JSON without a
// list's or Table's own resourceVersion and with a Table's ages replaced;
// any other body as it is.
func normalizeForm(r rawResponse) any {
	mt, _, _ := mime.ParseMediaType(r.contentType)
	var m map[string]any
	switch mt {
	case runtime.ContentTypeJSON:
		if json.Unmarshal(r.body, &m) != nil {
			return string(r.body)
		}
	case runtime.ContentTypeYAML:
		b, err := yaml.YAMLToJSON(r.body)
		if err != nil || json.Unmarshal(b, &m) != nil {
			return string(r.body)
		}
	case runtime.ContentTypeProtobuf:
		for _, d := range []runtime.Decoder{scheme.Codecs.UniversalDeserializer(), metaCodecs.UniversalDeserializer()} {
			obj, gvk, err := d.Decode(r.body, nil, nil)
			if err != nil {
				continue
			}
			b, err := json.Marshal(obj)
			if err != nil || json.Unmarshal(b, &m) != nil {
				continue
			}
			m["kind"], m["apiVersion"] = gvk.Kind, gvk.GroupVersion().String()
			break
		}
		if m == nil {
			return fmt.Sprintf("undecodable %s: %x", r.contentType, r.body)
		}
	default:
		return string(r.body)
	}
	dropListRV(m)
	kind, _ := m["kind"].(string)
	if kind == "Table" || strings.HasSuffix(kind, "List") {
		if md, ok := m["metadata"].(map[string]any); ok {
			delete(md, "resourceVersion")
		}
	}
	if rows, ok := m["rows"].([]any); ok && kind == "Table" {
		for _, row := range rows {
			cells, _ := row.(map[string]any)["cells"].([]any)
			for i, cell := range cells {
				if s, ok := cell.(string); ok && tableAgeRE.MatchString(s) {
					cells[i] = "<age>"
				}
			}
		}
	}
	return m
}
