package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// consistentCase is the name -cases selects the consistent-read case by.
const consistentCase = "consistent reads"

// consistentInflight are the consistent readers in flight the case
// measures at.
var consistentInflight = []int{1, 4, 16, 64}

// consistentRow is one in-flight level of the consistent-read case.
type consistentRow struct {
	inflight      int
	agent, direct result
	probes        float64
}

// consistentReads measures the node-pod list with resourceVersion unset
// (a consistent read, answered by the agent after a probe: probe.go in the
// cache) at several readers in flight, through the agent and direct.
func (b *bench) consistentReads(ctx context.Context, m *measurer) ([]consistentRow, error) {
	if !b.o.cases.MatchString(consistentCase) {
		return nil, nil
	}
	path := "/api/v1/pods?fieldSelector=" + url.QueryEscape("spec.nodeName="+sandbox.NodeName)
	var rows []consistentRow
	for _, n := range consistentInflight {
		bc := benchCase{name: fmt.Sprintf("%s, %d in flight", consistentCase, n), path: path, inflight: n}
		before, err := b.probes(ctx)
		if err != nil {
			return nil, err
		}
		agent, err := m.measure(ctx, bc, true)
		if err != nil {
			return nil, err
		}
		after, err := b.probes(ctx)
		if err != nil {
			return nil, err
		}
		direct, err := m.measure(ctx, bc, false)
		if err != nil {
			return nil, err
		}
		logf("%s: agent p50 %v, direct p50 %v", bc.name, agent.p50, direct.p50)
		rows = append(rows, consistentRow{inflight: n, agent: agent, direct: direct, probes: after - before})
	}
	return rows, nil
}

// probes returns the agent's consistent-read probes so far.
func (b *bench) probes(ctx context.Context) (float64, error) {
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	var n float64
	for k, v := range scrape(text, "kube_apicache_cache_consistent_probes_total") {
		if strings.HasPrefix(k, "kube_apicache_cache_consistent_probes_total") {
			n += v
		}
	}
	return n, nil
}

func printConsistent(rows []consistentRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Printf("\n%s: list of the node's pods with resourceVersion unset, --cache-consistent-reads=probe (targets at 16 in flight: p50 <= 0.6x direct, kube-apiserver CPU <= 0.1x direct)\n", consistentCase)
	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "in flight\tp50 agent\tp50 direct\tp50 ratio\tp99 agent\tp99 direct\tp99 ratio\tapiserver CPU-s agent\tdirect\tCPU ratio\tupstream/1k agent\tprobes/1k\tdirect/1k\terrors\t")
	for _, r := range rows {
		cpu := 0.0
		if r.direct.apiserverS > 0 {
			cpu = r.agent.apiserverS / r.direct.apiserverS
		}
		fmt.Fprintf(out, "%d\t%v\t%v\t%.3f\t%v\t%v\t%.3f\t%.2f\t%.2f\t%.3f\t%.1f\t%.1f\t%.1f\t%d/%d\t\n", r.inflight,
			r.agent.p50, r.direct.p50, ratio(r.agent.p50, r.direct.p50),
			r.agent.p99, r.direct.p99, ratio(r.agent.p99, r.direct.p99),
			r.agent.apiserverS, r.direct.apiserverS, cpu,
			perK(float64(r.agent.upstream), r.agent.requests), perK(r.probes, r.agent.requests), perK(float64(r.direct.upstream), r.direct.requests),
			r.agent.errors, r.direct.errors)
	}
	_ = out.Flush()
	for _, r := range rows {
		if r.agent.upstreamDet != "" {
			fmt.Printf("upstream requests at %d in flight through the agent: %s\n", r.inflight, r.agent.upstreamDet)
		}
	}
}
