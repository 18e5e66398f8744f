package alerttest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"
)

// scrapeInterval is the PodMonitor's.
const scrapeInterval = 30 * time.Second

// loadRules reads the PrometheusRule's groups and checks them as
// Prometheus would load them (expressions, durations, templates).
func loadRules(t *testing.T) map[string]rulefmt.Rule {
	t.Helper()
	raw, err := os.ReadFile("../../manifests/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	file, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(file, false, model.UTF8Validation, parser.NewParser(parser.Options{}), nil)
	for _, err := range errs {
		t.Errorf("prometheusrule.yaml: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	byName := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			byName[r.Alert] = r
		}
	}
	return byName
}

// agent is one node's agent in a synthetic fleet: the value series of its
// metrics, in promqltest's notation, one sample per scrape interval.
type agent map[string]string

// fleet returns n agents, intercepting with two healthy endpoints, not
// degraded; bad changes the first affected ones as a scenario needs.
func fleet(n, affected int, bad func(a agent)) []agent {
	agents := make([]agent, n)
	for i := range agents {
		agents[i] = agent{
			"kube_apicache_intercepting":          "1x80",
			"kube_apicache_ready":                 "1x80",
			"kube_apicache_interception_disabled": "0x80",
			"kube_apicache_degraded":              "0x80",
			`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.1:6443"}`: "1x80",
			`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.2:6443"}`: "1x80",
			`kube_apicache_local_pods_source{source="node"}`:                             "1x80",
			`kube_apicache_local_pods_source{source="agent"}`:                            "0x80",
			`kube_apicache_local_pods_source{source="none"}`:                             "0x80",
			"up": "1x80",
		}
		if i < affected {
			bad(agents[i])
		}
	}
	return agents
}

// load renders agents as promqltest's load command, with the labels a
// scrape by the PodMonitor gives (job and namespace as in the shipped
// manifests: the rules must not depend on them). The target's endpoint
// label wins over the agent's own, which Prometheus keeps as
// exported_endpoint.
func load(agents []agent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "load %s\n", model.Duration(scrapeInterval))
	for i, a := range agents {
		target := fmt.Sprintf(`namespace="kube-apicache", pod="kube-apicache-%d", node="node-%d", job="monitoring/kube-apicache", instance="10.1.%d.%d:10445", container="kube-apicache", endpoint="metrics", app_kubernetes_io_name="kube-apicache"`, i, i, i/250, i%250)
		for series, values := range a {
			name, extra, _ := strings.Cut(series, "{")
			extra = strings.TrimSuffix(extra, "}")
			if extra != "" {
				extra = ", " + extra
			}
			fmt.Fprintf(&b, "  %s{%s%s} %s\n", name, target, extra, values)
		}
	}
	return b.String()
}

// firing evaluates the alert every scrape interval from 0 to until and
// returns the labels of the alerts firing at the end.
func firing(t *testing.T, rule rulefmt.Rule, agents []agent, until time.Duration) []labels.Labels {
	t.Helper()
	return firingOn(t, rule, load(agents), until)
}

// firingOn is firing on the series of a promqltest load command.
func firingOn(t *testing.T, rule rulefmt.Rule, series string, until time.Duration) []labels.Labels {
	t.Helper()
	storage := promqltest.LoadedStorage(t, series)
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(rule.Expr)
	if err != nil {
		t.Fatal(err)
	}
	ar := rules.NewAlertingRule(rule.Alert, expr, time.Duration(rule.For), 0,
		labels.FromMap(rule.Labels), labels.FromMap(rule.Annotations), labels.EmptyLabels(), "", false, nil)
	query := rules.EngineQueryFunc(engine, storage)
	start := time.Unix(0, 0).UTC()
	for ts := time.Duration(0); ts <= until; ts += scrapeInterval {
		if _, err := ar.Eval(context.Background(), 0, start.Add(ts), query, nil, 0); err != nil {
			t.Fatalf("%s at %s: %v", rule.Alert, ts, err)
		}
	}
	var out []labels.Labels
	for _, a := range ar.ActiveAlerts() {
		if a.State == rules.StateFiring {
			out = append(out, a.Labels)
		}
	}
	return out
}

// TestFleetAlerts: the alerts that page fire on a share of a fleet of 100
// agents, once for the fleet, and not on a few nodes.
func TestFleetAlerts(t *testing.T) {
	byName := loadRules(t)
	notIntercepting := func(a agent) { a["kube_apicache_intercepting"] = "0x80" }
	killSwitch := func(a agent) {
		a["kube_apicache_intercepting"] = "0x80"
		a["kube_apicache_interception_disabled"] = "1x80"
	}
	// No endpoint healthy; the scrapes fail 2 minutes later (the agent
	// cannot review the scraper's token any more), leaving stale series.
	upstreamDown := func(a agent) {
		a[`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.1:6443"}`] = "0x4 stale"
		a[`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.2:6443"}`] = "0x4 stale"
		a["kube_apicache_intercepting"] = "0x4 stale"
		a["kube_apicache_degraded"] = "0x4 stale"
		a["up"] = "1x4 0x76"
	}
	degraded := func(a agent) {
		upstreamDown(a)
		a["kube_apicache_intercepting"] = "1x4 stale"
		a["kube_apicache_degraded"] = "1x4 stale"
	}
	for _, tc := range []struct {
		alert    string
		affected int
		bad      func(agent)
		fires    bool
		// until is how long the scenario runs: the rule's for and 2
		// minutes if 0.
		until time.Duration
	}{
		{"KubeApicacheNotInterceptingWidespread", 20, notIntercepting, true, 0},
		{"KubeApicacheNotInterceptingWidespread", 20, upstreamDown, true, 35 * time.Minute},
		{"KubeApicacheNotInterceptingWidespread", 2, notIntercepting, false, 0},
		{"KubeApicacheNotInterceptingWidespread", 10, notIntercepting, false, 0},
		{"KubeApicacheNotInterceptingWidespread", 100, killSwitch, false, 0},
		{"KubeApicacheUpstreamDownWidespread", 20, upstreamDown, true, 0},
		// Still firing half an hour into an outage the failed agents
		// cannot be scraped in.
		{"KubeApicacheUpstreamDownWidespread", 20, upstreamDown, true, 35 * time.Minute},
		{"KubeApicacheUpstreamDownWidespread", 2, upstreamDown, false, 0},
		{"KubeApicacheDegradedWidespread", 20, degraded, true, 0},
		{"KubeApicacheDegradedWidespread", 20, degraded, true, 35 * time.Minute},
		{"KubeApicacheDegradedWidespread", 6, degraded, true, 0},
		{"KubeApicacheDegradedWidespread", 2, degraded, false, 0},
		{"KubeApicacheDegradedWidespread", 20, upstreamDown, false, 0},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.alert, tc.affected), func(t *testing.T) {
			rule, ok := byName[tc.alert]
			if !ok {
				t.Fatalf("no alert %s", tc.alert)
			}
			until := tc.until
			if until == 0 {
				until = time.Duration(rule.For) + 2*time.Minute
			}
			got := firing(t, rule, fleet(100, tc.affected, tc.bad), until)
			switch {
			case tc.fires && len(got) != 1:
				t.Errorf("%d of 100 agents affected: %d alerts firing after %s, want 1 for the fleet: %v", tc.affected, len(got), until, got)
			case !tc.fires && len(got) != 0:
				t.Errorf("%d of 100 agents affected: firing %v, want nothing", tc.affected, got)
			}
			for _, l := range got {
				if l.Get("namespace") != "kube-apicache" || l.Has("node") || l.Has("pod") {
					t.Errorf("firing with labels %s, want the namespace and no node or pod", l)
				}
				if l.Get("severity") != "critical" {
					t.Errorf("severity %q, want critical", l.Get("severity"))
				}
			}
		})
	}
}

// TestNodeAlerts: the per-agent alerts fire once per affected node, as
// warnings, including for an agent whose scrapes stopped soon after.
func TestNodeAlerts(t *testing.T) {
	byName := loadRules(t)
	for _, tc := range []struct {
		alert string
		bad   func(agent)
	}{
		{"KubeApicacheUpstreamDown", func(a agent) {
			a[`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.1:6443"}`] = "0x4 stale"
			a[`kube_apicache_upstream_endpoint_healthy{exported_endpoint="10.0.0.2:6443"}`] = "0x4 stale"
		}},
		{"KubeApicacheNotIntercepting", func(a agent) { a["kube_apicache_intercepting"] = "0x80" }},
		{"KubeApicacheScrapeFailing", func(a agent) { a["up"] = "0x80" }},
		{"KubeApicacheLocalPodsNotListed", func(a agent) {
			a[`kube_apicache_local_pods_source{source="node"}`] = "0x80"
			a[`kube_apicache_local_pods_source{source="none"}`] = "1x80"
		}},
	} {
		t.Run(tc.alert, func(t *testing.T) {
			rule, ok := byName[tc.alert]
			if !ok {
				t.Fatalf("no alert %s", tc.alert)
			}
			got := firing(t, rule, fleet(10, 3, tc.bad), time.Duration(rule.For)+time.Minute)
			if len(got) != 3 {
				t.Fatalf("3 of 10 agents affected: %d alerts firing, want 3: %v", len(got), got)
			}
			for _, l := range got {
				if !l.Has("node") || l.Get("severity") == "critical" {
					t.Errorf("firing with labels %s, want a node and no page", l)
				}
			}
		})
	}
}

// TestLocalPodsNotListedQuiet: KubeApicacheLocalPodsNotListed stays quiet
// for agents that list their node's pods as themselves (the fallback
// works) and for agents that do not intercept at all
// (KubeApicacheNotIntercepting's case).
func TestLocalPodsNotListedQuiet(t *testing.T) {
	rule := loadRules(t)["KubeApicacheLocalPodsNotListed"]
	for name, bad := range map[string]func(agent){
		"fallback to the agent": func(a agent) {
			a[`kube_apicache_local_pods_source{source="node"}`] = "0x80"
			a[`kube_apicache_local_pods_source{source="agent"}`] = "1x80"
		},
		"not intercepting": func(a agent) {
			a[`kube_apicache_local_pods_source{source="node"}`] = "0x80"
			a[`kube_apicache_local_pods_source{source="none"}`] = "1x80"
			a["kube_apicache_intercepting"] = "0x80"
		},
	} {
		if got := firing(t, rule, fleet(10, 3, bad), time.Duration(rule.For)+time.Minute); len(got) != 0 {
			t.Errorf("%s: %d alerts firing, want none: %v", name, len(got), got)
		}
	}
}

// approverUp is the `up` series of the approver's replicas, one value
// series each, in promqltest's notation.
func approverUp(replicas ...string) string {
	var b strings.Builder
	for i, values := range replicas {
		fmt.Fprintf(&b, "  up{namespace=\"kube-apicache\", pod=\"kube-apicache-approver-%d\", job=\"monitoring/kube-apicache-approver\", instance=\"10.2.0.%d:10446\", container=\"approver\", endpoint=\"metrics\", app_kubernetes_io_name=\"kube-apicache-approver\"} %s\n", i, i, values)
	}
	return b.String()
}

// TestApproverDown: KubeApicacheApproverDown fires, once and as a warning,
// when no approver replica has been scraped for 15 minutes, whether the
// replicas' scrapes fail or they are gone, and stays quiet while one
// replica is up or the outage is short; the agents' targets count for
// nothing.
func TestApproverDown(t *testing.T) {
	rule := loadRules(t)["KubeApicacheApproverDown"]
	agents := load(fleet(3, 0, nil))
	for _, tc := range []struct {
		name string
		// approvers are the replicas' up series.
		approvers []string
		want      int
	}{
		// Given both replicas scraped, nothing fires.
		{name: "both up", approvers: []string{"1x80", "1x80"}, want: 0},
		// Given the standby's scrapes failing, the leader's suffice.
		{name: "one up", approvers: []string{"1x80", "0x80"}, want: 0},
		// Given both replicas refusing the token or unreachable, it fires.
		{name: "both failing", approvers: []string{"0x80", "0x80"}, want: 1},
		// Given no approver target at all (scaled to zero, or the PodMonitor
		// selects nothing), it fires.
		{name: "no target", want: 1},
		// Given both down for 10 minutes, then back, nothing fires.
		{name: "short outage", approvers: []string{"0x20 1x60", "0x20 1x60"}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			series := agents + approverUp(tc.approvers...)
			got := firingOn(t, rule, series, 40*time.Minute)
			if len(got) != tc.want {
				t.Fatalf("%d alerts firing, want %d: %v", len(got), tc.want, got)
			}
			for _, l := range got {
				if l.Get("severity") != "warning" {
					t.Errorf("firing with labels %s, want a warning", l)
				}
			}
		})
	}
}
