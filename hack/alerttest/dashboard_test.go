package alerttest

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// TestDashboardQueriesParse: every query of the Grafana dashboard
// (manifests/monitoring/dashboard.json) is PromQL Prometheus accepts, once
// Grafana has put in its variables.
func TestDashboardQueriesParse(t *testing.T) {
	raw, err := os.ReadFile("../../manifests/monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "2m", "${datasource}", "", "$namespace", "kube-apicache", "$node", ".*")
	p := parser.NewParser(parser.Options{})
	n := 0
	for _, pn := range dash.Panels {
		for _, q := range pn.Targets {
			n++
			if _, err := p.ParseExpr(vars.Replace(q.Expr)); err != nil {
				t.Errorf("panel %q: %s: %v", pn.Title, q.Expr, err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no queries read")
	}
}
