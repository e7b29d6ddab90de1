package bloom

import (
	"math"

	"github.com/bits-and-blooms/bitset"
	bbloom "github.com/bits-and-blooms/bloom/v3"

	"github.com/kvroute/kvroute/blockkey"
)

// HashScheme is the bit-location scheme Build uses by default: 2, the
// cache-line-blocked filter (hash2.go). Scheme 1 (hash1.go), double hashing
// over the whole filter, is still read, tested and extended, so digests from
// peers not yet upgraded keep matching; a peer that knows only scheme 1
// refuses scheme 2 digests (ErrUnsupported), and so degrades to load-based
// routing for the upgraded pods until it is upgraded too. Changing how either
// scheme maps a key to bits needs a new scheme number.
const HashScheme = hashBlocked

// knownScheme reports whether this build can read digests in scheme s.
func knownScheme(s uint8) bool { return s == hashDouble || s == hashBlocked }

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
	// gone holds the keys removed since the digest was built (gone.go):
	// sorted, each once, every one's bits set; nil for a fresh build.
	gone []blockkey.Key
	// tierStride and ranks are read from the markers once the bits are
	// final (tier.go): 0 and 1 for a pod with one rank and no lower tier.
	tierStride, ranks int
}

// Build returns the digest of keys. It keeps h.HashScheme when it is a
// scheme this build knows (1 or 2, so a cluster can keep building scheme 1
// while old peers remain) and sets it to HashScheme otherwise. It sets h.Count
// to len(keys) and a zero h.KeyScheme to blockkey.Version, and moves h.Params
// into range: M a positive multiple of 64 (512 for scheme 2) up to MaxBits, K
// in 1..MaxK. Build takes O(M/64 + K·len(keys)).
func Build(h Header, keys []blockkey.Key) *Digest {
	if !knownScheme(h.HashScheme) {
		h.HashScheme = HashScheme
	}
	h.Params = normalize(h.Params, h.HashScheme)
	if h.KeyScheme == 0 {
		h.KeyScheme = blockkey.Version
	}
	h.Count = uint64(len(keys))
	d := newDigest(h, make([]uint64, h.M/64))
	for _, k := range keys {
		d.add(k)
	}
	d.scan()
	return d
}

// newDigest wraps words (len M/64, owned by the digest from now on).
func newDigest(h Header, words []uint64) *Digest {
	f := bbloom.From(words, uint(h.K))
	d := &Digest{h: h, bits: f.BitSet()}
	d.scan()
	return d
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
// about the false-positive rate the digest was sized for. A key removed
// since the digest was built (gone.go) is absent.
func (d *Digest) Test(k blockkey.Key) bool {
	if !d.testBits(k) {
		return false
	}
	return len(d.gone) == 0 || !d.isGone(k)
}

// testBits is Test of the bits alone.
func (d *Digest) testBits(k blockkey.Key) bool {
	switch {
	case d.empty():
		return false
	case d.h.HashScheme == hashDouble:
		return d.test1(k)
	}
	return d.test2(k)
}

// PrefixLen returns how many keys from the start of the chain are present; it
// stops at the first miss, so a false positive past the true prefix extends
// the match only with probability about p per key.
func (d *Digest) PrefixLen(keys []blockkey.Key) int {
	if !d.empty() && d.h.HashScheme != hashDouble && len(d.gone) == 0 {
		// Test's case for most digests, without its two calls a key: a
		// long match (a group's tail, PrefixLens) walks hundreds.
		for i, k := range keys {
			if !d.test2(k) {
				return i
			}
		}
		return len(keys)
	}
	for i, k := range keys {
		if !d.Test(k) {
			return i
		}
	}
	return len(keys)
}

// add sets k's bits; only Build and Apply call it, before the digest is shared.
func (d *Digest) add(k blockkey.Key) {
	if d.h.HashScheme == hashDouble {
		d.add1(k)
		return
	}
	d.add2(k)
}
