package main

import (
	"strings"
	"testing"
)

const (
	eventsSpec = "[sig-instrumentation] Events API should ensure that an event can be fetched, patched, deleted, and listed [Conformance]"
	csrSpec    = "[sig-auth] Certificates API [Privileged:ClusterAdmin] should support building a client with a CSR"
	otherSpec  = "[sig-api-machinery] ResourceQuota should create a ResourceQuota and ensure its status is promptly calculated. [Conformance]"
)

// TestWriteResults: the exit code of each comparison, and the line that
// explains it.
func TestWriteResults(t *testing.T) {
	runs := []Run{{Name: "direct"}, {Name: "agent", ViaAgent: true}}
	selected := []string{eventsSpec, csrSpec, otherSpec}
	passed := func(specs ...string) map[string]SpecResult {
		m := map[string]SpecResult{}
		for _, s := range specs {
			m[s] = SpecResult{State: "passed"}
		}
		return m
	}
	throughAgent := map[string]float64{"hit": 10, "forwarded": 50}
	for _, tc := range []struct {
		name          string
		direct, agent map[string]SpecResult
		cache         map[string]float64
		wantCode      int
		want          string
	}{
		{
			// Every spec passes both ways, with cache hits: success.
			name:   "equal",
			direct: passed(selected...), agent: passed(selected...), cache: throughAgent,
			wantCode: 0, want: "3 specs, passed through the agent = passed directly (3)",
		},
		{
			// A spec passes directly and fails through the agent.
			name:   "regression",
			direct: passed(selected...), agent: passed(eventsSpec, csrSpec), cache: throughAgent,
			wantCode: 1, want: "passed directly, not through the agent (1)",
		},
		{
			// Equal results, but the cache answered nothing: the agent
			// run may not have gone through the cache at all.
			name:   "no cache hits",
			direct: passed(selected...), agent: passed(selected...), cache: map[string]float64{"forwarded": 50},
			wantCode: 1, want: "the agent answered no request from its cache",
		},
		{
			// Equal results, but nothing went through the agent.
			name:   "nothing forwarded",
			direct: passed(selected...), agent: passed(selected...), cache: map[string]float64{"hit": 3},
			wantCode: 1, want: "the agent forwarded no request",
		},
		{
			// A required spec fails in both runs: equal, yet it proves
			// nothing about the bug it guards.
			name:   "required spec fails in both",
			direct: passed(eventsSpec, otherSpec), agent: passed(eventsSpec, otherSpec), cache: throughAgent,
			wantCode: 1, want: "required spec",
		},
		{
			// Nothing passes anywhere: a broken sandbox, not equality.
			name:   "nothing passed",
			direct: map[string]SpecResult{}, agent: map[string]SpecResult{}, cache: throughAgent,
			wantCode: 1, want: "no spec passed directly",
		},
		{
			// An ordinary spec failing in both runs is reported, not fatal.
			name:   "ordinary spec fails in both",
			direct: passed(eventsSpec, csrSpec), agent: passed(eventsSpec, csrSpec), cache: throughAgent,
			wantCode: 0, want: "passed in neither run (specs.txt may need an entry) (1)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results := map[string]*RunResult{
				"direct": {Results: tc.direct, Cache: map[string]float64{}},
				"agent":  {Results: tc.agent, Cache: tc.cache},
			}
			var w strings.Builder
			code := writeResults(&w, runs, results, selected)
			if code != tc.wantCode || !strings.Contains(w.String(), tc.want) {
				t.Errorf("exit code %d, want %d; report (want %q in it):\n%s", code, tc.wantCode, tc.want, w.String())
			}
		})
	}
}

// TestRequiredSpecsSelected: the checked-in selection keeps the specs that
// found the agent's bugs, and missingRequired notices when one goes.
func TestRequiredSpecsSelected(t *testing.T) {
	sel, err := ParseSelection(specsFile)
	if err != nil {
		t.Fatal(err)
	}
	candidates := []string{eventsSpec, csrSpec, otherSpec,
		"[sig-node] Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe [NodeConformance] [Conformance]"}
	applied := sel.Apply(candidates)
	if missing := missingRequired(applied.Selected); len(missing) > 0 {
		t.Errorf("specs.txt leaves out %q; selected %q", missing, applied.Selected)
	}
	if len(applied.Selected) != 3 {
		t.Errorf("selected %q, want the three API-only specs (the probe spec needs a kubelet)", applied.Selected)
	}
	if missing := missingRequired([]string{otherSpec}); len(missing) != 2 {
		t.Errorf("missingRequired(one unrelated spec) = %q, want both required expressions", missing)
	}
}
