package bloom

import "github.com/kvroute/kvroute/blockkey"

// Hash scheme 1, double hashing over the whole filter:
//
//	h1 = mix(key)            (mix: the SplitMix64 finalizer)
//	h2 = mix(h1) | 1
//	loc_i = (h1 + i·h2) mod M, for i = 0..K-1
//
// This is double hashing on the key itself: blockkey's keys are already
// 64-bit hashes, so the library's murmur pass over their bytes is not needed
// (18 vs 45 ns, docs/reference/libraries.md §2.3). h1 is still remixed, at about 1 ns, so
// that keys with structure cannot cluster the first probe: sequential keys
// measured 1.24% against a 1% target with h1 = key, and 1.01% remixed. h2 is
// forced odd so that, M being a multiple of 64, the step never shares the
// factor 2 with M and never reduces to zero.
//
// Its K probes land anywhere in the filter, so a Test of a digest that is not
// in cache costs up to K cache misses; scheme 2 replaced it as the default.
// Digests in scheme 1 are still read, tested and extended by Apply.
const hashDouble uint8 = 1

func (d *Digest) test1(k blockkey.Key) bool {
	loc, step := d.start(k)
	m := d.h.M
	for range d.h.K {
		if !d.bits.Test(uint(loc)) {
			return false
		}
		loc += step
		if loc >= m {
			loc -= m
		}
	}
	return true
}

func (d *Digest) add1(k blockkey.Key) {
	loc, step := d.start(k)
	m := d.h.M
	for range d.h.K {
		d.bits.Set(uint(loc))
		loc += step
		if loc >= m {
			loc -= m
		}
	}
}

// start returns h1 mod M and h2 mod M. Adding the reduced step and subtracting
// M once yields (h1 + i·h2) mod M exactly with two divisions per key instead
// of K; neither sum overflows because M <= MaxBits.
func (d *Digest) start(k blockkey.Key) (loc, step uint64) {
	h1 := mix(uint64(k))
	h2 := mix(h1) | 1
	return h1 % d.h.M, h2 % d.h.M
}

// mix is the SplitMix64 finalizer, a bijection with full avalanche.
func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
