package scale

import (
	"fmt"
	"strings"
)

// Fit is a least-squares line of one figure against the node count, for
// one path: Intercept is what the control plane spends with no node,
// PerNode what each node adds.
type Fit struct {
	Figure    string  `json:"figure"`
	Mode      string  `json:"mode"`
	Intercept float64 `json:"intercept"`
	PerNode   float64 `json:"perNode"`
	// R2 is the coefficient of determination (1 for a perfect line; NaN
	// is written as 0 when every point is equal).
	R2 float64 `json:"r2"`
	// At1000 and At5000 extrapolate the line.
	At1000 float64 `json:"at1000"`
	At5000 float64 `json:"at5000"`
	Points int     `json:"points"`
}

// Figure names a measured figure and reads it from a Point.
type Figure struct {
	Name string
	Get  func(Point) (float64, bool)
}

// Figures are the figures fitted against the node count.
var Figures = []Figure{
	{"storm CPU-seconds", func(p Point) (float64, bool) { return p.Storm.CPUSeconds, true }},
	{"storm bytes sent", func(p Point) (float64, bool) { return p.Storm.BytesSent, true }},
	{"storm requests", func(p Point) (float64, bool) { return sum(p.Storm.Requests), true }},
	{"churn CPU-seconds", func(p Point) (float64, bool) { return p.Churn.CPUSeconds, true }},
	{"churn bytes sent", func(p Point) (float64, bool) { return p.Churn.BytesSent, true }},
	{"watches held", func(p Point) (float64, bool) { return p.Churn.Watches, true }},
	{"apiserver RSS bytes", func(p Point) (float64, bool) { return p.Churn.RSSBytes, true }},
	{"recovery CPU-seconds", func(p Point) (float64, bool) {
		if p.Recovery == nil {
			return 0, false
		}
		return p.Recovery.CPUSeconds, true
	}},
	{"recovery bytes sent", func(p Point) (float64, bool) {
		if p.Recovery == nil {
			return 0, false
		}
		return p.Recovery.BytesSent, true
	}},
	{"recovery seconds", func(p Point) (float64, bool) {
		if p.Recovery == nil {
			return 0, false
		}
		return p.Recovery.Seconds, true
	}},
}

func sum(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// Fits fits every figure against the node count, per path, where there
// are at least two distinct node counts.
func Fits(points []Point) []Fit {
	var out []Fit
	for _, f := range Figures {
		for _, mode := range []string{"agent", "direct"} {
			var xs, ys []float64
			for _, p := range points {
				if p.Mode != mode {
					continue
				}
				if y, ok := f.Get(p); ok {
					xs, ys = append(xs, float64(p.Nodes)), append(ys, y)
				}
			}
			a, b, r2, ok := leastSquares(xs, ys)
			if !ok {
				continue
			}
			out = append(out, Fit{Figure: f.Name, Mode: mode, Intercept: a, PerNode: b, R2: r2,
				At1000: a + 1000*b, At5000: a + 5000*b, Points: len(xs)})
		}
	}
	return out
}

// leastSquares fits y = a + b·x; ok is false with fewer than two distinct
// x values.
func leastSquares(xs, ys []float64) (a, b, r2 float64, ok bool) {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0, 0, 0, false
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, 0, 0, false
	}
	b = (n*sxy - sx*sy) / den
	a = (sy - b*sx) / n
	mean := sy / n
	var ssTot, ssRes float64
	for i := range xs {
		d := ys[i] - mean
		ssTot += d * d
		r := ys[i] - (a + b*xs[i])
		ssRes += r * r
	}
	if ssTot > 0 {
		r2 = 1 - ssRes/ssTot
	}
	return a, b, r2, true
}

// FitOf returns the fit of figure along mode.
func FitOf(fits []Fit, figure, mode string) (Fit, bool) {
	for _, f := range fits {
		if f.Figure == figure && f.Mode == mode {
			return f, true
		}
	}
	return Fit{}, false
}

// Model describes the fits as text: per node with the agent and without,
// their ratio, and the extrapolation.
func Model(fits []Fit) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %14s %14s %8s %16s %16s %16s %16s\n", "figure", "per node agent", "direct", "ratio", "1,000 nodes agent", "direct", "5,000 nodes agent", "direct")
	for _, f := range Figures {
		ag, ok1 := FitOf(fits, f.Name, "agent")
		di, ok2 := FitOf(fits, f.Name, "direct")
		if !ok1 || !ok2 {
			continue
		}
		ratio := 0.0
		if di.PerNode != 0 {
			ratio = ag.PerNode / di.PerNode
		}
		fmt.Fprintf(&b, "%-22s %14s %14s %8.3f %16s %16s %16s %16s\n", f.Name, human(ag.PerNode), human(di.PerNode), ratio,
			human(ag.At1000), human(di.At1000), human(ag.At5000), human(di.At5000))
	}
	return b.String()
}

// human formats v with a metric suffix.
func human(v float64) string {
	abs := v
	if abs < 0 {
		abs = -abs
	}
	switch {
	case abs >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case abs >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case abs >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
