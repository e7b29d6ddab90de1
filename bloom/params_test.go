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
		// Blocked sizing (blockedFP): about 3% more bits than the classic
		// 95,872 / 958,528 / 1,437,760 and one or two probes fewer.
		{"10k at 1%", 10_000, 0.01, Params{M: 99_328, K: 6}},
		{"100k at 1%", 100_000, 0.01, Params{M: 989_696, K: 6}},
		{"100k at 0.1%", 100_000, 0.001, Params{M: 1_549_312, K: 9}},
		{"zero capacity floors at 64 keys", 0, 0.01, Params{M: 1024, K: 4}},
		{"negative capacity floors at 64 keys", -5, 0.01, Params{M: 1024, K: 4}},
		{"zero rate means default", 10_000, 0, Params{M: 99_328, K: 6}},
		{"rate 1 means default", 10_000, 1, Params{M: 99_328, K: 6}},
		{"NaN rate means default", 10_000, math.NaN(), Params{M: 99_328, K: 6}},
		{"negative rate means default", 10_000, -0.5, Params{M: 99_328, K: 6}},
		{"huge capacity caps M", 1_000_000_000, 0.01, Params{M: MaxBits, K: 1}},
		{"max int capacity caps M", math.MaxInt, 0.01, Params{M: MaxBits, K: 1}},
		// K cannot grow past MaxK, so blocks must: the model asks far more
		// than the classic 718,912 bits.
		{"tiny rate caps K", 10_000, 1e-15, Params{M: 3_116_032, K: MaxK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParamsFor(tt.capacity, tt.fpRate)
			if got != tt.want {
				t.Errorf("ParamsFor(%d, %g) = %+v; want %+v", tt.capacity, tt.fpRate, got, tt.want)
			}
			if !got.valid(HashScheme) {
				t.Errorf("ParamsFor(%d, %g) = %+v is not valid", tt.capacity, tt.fpRate, got)
			}
		})
	}
}

// TestParamsForMinimal checks ParamsFor against its model: the chosen size
// meets the target by blockedFP, one block fewer does not, and no K in the
// searched range needs fewer bits.
func TestParamsForMinimal(t *testing.T) {
	for _, n := range []int{64, 1000, 10_000, 25_000, 100_000, 1_000_000} {
		for _, p := range []float64{0.05, 0.01, 0.001, 0.0001} {
			got := ParamsFor(n, p)
			blocks := got.M / blockBits
			if fp := blockedFP(float64(n), float64(blocks), got.K); fp > p {
				t.Errorf("ParamsFor(%d, %g) = %+v: model rate %.5g above target", n, p, got, fp)
			}
			if fp := blockedFP(float64(n), float64(blocks-1), got.K); blocks > 1 && fp <= p {
				t.Errorf("ParamsFor(%d, %g) = %+v: one block fewer already meets the target (%.5g)", n, p, got, fp)
			}
			for k := got.K + 1; k <= min(got.K+3, MaxK); k++ {
				if fp := blockedFP(float64(n), float64(blocks-1), k); blocks > 1 && fp <= p {
					t.Errorf("ParamsFor(%d, %g) = %+v: K=%d meets the target with fewer blocks (%.5g)", n, p, got, k, fp)
				}
			}
		}
	}
}

// TestParamsForExtremes checks only the invariants for inputs whose exact
// result depends on floating-point corner cases (math.Log of a denormal).
func TestParamsForExtremes(t *testing.T) {
	for _, c := range []int{math.MinInt, -1, 0, 1, 63, 64, 65, 1 << 40, math.MaxInt} {
		for _, p := range []float64{math.Inf(-1), -1, 0, 5e-324, math.SmallestNonzeroFloat64 * 3, 1e-300, 0.5, 0.999999, 1, math.Inf(1), math.NaN()} {
			if got := ParamsFor(c, p); !got.valid(HashScheme) {
				t.Errorf("ParamsFor(%d, %g) = %+v is not valid", c, p, got)
			}
		}
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		scheme   uint8
		in, want Params
	}{
		{hashDouble, Params{}, Params{M: 64, K: 1}},
		{hashDouble, Params{M: 1, K: 1}, Params{M: 64, K: 1}},
		{hashDouble, Params{M: 65, K: 7}, Params{M: 128, K: 7}},
		{hashDouble, Params{M: 128, K: 7}, Params{M: 128, K: 7}},
		{hashDouble, Params{M: MaxBits + 1, K: 99}, Params{M: MaxBits, K: MaxK}},
		{hashDouble, Params{M: math.MaxUint64, K: math.MaxUint32}, Params{M: MaxBits, K: MaxK}},
		{hashBlocked, Params{}, Params{M: 512, K: 1}},
		{hashBlocked, Params{M: 65, K: 7}, Params{M: 512, K: 7}},
		{hashBlocked, Params{M: 512, K: 7}, Params{M: 512, K: 7}},
		{hashBlocked, Params{M: 513, K: 7}, Params{M: 1024, K: 7}},
		{hashBlocked, Params{M: MaxBits - 1, K: 7}, Params{M: MaxBits, K: 7}},
		{hashBlocked, Params{M: math.MaxUint64, K: math.MaxUint32}, Params{M: MaxBits, K: MaxK}},
	}
	for _, tt := range tests {
		got := normalize(tt.in, tt.scheme)
		if got != tt.want {
			t.Errorf("normalize(%+v, scheme %d) = %+v; want %+v", tt.in, tt.scheme, got, tt.want)
		}
		if !got.valid(tt.scheme) {
			t.Errorf("normalize(%+v, scheme %d) = %+v is not valid", tt.in, tt.scheme, got)
		}
	}
}
