package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// metricSample is one gauge or counter sample of a metric family.
type metricSample struct {
	labels map[string]string
	value  float64
}

// parseMetrics parses metrics in the Prometheus text format into the
// gauge and counter samples of each family, by family name. Samples of
// other types (histograms, summaries) are left out.
func parseMetrics(t *testing.T, text string) map[string][]metricSample {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	out := map[string][]metricSample{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			default:
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], metricSample{labels: labels, value: v})
		}
	}
	return out
}

// scrapeAgent reads the agent's metrics and parses them as parseMetrics
// does.
func scrapeAgent(t *testing.T, ctx context.Context, a *sandbox.Agent) map[string][]metricSample {
	t.Helper()
	text, err := a.Metrics(ctx)
	if err != nil {
		t.Fatalf("reading agent metrics: %v", err)
	}
	return parseMetrics(t, text)
}

// sumBy sums samples by the value of label; samples without that label are
// left out.
func sumBy(samples []metricSample, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range samples {
		if v, ok := s.labels[label]; ok {
			out[v] += s.value
		}
	}
	return out
}

// sumWhere sums the samples whose labels have every value in match.
func sumWhere(samples []metricSample, match map[string]string) float64 {
	var n float64
next:
	for _, s := range samples {
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		n += s.value
	}
	return n
}

// agentMetrics returns the agent's gauges and counters, summed over labels.
func agentMetrics(t *testing.T, ctx context.Context, a *sandbox.Agent) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for name, samples := range scrapeAgent(t, ctx, a) {
		for _, s := range samples {
			out[name] += s.value
		}
	}
	return out
}

// agentRequests sums kube_apicache_requests_total by verb.
func agentRequests(t *testing.T, ctx context.Context, a *sandbox.Agent) map[string]float64 {
	t.Helper()
	return sumBy(scrapeAgent(t, ctx, a)["kube_apicache_requests_total"], "verb")
}

// agentHandlerRequests sums kube_apicache_requests_total for one handler
// and verb.
func agentHandlerRequests(t *testing.T, ctx context.Context, a *sandbox.Agent, handler, verb string) float64 {
	t.Helper()
	return sumWhere(scrapeAgent(t, ctx, a)["kube_apicache_requests_total"], map[string]string{"handler": handler, "verb": verb})
}

// gaugeValue returns the value of an unlabelled gauge in metrics text.
func gaugeValue(t *testing.T, text, name string) float64 {
	t.Helper()
	samples := parseMetrics(t, text)[name]
	if len(samples) != 1 {
		t.Fatalf("metric %s missing", name)
	}
	return samples[0].value
}
