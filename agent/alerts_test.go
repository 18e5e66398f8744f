package agent

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// metricRef matches a metric of the project in a PromQL expression.
var metricRef = regexp.MustCompile(`\bkube_apicache_[a-zA-Z0-9_]+`)

// TestAlertRules: every kube_apicache_* metric the shipped alert rules
// (manifests/monitoring/prometheusrule.yaml) query is one the agent
// registers (a histogram's _bucket, _sum and _count series included),
// so a renamed metric cannot leave an alert that never fires; and the
// README lists every alert.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile("../manifests/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	// Only the fields above matter: labels, annotations and for are
	// left out.
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("kind %q, want PrometheusRule", rule.Kind)
	}
	registered := registeredNames(t, newAgentFromNew(t).metrics.registry)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts, used []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("rule %+v: want an alert with an expr", r)
				continue
			}
			alerts = append(alerts, r.Alert)
			if !strings.Contains(string(readme), "`"+r.Alert+"`") {
				t.Errorf("README.md does not list the alert %s", r.Alert)
			}
			for _, name := range metricRef.FindAllString(r.Expr, -1) {
				used = append(used, name)
				if !registered[name] && !registered[histogramBase(name)] {
					t.Errorf("alert %s queries %s, which the agent does not register", r.Alert, name)
				}
			}
		}
	}
	slices.Sort(used)
	used = slices.Compact(used)
	t.Logf("%d alerts %v query %v", len(alerts), alerts, used)
	if len(alerts) < 5 || len(used) < 5 {
		t.Errorf("only %d alerts querying %d of the agent's metrics: the rules were not read", len(alerts), len(used))
	}
}

// histogramBase returns the histogram or summary name a series name
// belongs to (name without _bucket, _sum or _count), or "".
func histogramBase(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base
		}
	}
	return ""
}
