package bloom

import "github.com/kvroute/kvroute/blockkey"

// Tiers and data-parallel ranks share the one digest a pod sends.
//
// A digest holds one entry per routing key the pod holds, named by where
// the pod holds it: the key itself for a block in rank 0's GPU cache, and
// Tag(key, tier, rank) for any other place (another rank's GPU; a lower
// tier, CPU or disk, of a block that rank no longer holds on its GPU). So:
//
//   - A pod with one rank and no lower tier advertises exactly the digest
//     it did before tiers existed: no byte and no test more, and peers of
//     an earlier version read it as they always did.
//   - A block that vLLM moves from the GPU to the CPU (a GPU removal while
//     the offloaded copy stays) replaces one entry with another: the load
//     of the filter stays the number of routing keys held, instead of a
//     second filter per tier, which would double the full-digest traffic.
//   - A peer looks a chain up as key|GPU and, past the GPU prefix,
//     key|CPU then key|Disk (TierPrefix), per rank.
//
// Lower-tier entries are kept only at every TierStride-th routing key
// (kvindex.Config.TierStride, default 8: 512 tokens at the default scheme,
// two of LMCache's default chunks): a CPU tier is typically several times the GPU
// cache, and at one entry per routing key it would multiply the digest,
// while a lower-tier token is credited well below a GPU one (route's
// CPUCost), so its match needs less resolution. A pod says that it holds
// lower-tier entries, and at which stride, with a marker key
// (TierMarker), and which ranks it runs with one per rank above 0
// (RankMarker); a digest reads them once, when it is built, decoded or
// extended, so a lookup in a digest without them costs nothing extra. A
// marker's false positive (about the digest's rate) only costs that
// peer's lookups a few tests more.
//
// Tag, TierMarker and RankMarker are part of the digest format: changing
// them needs a new FormatVersion.

// Tier numbers as Tag takes them (kvindex.Tier has the same values).
const (
	TierGPU  uint8 = 0
	TierCPU  uint8 = 1
	TierDisk uint8 = 2
)

// MaxRanks bounds the data-parallel ranks a digest can describe (and the
// markers a digest is scanned for).
const MaxRanks = 256

// minTierEntries is the fewest lower-tier entries TierPrefix counts as an
// extension: one lower-tier entry stands for TierStride routing keys, so a
// single false positive past the GPU prefix would credit that many keys.
// Two consecutive ones are as unlikely as the two-key match route's
// MinMatchKeys asks of a GPU prefix.
const minTierEntries = 2

// tierStrides are the strides a digest is scanned for, the default first,
// so that a marker false positive cannot mislead a default deployment.
var tierStrides = [...]int{8, 1, 2, 4, 16}

// TierStrideOK reports whether stride s can be advertised.
func TierStrideOK(s int) bool {
	for _, x := range tierStrides {
		if x == s {
			return true
		}
	}
	return false
}

const tagSeed uint64 = 0x6b76726f75746574 // "kvroutet"

// Tag returns the digest entry for routing key k held on tier of rank:
// k itself for rank 0's GPU, else a remix of k with (tier, rank), which
// for a fixed place is a bijection of k.
func Tag(k blockkey.Key, tier uint8, rank int) blockkey.Key {
	if tier == TierGPU && rank == 0 {
		return k
	}
	return blockkey.Key(mix(uint64(k) ^ mix(tagSeed+uint64(tier)<<32+uint64(uint32(rank)))))
}

// TierMarker is the key a digest holds when the pod has lower-tier
// entries at stride routing keys.
func TierMarker(stride int) blockkey.Key {
	return blockkey.Key(mix(tagSeed ^ 0x7469657273 ^ uint64(uint32(stride))<<40))
}

// RankMarker is the key a digest holds for each data-parallel rank above 0
// the pod runs (rank 0 is always there).
func RankMarker(rank int) blockkey.Key {
	return blockkey.Key(mix(tagSeed ^ 0x72616e6b ^ uint64(uint32(rank))<<40))
}

// scan reads the markers into the digest; Build, Apply and newDigest call
// it once the bits are final.
func (d *Digest) scan() {
	d.tierStride, d.ranks = 0, 1
	for _, s := range tierStrides {
		if d.Test(TierMarker(s)) {
			d.tierStride = s
			break
		}
	}
	for d.ranks < MaxRanks && d.Test(RankMarker(d.ranks)) {
		d.ranks++
	}
}

// Ranks returns how many data-parallel ranks the digest describes: 1 plus
// the consecutive rank markers it holds from rank 1.
func (d *Digest) Ranks() int {
	if d.empty() {
		return 1
	}
	return d.ranks
}

// TierStride returns the stride of the digest's lower-tier entries, in
// routing keys, or 0 when it holds none.
func (d *Digest) TierStride() int {
	if d.empty() {
		return 0
	}
	return d.tierStride
}

// TierPrefix returns how many leading keys rank holds on its GPU, and how
// many of the keys after them it holds on the CPU and on disk. The
// lower-tier extension is read at every TierStride-th key only (the
// positions that carry lower-tier entries), each entry standing for the
// keys since the previous one; it ends at the first such position held on
// neither tier, and counts only with at least two entries (minTierEntries).
// Lower tiers are credited only beyond the GPU prefix, as Dynamo does: a
// block on both is a GPU block. For rank 0, gpu equals PrefixLen(keys).
func (d *Digest) TierPrefix(keys []blockkey.Key, rank int) (gpu, cpu, disk int) {
	if d.empty() || rank < 0 {
		return 0, 0, 0
	}
	for gpu < len(keys) && d.Test(Tag(keys[gpu], TierGPU, rank)) {
		gpu++
	}
	s := d.tierStride
	if s == 0 || gpu == len(keys) {
		return gpu, 0, 0
	}
	end, entries := gpu, 0
walk:
	for j := (gpu/s+1)*s - 1; j < len(keys); j += s {
		switch {
		case d.Test(Tag(keys[j], TierCPU, rank)):
			cpu += j + 1 - end
		case d.Test(Tag(keys[j], TierDisk, rank)):
			disk += j + 1 - end
		default:
			break walk
		}
		end = j + 1
		entries++
	}
	if entries < minTierEntries {
		return gpu, 0, 0
	}
	return gpu, cpu, disk
}
