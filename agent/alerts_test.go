package agent

import (
	"bufio"
	"bytes"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-apicache/kube-apicache/internal/docscheck"
)

// metricRef matches a metric of the project in a PromQL expression.
var metricRef = regexp.MustCompile(`\bkube_apicache_[a-zA-Z0-9_]+`)

// selectorLiteral matches a matcher on the job or namespace label in a
// PromQL expression: the rules must not depend on how the PodMonitor, or
// the namespace it and the agents run in, is named.
var selectorLiteral = regexp.MustCompile(`\b(job|namespace)\s*(=~|!~|!=|=)\s*["'` + "`]")

// byClause matches a `by (...)` or `without (...)` grouping.
var byClause = regexp.MustCompile(`\b(by|without)\s*\(([^)]*)\)`)

// allowedSeverities: critical pages; warning and info do not.
var allowedSeverities = []string{"critical", "warning", "info"}

// fleetGroup is the rule group whose alerts are about the share of the
// agents in a state; it alone may page.
const fleetGroup = "kube-apicache-fleet"

// runbookBase is where every alert's runbook_url points, followed by the
// anchor of its entry in the runbook page.
const runbookBase = "https://github.com/kube-apicache/kube-apicache/blob/main/docs/operations/alerts.md"

// runbookPage is that page in this repository; metricsPage lists every
// alert with the metrics.
const (
	runbookPage = "../docs/operations/alerts.md"
	metricsPage = "../docs/reference/metrics.md"
)

// perAgentLabels identify one agent; an alert that keeps one of them fires
// once per node.
var perAgentLabels = []string{"pod", "node", "instance"}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroup struct {
	Name  string      `json:"name"`
	Rules []alertRule `json:"rules"`
}

// readAlertRules reads manifests/monitoring/prometheusrule.yaml.
func readAlertRules(t *testing.T) []ruleGroup {
	t.Helper()
	raw, err := os.ReadFile("../manifests/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("kind %q, want PrometheusRule", rule.Kind)
	}
	return rule.Spec.Groups
}

// TestAlertRules: every kube_apicache_* metric the shipped alert rules
// (manifests/monitoring/prometheusrule.yaml) query is one the agent
// registers (a histogram's _bucket, _sum and _count series included),
// so a renamed metric cannot leave an alert that never fires; and the
// metrics reference lists every alert.
func TestAlertRules(t *testing.T) {
	groups := readAlertRules(t)
	registered := registeredNames(t, newAgentFromNew(t).metrics.registry)
	listing, err := os.ReadFile(metricsPage)
	if err != nil {
		t.Fatal(err)
	}
	var alerts, used []string
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("rule %+v: want an alert with an expr", r)
				continue
			}
			alerts = append(alerts, r.Alert)
			if !strings.Contains(string(listing), "`"+r.Alert+"`") {
				t.Errorf("%s does not list the alert %s", metricsPage, r.Alert)
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

// TestAlertRulesRunbooks: every alert's runbook_url is the runbook page's,
// with the anchor of one of its entries (a level-2 heading), and every
// alert there has such a link; no two alerts share an entry.
func TestAlertRulesRunbooks(t *testing.T) {
	page, err := os.ReadFile(runbookPage)
	if err != nil {
		t.Fatal(err)
	}
	all := headingAnchors(page, 0)
	section := headingAnchors(page, 2)
	if len(section) == 0 {
		t.Fatal(runbookPage + " has no entries")
	}
	seen := map[string]string{}
	n := 0
	for _, g := range readAlertRules(t) {
		for _, r := range g.Rules {
			n++
			link := r.Annotations["runbook_url"]
			base, anchor, ok := strings.Cut(link, "#")
			if !ok || base != runbookBase || anchor == "" {
				t.Errorf("alert %s: runbook_url %q, want %s#<anchor>", r.Alert, link, runbookBase)
				continue
			}
			if _, err := url.Parse(link); err != nil {
				t.Errorf("alert %s: runbook_url: %v", r.Alert, err)
			}
			switch {
			case !all[anchor]:
				t.Errorf("alert %s: runbook_url's anchor #%s is no heading of %s", r.Alert, anchor, runbookPage)
			case !section[anchor]:
				t.Errorf("alert %s: runbook_url's anchor #%s is not an entry (## heading) of %s", r.Alert, anchor, runbookPage)
			}
			if other, ok := seen[anchor]; ok {
				t.Errorf("alerts %s and %s share the runbook entry #%s", other, r.Alert, anchor)
			}
			seen[anchor] = r.Alert
		}
	}
	if n == 0 {
		t.Fatal("no alerts read")
	}
}

// TestAlertRulesPortable: no expression selects by a job or namespace
// name (both depend on the installation: the docs tell users to change
// the namespace), every alert has a severity from allowedSeverities, and
// only the fleet group's alerts are critical: they aggregate the agents
// away (no per-agent label kept in any grouping they count or sum by, nor
// named in their annotations), so that an outage of the control plane is
// one page, not one per node.
func TestAlertRulesPortable(t *testing.T) {
	var critical int
	for _, g := range readAlertRules(t) {
		for _, r := range g.Rules {
			if m := selectorLiteral.FindString(r.Expr); m != "" {
				t.Errorf("alert %s: expression selects by %q: select the agents by their metrics' names and labels", r.Alert, m)
			}
			sev := r.Labels["severity"]
			if !slices.Contains(allowedSeverities, sev) {
				t.Errorf("alert %s: severity %q, want one of %v", r.Alert, sev, allowedSeverities)
			}
			if sev != "critical" {
				continue
			}
			critical++
			if g.Name != fleetGroup {
				t.Errorf("alert %s: critical in group %s: only the %s group may page", r.Alert, g.Name, fleetGroup)
			}
			if err := checkFleetAggregate(r); err != "" {
				t.Errorf("alert %s: critical, but %s", r.Alert, err)
			}
		}
	}
	if critical == 0 {
		t.Error("no critical alert: nothing pages")
	}
}

// checkFleetAggregate returns why r is not an alert on the fleet as a
// whole, or "".
func checkFleetAggregate(r alertRule) string {
	if !strings.Contains(r.Expr, "count by (namespace)") || !strings.Contains(r.Expr, "/") {
		return "its expression is not a share of the agents (count by (namespace) ... / count by (namespace) ...)"
	}
	for _, m := range byClause.FindAllStringSubmatch(r.Expr, -1) {
		if m[1] == "without" {
			return "it groups `without`, which keeps per-agent labels"
		}
		// An inner grouping by pod (one value per agent) is what is
		// counted; only the outermost count must drop it.
		if !strings.Contains(r.Expr, "count "+m[0]) {
			continue
		}
		for _, l := range strings.Split(m[2], ",") {
			if slices.Contains(perAgentLabels, strings.TrimSpace(l)) {
				return "it counts by " + m[2]
			}
		}
	}
	for k, v := range r.Annotations {
		for _, l := range perAgentLabels {
			if strings.Contains(v, "$labels."+l) {
				return "its " + k + " names $labels." + l
			}
		}
	}
	return ""
}

// headingAnchors returns the GitHub anchors of page's headings outside
// code blocks: all of them if level is 0, else those of that level.
func headingAnchors(page []byte, level int) map[string]bool {
	anchors := map[string]bool{}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		hashes := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || hashes == level {
			anchors[docscheck.Anchor(strings.TrimSpace(line[hashes:]))] = true
		}
	}
	return anchors
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
