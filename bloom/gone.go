package bloom

import (
	"slices"

	"github.com/kvroute/kvroute/blockkey"
)

// Removals.
//
// A Bloom filter cannot delete, so a digest carries, beside its bits, the
// keys removed since it was built (gone): sorted, each once, and only keys
// whose bits are set (a key the bits do not hold needs no exception). Test
// answers false for them. A delta carries removals (Delta.Removed) as well
// as additions, so an evicted block leaves peers' views with the delta that
// says so, within the publish interval, instead of waiting for the owner's
// next rebuild; the owner rebuilds from its exact index only when its
// removals since the last build pass a bound (cachestate's RebuildRemoved),
// which is also what bounds gone, and the load of the bits, between builds.
//
// A digest with no removals has the wire form and the bytes it had before
// removals existed (format 1); one with removals takes format 2, which a
// peer of wire version 1 cannot read (MarshalV1 writes it the bits alone).

// MaxGone bounds the removals one digest carries (8 MiB of keys), so a
// hostile frame cannot make a receiver allocate without bound; an owner
// rebuilds long before (Apply fails with ErrGap past it).
const MaxGone = 1 << 20

// isGone reports whether k is among d's removals.
func (d *Digest) isGone(k blockkey.Key) bool {
	_, ok := slices.BinarySearch(d.gone, k)
	return ok
}

// Removed returns how many keys d carries as removed since it was built.
func (d *Digest) Removed() int {
	if d.empty() {
		return 0
	}
	return len(d.gone)
}

// nextGone returns gone with removed added and added taken out, sorted and
// each once, keeping only removals whose bits has reports set (has sees
// the new bits: a key re-added and removed again in later deltas stays an
// exception). gone is not modified. It costs one pass over gone plus a
// sort of the delta's own keys (three sorted lists merged): a peer applies every delta of every pod.
func nextGone(gone, removed, added []blockkey.Key, has func(blockkey.Key) bool) []blockkey.Key {
	if len(removed) == 0 && len(gone) == 0 {
		return nil
	}
	var rem []blockkey.Key
	for _, k := range removed {
		if has(k) {
			rem = append(rem, k)
		}
	}
	slices.Sort(rem)
	var add []blockkey.Key
	if len(added) > 0 {
		add = slices.Clone(added)
		slices.Sort(add)
	}
	out := make([]blockkey.Key, 0, len(gone)+len(rem))
	i, j, a := 0, 0, 0
	for i < len(gone) || j < len(rem) {
		var k blockkey.Key
		switch {
		case j == len(rem) || (i < len(gone) && gone[i] < rem[j]):
			k, i = gone[i], i+1
		case i == len(gone) || rem[j] < gone[i]:
			k, j = rem[j], j+1
		default: // equal
			k, i, j = gone[i], i+1, j+1
		}
		if n := len(out); n > 0 && out[n-1] == k {
			continue
		}
		for a < len(add) && add[a] < k {
			a++
		}
		if a < len(add) && add[a] == k {
			continue
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
