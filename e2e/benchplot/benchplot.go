// Package benchplot writes the benchmarks' charts (PNG, with gonum/plot)
// and their machine-readable results (JSON) under one output directory,
// by default _output/bench.
package benchplot

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// DefaultDir is where the charts and results go unless a bench says
// otherwise (relative to the directory make runs in).
const DefaultDir = "_output/bench"

// Dir is an output directory for one bench's charts and results.
type Dir string

// Path returns name's path in d, creating d if needed.
func (d Dir) Path(name string) (string, error) {
	if err := os.MkdirAll(string(d), 0o755); err != nil {
		return "", err
	}
	return filepath.Join(string(d), name), nil
}

// WriteJSON writes v, indented, to name in d, and returns its path.
func (d Dir) WriteJSON(name string, v any) (string, error) {
	path, err := d.Path(name)
	if err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// XY is one point of a line.
type XY struct{ X, Y float64 }

// Series is a named line.
type Series struct {
	Name   string
	Points []XY
}

// Lines draws series as lines with points, one color each, and writes the
// chart to name (PNG) in d.
func (d Dir) Lines(name, title, xLabel, yLabel string, series []Series) (string, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	for i, s := range series {
		pts := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", name, s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(s.Name, line, points)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return d.save(p, name)
}

// CDF draws the empirical cumulative distribution of each set of
// durations (in milliseconds, log scale) and writes it to name in d.
func (d Dir) CDF(name, title string, sets map[string][]time.Duration) (string, error) {
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	sort.Strings(names)
	var series []Series
	for _, n := range names {
		ds := slices.Clone(sets[n])
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		pts := make([]XY, 0, len(ds))
		for i, v := range ds {
			ms := float64(v) / float64(time.Millisecond)
			if ms <= 0 {
				ms = 0.001
			}
			pts = append(pts, XY{X: ms, Y: float64(i+1) / float64(len(ds))})
		}
		series = append(series, Series{Name: n, Points: pts})
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = LogTicks125{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	for i, s := range series {
		pts := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = plotter.XY{X: pt.X, Y: pt.Y}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", name, s.Name, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		p.Add(line)
		p.Legend.Add(s.Name, line)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return d.save(p, name)
}

// Cumulative draws, for each set of times (from a common start), how many
// of its events had happened by each moment, as steps, and writes the chart
// to name in d: e.g. informers synced over time in a start-up storm.
func (d Dir) Cumulative(name, title, yLabel string, sets map[string][]time.Duration) (string, error) {
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	sort.Strings(names)
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = yLabel
	p.X.Min, p.Y.Min = 0, 0
	p.Add(plotter.NewGrid())
	for i, n := range names {
		ts := slices.Clone(sets[n])
		if len(ts) == 0 {
			continue
		}
		slices.Sort(ts)
		pts := plotter.XYs{{X: 0, Y: 0}}
		for j, t := range ts {
			x := t.Seconds()
			pts = append(pts, plotter.XY{X: x, Y: float64(j)}, plotter.XY{X: x, Y: float64(j + 1)})
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", name, n, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		p.Add(line)
		p.Legend.Add(n, line)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return d.save(p, name)
}

// LogTicks125 marks a log axis at 1, 2 and 5 times each power of ten,
// labelled, and at the other multiples, unlabelled, so that an axis
// spanning less than a decade (latencies of 2 to 20 ms) still reads.
type LogTicks125 struct{}

var _ plot.Ticker = LogTicks125{}

// Ticks implements plot.Ticker.
func (LogTicks125) Ticks(lo, hi float64) []plot.Tick {
	lo = max(lo, 1e-9)
	var ticks []plot.Tick
	for e := int(math.Floor(math.Log10(lo))); math.Pow10(e) <= hi; e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow10(e)
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'f', max(-e, 0), 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

func (d Dir) save(p *plot.Plot, name string) (string, error) {
	if !strings.HasSuffix(name, ".png") {
		name += ".png"
	}
	path, err := d.Path(name)
	if err != nil {
		return "", err
	}
	return path, p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// FileName turns a case name into a file name: lower case, runs of other
// characters as one dash.
func FileName(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
