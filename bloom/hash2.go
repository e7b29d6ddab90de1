package bloom

import (
	"math/bits"

	"github.com/kvroute/kvroute/blockkey"
)

// Hash scheme 2, a blocked Bloom filter: the filter is M/512 blocks of 512
// bits (one 64-byte cache line each) and a key sets and tests its K bits
// inside one block:
//
//	h1    = mix(key)
//	block = ⌊h1 · (M/512) / 2^64⌋       (the high word of the 128-bit product)
//	r_j   = mix(h1 + (j+1)·γ)           (γ = 0x9e3779b97f4a7c15: SplitMix64 seeded with h1)
//	bit_i = bits 9(i mod 7) .. 9(i mod 7)+8 of r_⌊i/7⌋, for i = 0..K-1
//
// Bit b of a block is bit b mod 64 of its word b/64, the block's words being
// words 8·block .. 8·block+7 of the filter. A Test of a digest that is not in
// cache costs one miss instead of K (docs/design.md D4: 64 peers' digests are
// 7.7 MB, far more than a core's cache). The price is a higher false-positive
// rate at the same M, since blocks fill unevenly; ParamsFor compensates.
// The block comes from h1's high bits and the positions from fresh mixes, so
// the two are independent; positions may repeat within a key, which the
// sizing model in ParamsFor accounts for.
const hashBlocked uint8 = 2

const (
	blockBits         = 512
	blockWords        = blockBits / 64
	posBits           = 9 // log2(blockBits)
	posPerMix         = 64 / posBits
	golden     uint64 = 0x9e3779b97f4a7c15
)

// block returns the words of h1's block. M is a positive multiple of
// blockBits for this scheme (Build and Unmarshal ensure it).
func (d *Digest) block(h1 uint64) *[blockWords]uint64 {
	i, _ := bits.Mul64(h1, d.h.M/blockBits)
	return (*[blockWords]uint64)(d.bits.Words()[i*blockWords:])
}

func (d *Digest) test2(k blockkey.Key) bool {
	h1 := mix(uint64(k))
	b := d.block(h1)
	seed, r := h1, uint64(0)
	for i := range d.h.K {
		if i%posPerMix == 0 {
			seed += golden
			r = mix(seed)
		}
		if b[r>>6&(blockWords-1)]&(1<<(r&63)) == 0 {
			return false
		}
		r >>= posBits
	}
	return true
}

func (d *Digest) add2(k blockkey.Key) {
	h1 := mix(uint64(k))
	b := d.block(h1)
	seed, r := h1, uint64(0)
	for i := range d.h.K {
		if i%posPerMix == 0 {
			seed += golden
			r = mix(seed)
		}
		b[r>>6&(blockWords-1)] |= 1 << (r & 63)
		r >>= posBits
	}
}
