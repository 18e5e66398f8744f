package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
)

// TestResultsFile: given the results of every case, the results file holds
// each case's figures under its key, and a chart is written for each
// latency CDF and for the storm's timeline.
func TestResultsFile(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	rep, ch := newReport(options{pods: 10, nodePods: 2, services: 3, requests: 4, inflight: 1}), &charts{}
	agent := result{p50: time.Millisecond, p99: 2 * time.Millisecond, requests: 4, apiserverS: 0.01, upstream: 1, samples: ms(1, 1, 2, 2)}
	direct := result{p50: 2 * time.Millisecond, p99: 4 * time.Millisecond, requests: 4, apiserverS: 0.1, samples: ms(2, 2, 4, 4)}
	rep.Reads = append(rep.Reads, readOf("list node pods, RV=0", agent, direct))
	ch.cdf("list node pods, RV=0", map[string][]time.Duration{"agent": agent.samples, "direct": direct.samples})
	ch.storm = map[string][]time.Duration{"agent": ms(100, 200), "direct": ms(300, 900)}
	w := &writesResult{perVerb: 2, block: 1, inflight: 1,
		agent:  &writePath{latencies: map[string][]time.Duration{}, errors: map[string]int{}, requests: 8, apiserverS: 0.01},
		direct: &writePath{latencies: map[string][]time.Duration{}, errors: map[string]int{}, requests: 8, apiserverS: 0.01}}
	for _, verb := range writeVerbs {
		w.agent.latencies[verb], w.direct.latencies[verb] = ms(4, 5), ms(3, 4)
	}
	w.report(rep, ch)
	lat := &latencyResult{agent: ms(1, 2), direct: ms(1, 1), diffs: ms(0, 1), agentAck: ms(0, 1), directAck: ms(0, 0)}
	(&watchResults{latency: lat}).report(rep)
	(&stalenessResult{agent: ms(1, 2), direct: ms(1, 1), staleAgent: 1, watch: lat}).report(rep, ch)
	(&idleResult{took: time.Minute, requests: map[string]int{"agent get pods": 1}}).report(rep)
	(&sizingResult{n: 1, perService: 900}).report(rep)
	rw := &rewriteIdleResult{perRequest: 2, blocks: 1, inflight: 1, requests: []rewriteRequest{{name: "get configmap (forwarded)", path: "/api/v1/x"}},
		without: newRewriteSide(), with: newRewriteSide()}
	rw.without.latencies["get configmap (forwarded)"], rw.with.latencies["get configmap (forwarded)"] = ms(2, 4, 4), ms(2, 4, 5)
	rw.without.blockP50s["get configmap (forwarded)"], rw.with.blockP50s["get configmap (forwarded)"] = ms(2), ms(2)
	rw.report(rep, ch)
	var nilWrites *writesResult
	nilWrites.report(rep, ch) // a case that did not run adds nothing
	var nilRewrite *rewriteIdleResult
	nilRewrite.report(rep, ch)

	dir := benchplot.Dir(t.TempDir())
	if err := ch.write(dir, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(string(dir), resultsFile))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"date", "commit", "machine", "setup", "reads", "writes", "staleness", "watchEventLatency", "idle", "sizing", "rewriteIdle"} {
		if _, ok := got[key]; !ok {
			t.Errorf("results file has no %q: %s", key, b)
		}
	}
	for _, key := range []string{"storm", "coldStart", "natSync"} {
		if _, ok := got[key]; ok {
			t.Errorf("results file has %q for a case that did not run", key)
		}
	}
	if r := got["writes"].(map[string]any)["verbs"].([]any)[0].(map[string]any); r["verb"] != "create" || r["p50Ratio"].(float64) <= 1 {
		t.Errorf("writes: first verb %v, want create with agent slower than direct", r)
	}
	if r := got["rewriteIdle"].(map[string]any)["requests"].([]any)[0].(map[string]any); r["p50Ratio"].(float64) != 1 || r["p99Ratio"].(float64) != 1.25 {
		t.Errorf("rewriteIdle: first request %v, want p50 ratio 1 and p99 ratio 1.25 (with profiles over without)", r)
	}
	for _, name := range []string{"cdf-list-node-pods-rv-0.png", "cdf-writes-delete.png", "cdf-staleness-after-a-direct-write.png", "cdf-rewrite-idle-get-configmap-forwarded.png", "storm-timeline.png"} {
		if _, err := os.Stat(filepath.Join(string(dir), name)); err != nil {
			t.Errorf("chart: %v", err)
		}
	}
}
