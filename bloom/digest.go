package bloom

import (
	"math"

	"github.com/bits-and-blooms/bitset"
	bbloom "github.com/bits-and-blooms/bloom/v3"

	"github.com/kvroute/kvroute/blockkey"
)

// HashScheme identifies how a key becomes K bit positions. Scheme 1:
//
//	h1 = mix(key)            (mix: the SplitMix64 finalizer)
//	h2 = mix(h1) | 1
//	loc_i = (h1 + i·h2) mod M, for i = 0..K-1
//
// This is double hashing on the key itself: blockkey's keys are already
// 64-bit hashes, so the library's murmur pass over their bytes is not needed
// (18 vs 45 ns, libraries.md §2.3). h1 is still remixed, at about 1 ns, so
// that keys with structure cannot cluster the first probe: sequential keys
// measured 1.24% against a 1% target with h1 = key, and 1.01% remixed. h2 is
// forced odd so that, M being a multiple of 64, the step never shares the
// factor 2 with M and never reduces to zero. Changing any of this needs a new
// scheme number: a receiver refuses a digest whose scheme it does not know.
const HashScheme uint8 = 1

// Header describes a digest: whose it is, which state of that pod's cache it
// reflects, and how to read its bits.
type Header struct {
	// KeyScheme is the blockkey.Version the keys were computed with. Peers
	// with another key scheme are not compared.
	KeyScheme uint8
	// HashScheme is the bit-location scheme (see the HashScheme constant).
	HashScheme uint8
	// Node is the owning pod's name, at most 255 bytes on the wire.
	Node string
	// Epoch changes when the pod's cache is known to be gone; Version counts
	// changes within an epoch.
	Epoch, Version uint64
	// Count is how many keys were inserted, duplicates included.
	Count uint64
	Params
}

// Digest is an immutable Bloom filter of one pod's routing keys. It is safe
// for concurrent use. A nil or zero Digest is empty: it matches nothing,
// does not marshal, and takes no deltas (ErrGap), so a peer whose digest has
// not arrived yet needs no special case in the caller.
type Digest struct {
	h    Header
	bits *bitset.BitSet // the bbloom filter's bit set, read and written only through here
}

// Build returns the digest of keys. It sets h.HashScheme to HashScheme,
// h.Count to len(keys), a zero h.KeyScheme to blockkey.Version, and moves
// h.Params into range (M a positive multiple of 64 up to MaxBits, K in
// 1..MaxK). Build takes O(M/64 + K·len(keys)).
func Build(h Header, keys []blockkey.Key) *Digest {
	h.Params = normalize(h.Params)
	h.HashScheme = HashScheme
	if h.KeyScheme == 0 {
		h.KeyScheme = blockkey.Version
	}
	h.Count = uint64(len(keys))
	d := newDigest(h, make([]uint64, h.M/64))
	for _, k := range keys {
		d.add(k)
	}
	return d
}

// newDigest wraps words (len M/64, owned by the digest from now on).
func newDigest(h Header, words []uint64) *Digest {
	f := bbloom.From(words, uint(h.K))
	return &Digest{h: h, bits: f.BitSet()}
}

// Header returns the digest's header.
func (d *Digest) Header() Header {
	if d.empty() {
		return Header{}
	}
	return d.h
}

// empty reports whether d is nil or was not made by Build, Unmarshal or Apply.
func (d *Digest) empty() bool { return d == nil || d.bits == nil }

// Len returns the number of keys inserted (Header().Count), duplicates included.
func (d *Digest) Len() int {
	if d.empty() {
		return 0
	}
	return int(min(d.h.Count, math.MaxInt))
}

// FillRatio returns the fraction of bits set. A filter sized for its load
// sits near 0.5; well above that, its false-positive rate has grown past the
// target and the owner should rebuild from its exact index. It costs O(M/64).
func (d *Digest) FillRatio() float64 {
	if d.empty() {
		return 0
	}
	return float64(d.bits.Count()) / float64(d.h.M)
}

// Test reports whether k may be present: false is certain, true is wrong with
// about the false-positive rate the digest was sized for.
func (d *Digest) Test(k blockkey.Key) bool {
	if d.empty() {
		return false
	}
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

// PrefixLen returns how many keys from the start of the chain are present; it
// stops at the first miss, so a false positive past the true prefix extends
// the match only with probability about p per key.
func (d *Digest) PrefixLen(keys []blockkey.Key) int {
	for i, k := range keys {
		if !d.Test(k) {
			return i
		}
	}
	return len(keys)
}

// add sets k's bits; only Build and Apply call it, before the digest is shared.
func (d *Digest) add(k blockkey.Key) {
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
