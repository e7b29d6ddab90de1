package bloom

import (
	"math"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

// Params are a filter's size: M bits (a multiple of 64) and K probes per key.
// Peers that exchange deltas must agree on them, so a deployment fixes them
// from the pod's KV capacity rather than from its current key count.
type Params struct {
	M uint64
	K uint32
}

const (
	// MaxBits bounds M (2^28 bits = 32 MiB), so a hostile header cannot make
	// a receiver allocate without bound. It is room for ~28M keys at 1%, far
	// more than one pod's KV cache (25k-100k blocks, libraries.md §2.2).
	MaxBits = 1 << 28
	// MaxK bounds the probes per key; 1% needs 7 and 0.01% needs 14.
	MaxK = 32
	// DefaultFPRate is the false-positive target ParamsFor uses when given a
	// rate outside (0, 1).
	DefaultFPRate = 0.01
	// minCapacityKeys is the floor ParamsFor applies, so a tiny or zero
	// capacity still yields a filter with a usable false-positive rate.
	minCapacityKeys = 64
)

// ParamsFor sizes a filter that holds capacityKeys keys at about fpRate false
// positives (m = -n ln p / ln² 2, k = ln 2 · m/n). M is rounded up to whole
// 64-bit words. Capacities below 64 keys are treated as 64; a rate outside
// (0, 1) becomes DefaultFPRate; M is capped at MaxBits and K at MaxK.
func ParamsFor(capacityKeys int, fpRate float64) Params {
	n := max(capacityKeys, minCapacityKeys)
	if !(fpRate > 0 && fpRate < 1) { // also catches NaN
		fpRate = DefaultFPRate
	}
	// Keep the estimate in range before converting: EstimateParameters
	// returns float-to-uint conversions that overflow for absurd inputs.
	if float64(n)*-math.Log(fpRate)/(math.Ln2*math.Ln2) > MaxBits {
		k := uint32(math.Ceil(math.Ln2 * MaxBits / float64(n)))
		return normalize(Params{M: MaxBits, K: k})
	}
	m, k := bbloom.EstimateParameters(uint(n), fpRate)
	return normalize(Params{M: uint64(m), K: uint32(min(k, MaxK))})
}

// normalize returns p moved into the valid range: M a positive multiple of 64
// no larger than MaxBits, K in 1..MaxK.
func normalize(p Params) Params {
	p.M = min(max(p.M, 64), MaxBits)
	p.M = (p.M + 63) &^ 63
	p.K = min(max(p.K, 1), MaxK)
	return p
}

// valid reports whether p is in range without changing it; decoders use it so
// that a re-encoding reproduces the input exactly.
func (p Params) valid() bool {
	return p.M > 0 && p.M%64 == 0 && p.M <= MaxBits && p.K >= 1 && p.K <= MaxK
}
