package scale

import "math"

// Fit is a least-squares line y = A + B·N through measured points, with
// its residuals, so an extrapolation states how well the line held.
type Fit struct {
	A, B float64
	// MaxResidual and RMSResidual are |measured − fitted| over the points,
	// in the measure's unit.
	MaxResidual, RMSResidual float64
	Points                   int
}

// FitLinear fits y = a + b·x. With one point the line is flat; with none
// it is zero.
func FitLinear(x, y []float64) Fit {
	n := float64(len(x))
	if len(x) == 0 || len(x) != len(y) {
		return Fit{}
	}
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	f := Fit{A: sy / n, Points: len(x)}
	if d := n*sxx - sx*sx; d != 0 {
		f.B = (n*sxy - sx*sy) / d
		f.A = (sy - f.B*sx) / n
	}
	var ss float64
	for i := range x {
		r := math.Abs(y[i] - f.At(x[i]))
		f.MaxResidual = max(f.MaxResidual, r)
		ss += r * r
	}
	f.RMSResidual = math.Sqrt(ss / n)
	return f
}

// At is the fitted value at x.
func (f Fit) At(x float64) float64 { return f.A + f.B*x }
