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
// exception). gone is not modified.
func nextGone(gone, removed, added []blockkey.Key, has func(blockkey.Key) bool) []blockkey.Key {
	if len(removed) == 0 && len(gone) == 0 {
		return nil
	}
	out := make([]blockkey.Key, 0, len(gone)+len(removed))
	out = append(out, gone...)
	for _, k := range removed {
		if has(k) {
			out = append(out, k)
		}
	}
	if len(removed) > 0 {
		slices.Sort(out)
		out = slices.Compact(out)
	}
	if len(added) > 0 && len(out) > 0 {
		a := slices.Clone(added)
		slices.Sort(a)
		out = slices.DeleteFunc(out, func(k blockkey.Key) bool {
			_, ok := slices.BinarySearch(a, k)
			return ok
		})
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
