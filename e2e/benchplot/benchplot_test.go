package benchplot

import (
	"encoding/json"
	"image/png"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCharts: each chart is a PNG of the requested size, the results file
// reads back, and a log axis is labelled at 1, 2 and 5 of each decade.
func TestCharts(t *testing.T) {
	d := Dir(t.TempDir())
	lines, err := d.Lines("cpu vs nodes", "kube-apiserver CPU", "nodes", "CPU-seconds", []Series{
		{Name: "agent", Points: []XY{{1, 0.5}, {2, 0.6}, {5, 0.9}}},
		{Name: "direct", Points: []XY{{1, 1}, {2, 2}, {5, 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cdf, err := d.CDF("latency", "list latency", map[string][]time.Duration{
		"agent":  {time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond},
		"direct": {5 * time.Millisecond, 6 * time.Millisecond, 0},
	})
	if err != nil {
		t.Fatal(err)
	}
	timeline, err := d.Cumulative("storm", "informers synced", "informers synced", map[string][]time.Duration{
		"agent":  {300 * time.Millisecond, 100 * time.Millisecond, 1200 * time.Millisecond},
		"direct": {2 * time.Second, 3 * time.Second},
		"none":   nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{lines, cdf, timeline} {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || cfg.Width < 600 || cfg.Height < 300 {
			t.Errorf("%s: %+v %v, want a PNG of 8x5 inches", path, cfg, err)
		}
	}
	path, err := d.WriteJSON("results.json", map[string]float64{"ratio": 0.25})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var got map[string]float64
	if err := json.Unmarshal(b, &got); err != nil || got["ratio"] != 0.25 {
		t.Errorf("results read back as %v, %v", got, err)
	}
	var labels []string
	for _, tick := range (LogTicks125{}).Ticks(0.03, 20) {
		if tick.Label != "" {
			labels = append(labels, tick.Label)
		}
	}
	if got, want := strings.Join(labels, " "), "0.05 0.1 0.2 0.5 1 2 5 10 20"; got != want {
		t.Errorf("LogTicks125 labels %q, want %q", got, want)
	}
	if got := FileName("List node pods, RV=\"\" (16 in flight)"); got != "list-node-pods-rv-16-in-flight" {
		t.Errorf("FileName: %q", got)
	}
}
