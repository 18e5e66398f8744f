package scale

import (
	"math"
	"strings"
	"testing"
)

func TestLeastSquares(t *testing.T) {
	a, b, r2, ok := leastSquares([]float64{1, 2, 5, 10}, []float64{12, 14, 20, 30})
	if !ok || math.Abs(a-10) > 1e-9 || math.Abs(b-2) > 1e-9 || math.Abs(r2-1) > 1e-9 {
		t.Errorf("exact line: a=%v b=%v r2=%v ok=%v, want 10, 2, 1", a, b, r2, ok)
	}
	if _, _, _, ok := leastSquares([]float64{3, 3}, []float64{1, 2}); ok {
		t.Error("one distinct x fitted")
	}
	if _, _, r2, _ := leastSquares([]float64{1, 2, 3}, []float64{1, 3, 2}); r2 <= 0 || r2 >= 1 {
		t.Errorf("noisy points: r2 %v, want between 0 and 1", r2)
	}
}

func TestFits(t *testing.T) {
	var points []Point
	for _, k := range []int{1, 2, 4} {
		points = append(points,
			Point{Nodes: k, Mode: "agent", Churn: Phase{Watches: float64(100 + 3*k)}, Recovery: &Phase{CPUSeconds: float64(k)}},
			Point{Nodes: k, Mode: "direct", Churn: Phase{Watches: float64(100 + 12*k)}})
	}
	fits := Fits(points)
	ag, _ := FitOf(fits, "watches held", "agent")
	di, _ := FitOf(fits, "watches held", "direct")
	if ag.PerNode != 3 || di.PerNode != 12 || ag.At5000 != 100+3*5000 {
		t.Errorf("watches: agent %+v, direct %+v", ag, di)
	}
	if _, ok := FitOf(fits, "recovery CPU-seconds", "direct"); ok {
		t.Error("a figure with no points was fitted")
	}
	if m := Model(fits); !strings.Contains(m, "watches held") || !strings.Contains(m, "0.250") {
		t.Errorf("model text:\n%s", m)
	}
}
