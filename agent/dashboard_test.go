package agent

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboardPanel is the part of a Grafana panel the test reads; a row's
// panels are nested when it is collapsed.
type dashboardPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// dashboardVariable matches a reference to a dashboard variable ($name
// or ${name}).
var dashboardVariable = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)

// dashboardMetrics are the metrics the dashboard must show (the share of
// agents intercepting and degraded, the hit ratio, requests, latency,
// upstream health, rejections, consistent-read probes).
var dashboardMetrics = []string{
	"kube_apicache_intercepting",
	"kube_apicache_degraded",
	"kube_apicache_cache_requests_total",
	"kube_apicache_requests_total",
	"kube_apicache_request_duration_seconds_bucket",
	"kube_apicache_upstream_endpoint_healthy",
	"kube_apicache_rejected_requests_total",
	"kube_apicache_cache_consistent_probes_total",
}

// TestDashboard: every kube_apicache_* metric the Grafana dashboard
// (manifests/monitoring/dashboard.json) queries is one the agent
// registers, as TestAlertRules checks for the alerts; every panel but a
// row has a query; every variable a query uses is defined; and the
// dashboard shows dashboardMetrics.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("../manifests/monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string           `json:"uid"`
		Title      string           `json:"title"`
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("uid %q, title %q: want both", dash.UID, dash.Title)
	}
	defined := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range dash.Templating.List {
		defined[v.Name] = true
	}
	registered := registeredNames(t, newAgentFromNew(t).metrics.registry)
	var used []string
	queries := 0
	var walk func([]dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				queries++
				if strings.TrimSpace(q.Expr) == "" {
					t.Errorf("panel %q has an empty query", p.Title)
				}
				for _, m := range dashboardVariable.FindAllStringSubmatch(q.Expr, -1) {
					if !defined[m[1]] {
						t.Errorf("panel %q uses $%s, which the dashboard does not define", p.Title, m[1])
					}
				}
				for _, name := range metricRef.FindAllString(q.Expr, -1) {
					used = append(used, name)
					if !registered[name] && !registered[histogramBase(name)] {
						t.Errorf("panel %q queries %s, which the agent does not register", p.Title, name)
					}
				}
			}
		}
	}
	walk(dash.Panels)
	slices.Sort(used)
	used = slices.Compact(used)
	t.Logf("%d queries use %v", queries, used)
	for _, m := range dashboardMetrics {
		if !slices.Contains(used, m) {
			t.Errorf("no panel queries %s", m)
		}
	}
}
