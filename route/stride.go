package route

import "github.com/kvroute/kvroute/blockkey"

// Strided returns m as a node keying every own vLLM blocks must probe it
// when m's owner keys every peer blocks (blockkey.Scheme.Stride, which
// the peer advertises). Keys are chained per block, so both hold the same
// key at a block position; they differ only in which positions they keep
// (the last block of every run of Stride). So:
//
//   - peer a multiple of own (coarser): the peer holds every (peer/own)-th
//     of our keys; the result probes those and counts a match in our keys;
//   - peer divides own (finer, or equal): the peer holds all of our keys,
//     and m is probed as it is;
//   - otherwise the two share only some positions, never a prefix of
//     ours: the result matches nothing, as a peer of another key scheme.
//
// A stride of 0 or less is not said, and is read as own: m as it is.
// The result is a TierMatcher when m is. A finer peer's lower-tier
// entries (every TierStride of its keys) are then probed every TierStride
// of ours: positions it keeps entries at too, but not all of them, so a
// gap between two probed entries goes unseen (a rolling change of stride
// on pods with a CPU tier, for its minutes).
func Strided(m Matcher, peer, own int) Matcher {
	if m == nil || peer <= 0 || own <= 0 || own%peer == 0 {
		return m
	}
	if peer%own != 0 {
		return unmatched{}
	}
	r := peer / own
	if tm, ok := m.(TierMatcher); ok {
		return coarserTiers{coarser{tm, r}, tm}
	}
	return coarser{m, r}
}

// coarser probes a digest whose keys are every r-th of ours.
type coarser struct {
	m Matcher
	r int
}

// sub returns the keys of ours the peer holds: the last of every run of r.
func (c coarser) sub(keys []blockkey.Key) []blockkey.Key {
	out := make([]blockkey.Key, 0, len(keys)/c.r)
	for i := c.r - 1; i < len(keys); i += c.r {
		out = append(out, keys[i])
	}
	return out
}

func (c coarser) PrefixLen(keys []blockkey.Key) int { return c.r * c.m.PrefixLen(c.sub(keys)) }

type coarserTiers struct {
	coarser
	tm TierMatcher
}

func (c coarserTiers) Ranks() int { return c.tm.Ranks() }

func (c coarserTiers) TierPrefix(keys []blockkey.Key, rank int) (gpu, cpu, disk int) {
	g, cp, d := c.tm.TierPrefix(c.sub(keys), rank)
	return c.r * g, c.r * cp, c.r * d
}

// unmatched is a digest that shares no prefix with our keys.
type unmatched struct{}

func (unmatched) PrefixLen([]blockkey.Key) int { return 0 }
