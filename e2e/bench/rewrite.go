package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The "rewrite idle" case measures what rewrite profiles cost the callers
// they do not select (docs/concepts/rewriting.md): for such a caller an
// agent with profiles takes one unverified look at its bearer token's
// "sub" claim on /api and /apis paths (agent/rewriting/jwt.go), and an
// agent without profiles nothing at all. The client pod, with its own
// token, sends the same requests through the Service VIP to an agent
// started as the bench starts it and to one started the same way with
// --rewrite-config, whose one profile selects a ServiceAccount that exists
// nowhere: a get of a ConfigMap (not cached: forwarded) and a get of a pod
// on the node with resourceVersion=0 (answered from the cache; the
// cheapest request the agent serves, where a fixed cost per request shows
// most). The two agents share the node's listen address, so they cannot
// run at once: the case runs in blocks, each agent in turn, the agent
// restarted before every block, each block warmed up and then measured,
// and which agent goes first alternates by round, as in the writes case.
var rewriteRequests = flag.Int("rewrite-requests", 400, "measured requests per request and agent of the \""+rewriteIdleCase+"\" case, in "+fmt.Sprint(rewriteBlocks)+" blocks per agent (0 skips it)")

const (
	rewriteIdleCase = "rewrite idle"
	// rewriteP50Target is the most an unselected caller's request may
	// take at p50 through an agent with a rewrite profile, as a multiple
	// of the same request through an agent without. The profile's own
	// cost, a base64 and a JSON decode of the token's claims, should be
	// microseconds on requests of half a millisecond or more, under 1%;
	// the target allows 5% because the two agents' blocks run
	// seconds apart on two shared cores that kube-apiserver, etcd and the
	// client keep busy, each after a restart of the agent, and two runs of
	// the writes case have differed by up to 0.08 in their p50 ratios
	// (docs/development/benchmarks.md). A miss is a reason to look at the
	// blocks' p50s and the agent's CPU per request, not yet proof of a
	// cost.
	rewriteP50Target = 1.05
	// rewriteBlocks is how many blocks each agent runs.
	rewriteBlocks = 4
	// rewriteConfigMap is the ConfigMap the case reads, in benchNS.
	rewriteConfigMap = "bench-rewrite-idle"
	// rewriteProfileSelects is the ServiceAccount the profile selects:
	// none of the bench's callers.
	rewriteProfileSelects = "e2e-bench-none/nobody"
	// rewriteProfilesLoaded is what an agent logs once its rewrite
	// profiles passed their checks against the cluster
	// (agent/rewriting/setup.go).
	rewriteProfilesLoaded = "Rewrite profiles checked against the cluster"
)

// rewriteIdleProfile is the RewriteConfiguration of the agent with
// profiles: one profile, renaming example.com, that selects only
// rewriteProfileSelects.
const rewriteIdleProfile = `apiVersion: config.kube-apicache.io/v1alpha1
kind: RewriteConfiguration
profiles:
- name: bench-nobody
  selector:
    serviceAccounts: [` + rewriteProfileSelects + `]
  groups:
  - from: example.com
    to: renamed.example.io
  kindPrefix: Renamed
`

// rewriteRequest is one of the case's requests.
type rewriteRequest struct {
	name, path string
	// cached is set for a request the agent answers from its cache.
	cached bool
}

// rewriteSide is the case's requests through one of the two agents, by
// request name: the measured latencies (sorted once the case is done),
// each block's p50, the errors and the agent's CPU-seconds over the
// measured requests.
type rewriteSide struct {
	latencies map[string][]time.Duration
	blockP50s map[string][]time.Duration
	errors    map[string]int
	lastErr   error
	agentS    map[string]float64
	requests  map[string]int
}

func newRewriteSide() *rewriteSide {
	return &rewriteSide{latencies: map[string][]time.Duration{}, blockP50s: map[string][]time.Duration{},
		errors: map[string]int{}, agentS: map[string]float64{}, requests: map[string]int{}}
}

func (s *rewriteSide) p(request string, pct int) time.Duration {
	return pctOf(s.latencies[request], pct).Round(10 * time.Microsecond)
}

// rewriteIdleResult is the rewrite idle case through both agents.
type rewriteIdleResult struct {
	perRequest, blocks, inflight int
	requests                     []rewriteRequest
	// without is the agent without profiles, with the one with the
	// profile.
	without, with *rewriteSide
}

// rewriteIdle runs the rewrite idle case, if selected: rounds of one block
// per agent until each request has n measured per agent. It leaves the
// bench's agent running as the bench started it (--profiling and
// probeBudgetOff, no profiles).
func (b *bench) rewriteIdle(ctx context.Context, m *measurer, agentBin string) (*rewriteIdleResult, error) {
	n := *rewriteRequests
	if n <= 0 || !b.o.cases.MatchString(rewriteIdleCase) {
		return nil, nil
	}
	profile := filepath.Join(b.dir, "rewrite-idle.yaml")
	if err := os.WriteFile(profile, []byte(rewriteIdleProfile), 0o644); err != nil {
		return nil, fmt.Errorf("writing the rewrite profile: %w", err)
	}
	// The client pod may get ConfigMaps in its namespace.
	if err := b.grantConfigMapWrites(ctx); err != nil {
		return nil, fmt.Errorf("granting ConfigMap reads: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: rewriteConfigMap, Labels: map[string]string{"app.kubernetes.io/part-of": "kube-apicache-bench"}},
		Data:       map[string]string{"payload": strings.Repeat("x", writePayload)},
	}
	if _, err := b.c.Admin.CoreV1().ConfigMaps(benchNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ConfigMap %s: %w", rewriteConfigMap, err)
	}
	r := &rewriteIdleResult{
		perRequest: n, blocks: rewriteBlocks, inflight: b.o.inflight,
		requests: []rewriteRequest{
			{name: "get configmap (forwarded)", path: "/api/v1/namespaces/" + benchNS + "/configmaps/" + rewriteConfigMap},
			{name: "get pod, RV=0 (cached)", path: "/api/v1/namespaces/" + benchNS + "/pods/" + b.firstNodePod + "?resourceVersion=0", cached: true},
		},
		without: newRewriteSide(), with: newRewriteSide(),
	}
	logf("%s: %d of each request per agent, without profiles and with one selecting %s, %d blocks per agent, %d in flight",
		rewriteIdleCase, n, rewriteProfileSelects, rewriteBlocks, b.o.inflight)

	sides := map[bool]*rewriteSide{false: r.without, true: r.with}
	flags := map[bool][]string{false: probeBudgetOff, true: slices.Concat(probeBudgetOff, []string{"--rewrite-config=" + profile})}
	perBlock := (n + rewriteBlocks - 1) / rewriteBlocks
	// withRunning tells which of the two agents the last block left
	// running.
	withRunning := false
	for round, done := 0, 0; done < n; round++ {
		k := min(perBlock, n-done)
		order := []bool{false, true}
		if round%2 == 1 {
			order = []bool{true, false}
		}
		for _, with := range order {
			if err := b.rewriteBlock(ctx, m, agentBin, flags[with], with, r.requests, k, sides[with]); err != nil {
				return nil, fmt.Errorf("round %d, agent %s: %w", round, rewriteSideName(with), err)
			}
			withRunning = with
		}
		done += k
	}
	if withRunning {
		// The bench's agent again, as it started it.
		if err := b.replaceAgent(ctx, agentBin, probeBudgetOff...); err != nil {
			return nil, fmt.Errorf("restarting the bench's agent: %w", err)
		}
		if err := b.waitCached(ctx, "pods", b.o.nodePods); err != nil {
			return nil, err
		}
	}
	if err := b.waitCached(ctx, "services", b.o.services); err != nil {
		return nil, err
	}

	for _, s := range sides {
		for _, rq := range r.requests {
			slices.Sort(s.latencies[rq.name])
			if len(s.latencies[rq.name]) == 0 {
				return nil, fmt.Errorf("every %s failed: %v", rq.name, s.lastErr)
			}
		}
	}
	for _, rq := range r.requests {
		logf("%s: %s p50 without profiles %v, with %v", rewriteIdleCase, rq.name, r.without.p(rq.name, 50), r.with.p(rq.name, 50))
	}
	return r, nil
}

func rewriteSideName(with bool) string {
	if with {
		return "with profiles"
	}
	return "without profiles"
}

// rewriteBlock replaces the running agent with one started with
// --profiling and extra, waits until it has cached the node's pods, and
// sends each request: a warm-up, then k measured, recorded in side with
// the agent's CPU-seconds over them. It then checks from the agent's
// metrics that the requests reached it, and from its log that it runs
// with profiles exactly when with is set.
func (b *bench) rewriteBlock(ctx context.Context, m *measurer, agentBin string, extra []string, with bool, reqs []rewriteRequest, k int, side *rewriteSide) error {
	logOffset, err := fileSize(b.agent.Process.LogFile)
	if err != nil {
		return err
	}
	if err := b.replaceAgent(ctx, agentBin, extra...); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	if err := b.waitCached(ctx, "pods", b.o.nodePods); err != nil {
		return err
	}
	logText, err := os.ReadFile(b.agent.Process.LogFile)
	if err != nil {
		return fmt.Errorf("reading the agent's log: %w", err)
	}
	if loaded := int64(len(logText)) > logOffset && strings.Contains(string(logText[logOffset:]), rewriteProfilesLoaded); loaded != with {
		return fmt.Errorf("the agent started with %v; it logged %q: %v", extra, rewriteProfilesLoaded, loaded)
	}
	// Connections opened while no agent intercepted go straight to
	// kube-apiserver: the block opens its own to this agent.
	m.agentClient.CloseIdleConnections()
	pid := b.agent.Process.Pid()
	warmup := max(b.o.warmup, 1)
	for _, rq := range reqs {
		get := m.requester(benchCase{name: rewriteIdleCase + ", " + rq.name, path: rq.path}, true)
		for range warmup {
			if _, err := get(ctx); err != nil {
				return fmt.Errorf("warm-up of %s: %w", rq.name, err)
			}
		}
		cpu0 := m.cpu(pid)
		durs, errs, lastErr := sendAll(ctx, get, k, b.o.inflight)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		side.agentS[rq.name] += m.cpu(pid) - cpu0
		side.requests[rq.name] += k
		side.errors[rq.name] += errs
		if errs > 0 {
			side.lastErr = lastErr
		}
		side.latencies[rq.name] = append(side.latencies[rq.name], durs...)
		slices.Sort(durs)
		side.blockP50s[rq.name] = append(side.blockP50s[rq.name], pctOf(durs, 50))
	}
	return b.checkRewriteBlock(ctx, reqs, warmup+k)
}

// checkRewriteBlock checks, from the metrics of an agent that has served
// nothing but a block of the rewrite idle case, that it forwarded or
// answered from its cache each of sent requests as the request expects,
// and rewrote none: the profile selects no caller of the bench.
func (b *bench) checkRewriteBlock(ctx context.Context, reqs []rewriteRequest, sent int) error {
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return err
	}
	sum := func(name string, labels ...string) float64 {
		var n float64
		for k, v := range scrape(text, name) {
			if !strings.HasPrefix(k, name+"{") {
				continue
			}
			all := true
			for _, l := range labels {
				all = all && strings.Contains(k, l)
			}
			if all {
				n += v
			}
		}
		return n
	}
	var forwarded, cached int
	for _, rq := range reqs {
		if rq.cached {
			cached += sent
		} else {
			forwarded += sent
		}
	}
	if got := sum("kube_apicache_requests_total", `handler="forward"`); got < float64(forwarded) {
		return fmt.Errorf("the agent forwarded %.0f requests, want at least the block's %d: did its requests reach it?", got, forwarded)
	}
	if got := sum("kube_apicache_cache_requests_total", `outcome="hit"`); got < float64(cached) {
		return fmt.Errorf("the agent's cache answered %.0f requests, want at least the block's %d", got, cached)
	}
	if got := sum("kube_apicache_rewrite_requests_total"); got > 0 {
		return fmt.Errorf("the agent rewrote %.0f requests: its profile selects a caller of the bench", got)
	}
	return nil
}

func (r *rewriteIdleResult) print() {
	fmt.Printf("\n%s: the client pod's requests, with its own token, through an agent without rewrite profiles and one whose profile selects only %s; %d measured per request and agent in %d blocks per agent, the agent restarted before each block, which goes first alternating, %d in flight (target: p50 at most %.2f× without)\n",
		rewriteIdleCase, rewriteProfileSelects, r.perRequest, r.blocks, r.inflight, rewriteP50Target)
	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "request\tp50 without\tp50 with\tp50 ratio\tp99 without\tp99 with\tp99 ratio\tagent CPU-s/1k without\twith\terrors\t")
	for _, rq := range r.requests {
		w, p := r.without, r.with
		fmt.Fprintf(out, "%s\t%v\t%v\t%.3f\t%v\t%v\t%.3f\t%.3f\t%.3f\t%d/%d\t\n", rq.name,
			w.p(rq.name, 50), p.p(rq.name, 50), ratio(p.p(rq.name, 50), w.p(rq.name, 50)),
			w.p(rq.name, 99), p.p(rq.name, 99), ratio(p.p(rq.name, 99), w.p(rq.name, 99)),
			perK(w.agentS[rq.name], w.requests[rq.name]), perK(p.agentS[rq.name], p.requests[rq.name]),
			w.errors[rq.name], p.errors[rq.name])
	}
	_ = out.Flush()
	for _, rq := range r.requests {
		fmt.Printf("  %s, p50 by block: without %v, with %v\n", rq.name,
			roundAllTo(r.without.blockP50s[rq.name], 10*time.Microsecond), roundAllTo(r.with.blockP50s[rq.name], 10*time.Microsecond))
	}
	for _, rq := range r.requests {
		rt := ratio(r.with.p(rq.name, 50), r.without.p(rq.name, 50))
		word := "meets"
		if rt > rewriteP50Target {
			word = "misses"
		}
		fmt.Printf("%s: %s p50 with/without profiles %.3f× (target at most %.2f×): %s\n", rewriteIdleCase, rq.name, rt, rewriteP50Target, word)
	}
}

func roundAllTo(s []time.Duration, to time.Duration) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, d := range s {
		out[i] = d.Round(to)
	}
	return out
}
