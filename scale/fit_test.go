package scale

import (
	"math"
	"testing"
)

func TestFitLinear(t *testing.T) {
	tests := []struct {
		name       string
		x, y       []float64
		a, b, maxR float64
	}{
		{"exact line", []float64{16, 32, 64}, []float64{10 + 2*16, 10 + 2*32, 10 + 2*64}, 10, 2, 0},
		{"flat", []float64{1, 2, 3}, []float64{5, 5, 5}, 5, 0, 0},
		{"one point", []float64{8}, []float64{3}, 3, 0, 0},
		{"noisy", []float64{0, 1, 2, 3}, []float64{0, 1, 1, 2}, 0.1, 0.6, 0.3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := FitLinear(tc.x, tc.y)
			if math.Abs(f.A-tc.a) > 1e-9 || math.Abs(f.B-tc.b) > 1e-9 || math.Abs(f.MaxResidual-tc.maxR) > 1e-9 {
				t.Errorf("FitLinear(%v, %v) = %+v; want A %v B %v max residual %v", tc.x, tc.y, f, tc.a, tc.b, tc.maxR)
			}
		})
	}
	if got := (Fit{A: 1, B: 2}).At(1000); got != 2001 {
		t.Errorf("At(1000) = %v; want 2001", got)
	}
}

func TestQuantile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if got := quantile(xs, 0.5); got != 3 {
		t.Errorf("quantile(0.5) = %v; want 3", got)
	}
	if got := quantile(xs, 0.99); got != 5 {
		t.Errorf("quantile(0.99) = %v; want 5", got)
	}
	if got := quantile(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("quantile(nil) = %v; want NaN", got)
	}
}
