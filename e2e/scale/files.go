package scale

import (
	"fmt"

	"github.com/kube-apicache/kube-apicache/e2e/benchplot"
)

// WriteFiles writes the results and the charts into d and returns their paths.
func WriteFiles(d benchplot.Dir, res *Results) ([]string, error) {
	var files []string
	path, err := d.WriteJSON("bench-scale.json", res)
	if err != nil {
		return files, err
	}
	files = append(files, path)
	byMode := func(get func(Point) (float64, bool)) []benchplot.Series {
		var out []benchplot.Series
		for _, mode := range []string{"agent", "direct"} {
			s := benchplot.Series{Name: mode}
			for _, p := range res.Points {
				if v, ok := get(p); ok && p.Mode == mode {
					s.Points = append(s.Points, benchplot.XY{X: float64(p.Nodes), Y: v})
				}
			}
			out = append(out, s)
		}
		return out
	}
	charts := []struct {
		name, title, y string
		get            func(Point) (float64, bool)
	}{
		{"scale-storm-cpu", "kube-apiserver CPU in the start-up storm", "CPU-seconds", func(p Point) (float64, bool) { return p.Storm.CPUSeconds, true }},
		{"scale-churn-cpu", "kube-apiserver CPU during steady churn", "CPU-seconds", func(p Point) (float64, bool) { return p.Churn.CPUSeconds, true }},
		{"scale-watches", "watches kube-apiserver holds", "watches", func(p Point) (float64, bool) { return p.Churn.Watches, true }},
		{"scale-storm-bytes", "bytes kube-apiserver sent in the storm", "MB", func(p Point) (float64, bool) { return p.Storm.BytesSent / 1e6, true }},
		{"scale-churn-bytes", "bytes kube-apiserver sent during churn", "MB", func(p Point) (float64, bool) { return p.Churn.BytesSent / 1e6, true }},
		{"scale-memory", "kube-apiserver RSS after churn", "MiB", func(p Point) (float64, bool) { return p.Churn.RSSBytes / (1 << 20), true }},
		{"scale-recovery-cpu", "kube-apiserver CPU from a restart until every watch is back", "CPU-seconds", func(p Point) (float64, bool) {
			if p.Recovery == nil {
				return 0, false
			}
			return p.Recovery.CPUSeconds, true
		}},
	}
	for _, c := range charts {
		path, err := d.Lines(c.name, c.title, "nodes", c.y, byMode(c.get))
		if err != nil {
			return files, err
		}
		files = append(files, path)
	}
	// The storm of the largest point: clients synced against time.
	last := res.Points[len(res.Points)-1].Nodes
	var timeline []benchplot.Series
	for _, mode := range []string{"agent", "direct"} {
		for _, p := range res.Points {
			if p.Nodes != last || p.Mode != mode {
				continue
			}
			s := benchplot.Series{Name: mode}
			for i, at := range p.Storm.SyncedAt {
				s.Points = append(s.Points, benchplot.XY{X: at, Y: float64(i + 1)})
			}
			timeline = append(timeline, s)
		}
	}
	path, err = d.Lines("scale-storm-timeline", fmt.Sprintf("start-up storm, %d nodes: clients synced", last), "seconds since the clients started", "clients synced", timeline)
	if err != nil {
		return files, err
	}
	files = append(files, path)
	return files, nil
}
