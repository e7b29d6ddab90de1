package bloom

import (
	"math"
	"testing"
)

func TestParamsFor(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		fpRate   float64
		want     Params
	}{
		// m = ceil(-n ln p / ln²2) rounded up to 64; k = ceil(ln2 · m/n) on the unrounded m.
		{"10k at 1%", 10_000, 0.01, Params{M: 95_872, K: 7}},
		{"100k at 1%", 100_000, 0.01, Params{M: 958_528, K: 7}},
		{"100k at 0.1%", 100_000, 0.001, Params{M: 1_437_760, K: 10}},
		{"zero capacity floors at 64 keys", 0, 0.01, Params{M: 640, K: 7}},
		{"negative capacity floors at 64 keys", -5, 0.01, Params{M: 640, K: 7}},
		{"zero rate means default", 10_000, 0, Params{M: 95_872, K: 7}},
		{"rate 1 means default", 10_000, 1, Params{M: 95_872, K: 7}},
		{"NaN rate means default", 10_000, math.NaN(), Params{M: 95_872, K: 7}},
		{"negative rate means default", 10_000, -0.5, Params{M: 95_872, K: 7}},
		{"huge capacity caps M", 1_000_000_000, 0.01, Params{M: MaxBits, K: 1}},
		{"max int capacity caps M", math.MaxInt, 0.01, Params{M: MaxBits, K: 1}},
		{"tiny rate caps K", 10_000, 1e-15, Params{M: 718_912, K: MaxK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParamsFor(tt.capacity, tt.fpRate)
			if got != tt.want {
				t.Errorf("ParamsFor(%d, %g) = %+v; want %+v", tt.capacity, tt.fpRate, got, tt.want)
			}
			if !got.valid() {
				t.Errorf("ParamsFor(%d, %g) = %+v is not valid", tt.capacity, tt.fpRate, got)
			}
		})
	}
}

// TestParamsForExtremes checks only the invariants for inputs whose exact
// result depends on floating-point corner cases (math.Log of a denormal).
func TestParamsForExtremes(t *testing.T) {
	for _, c := range []int{math.MinInt, -1, 0, 1, 63, 64, 65, 1 << 40, math.MaxInt} {
		for _, p := range []float64{math.Inf(-1), -1, 0, 5e-324, math.SmallestNonzeroFloat64 * 3, 1e-300, 0.5, 0.999999, 1, math.Inf(1), math.NaN()} {
			if got := ParamsFor(c, p); !got.valid() {
				t.Errorf("ParamsFor(%d, %g) = %+v is not valid", c, p, got)
			}
		}
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		in, want Params
	}{
		{Params{}, Params{M: 64, K: 1}},
		{Params{M: 1, K: 1}, Params{M: 64, K: 1}},
		{Params{M: 65, K: 7}, Params{M: 128, K: 7}},
		{Params{M: 128, K: 7}, Params{M: 128, K: 7}},
		{Params{M: MaxBits + 1, K: 99}, Params{M: MaxBits, K: MaxK}},
		{Params{M: math.MaxUint64, K: math.MaxUint32}, Params{M: MaxBits, K: MaxK}},
	}
	for _, tt := range tests {
		if got := normalize(tt.in); got != tt.want {
			t.Errorf("normalize(%+v) = %+v; want %+v", tt.in, got, tt.want)
		}
	}
}
