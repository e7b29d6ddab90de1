package kvindex

import "github.com/kvroute/kvroute/blockkey"

// Change is what one batch did to the index: the digest delta and the
// epoch events the caller must act on.
type Change struct {
	// Added and Removed are the routing keys held on rank 0's GPU whose
	// presence changed in this batch (net: a key added and removed again
	// within the batch is in neither), each at most once, in the order
	// first touched. After a clear or restart they are relative to the
	// empty set: the caller rebuilds from Entries() in the new epoch.
	Added, Removed []blockkey.Key
	// TierAdded and TierRemoved are the same for every other digest entry:
	// a key on another rank's GPU, or on a lower tier at an aligned
	// position (Config.TierStride), whether or not the GPU holds it too.
	// A key offloaded to the CPU is in TierAdded when the CPU stores it,
	// and in Removed when the GPU evicts it. Both stay empty for an engine
	// with one rank and no offloading, whose digest is then what it was
	// before tiers were indexed.
	TierAdded, TierRemoved []Entry
	// Restarted: Restart cleared the index and bumped the epoch.
	Restarted bool
	// Cleared: the batch held AllBlocksCleared (which clears the batch's
	// rank); the epoch was bumped.
	Cleared bool
	// OverCapacity: a rank's GPU-resident hashes exceed 2*CapacityBlocks
	// after this batch; the index is now marked uncertain.
	OverCapacity bool
	// Orphaned blocks were held aside for an unseen parent; Resolved held
	// blocks found their parent and entered the index; Expired held blocks
	// were dropped (OrphanLimit, clear or restart).
	Orphaned, Resolved, Expired int
	// Ignored blocks were not indexed: hashes beyond the token ids sent,
	// or a batch from a rank out of range.
	Ignored int
	// Unresolved counts hash-only stores (a connector's offload events
	// carry no token ids) of hashes the index has no key for.
	Unresolved int
	// Aged counts lower-tier copies dropped by Config.StoreOnlyTTL.
	Aged int
	// UnknownRemoved counts removals of copies the index did not hold.
	UnknownRemoved int
}

func (ch *Change) add(e Entry) {
	if e.Tier == GPU && e.Rank == 0 {
		ch.Added = append(ch.Added, e.Key)
		return
	}
	ch.TierAdded = append(ch.TierAdded, e)
}

func (ch *Change) remove(e Entry) {
	if e.Tier == GPU && e.Rank == 0 {
		ch.Removed = append(ch.Removed, e.Key)
		return
	}
	ch.TierRemoved = append(ch.TierRemoved, e)
}

func (ch *Change) changed() bool {
	return len(ch.Added)+len(ch.Removed)+len(ch.TierAdded)+len(ch.TierRemoved) > 0
}

// Stats are the index's current sizes and lifetime counters (blocks unless
// named otherwise), for metrics. Sizes are summed over ranks.
type Stats struct {
	// Blocks are hashes resident on a GPU, Keys the routing keys held on
	// a GPU; TierBlocks counts hashes with a copy on each tier, and
	// Entries the digest entries (every tier and rank).
	Blocks, Keys, Orphans int
	TierBlocks            [numTiers]int
	Entries, Ranks        int
	Epoch, Version        uint64
	Uncertain             bool

	Batches, Events, UnknownEvents             uint64
	Stored, Duplicates, Removed, Ignored       uint64
	UnknownRemoved                             uint64
	Orphaned, Resolved, Expired, OrphanRemoved uint64
	// TierStored counts copies stored on each lower tier (GPU stays 0:
	// Stored counts every tier). Reloads counts blocks stored on the GPU
	// while a lower tier held them and the GPU did not, by that tier: vLLM
	// loaded them from it (or computed them again): the tier's hits.
	TierStored, Reloads [numTiers]uint64
	// Unresolved and Aged are Change's, summed.
	Unresolved, Aged uint64
	// Restarts, Clears and OverCapacity count batches.
	Restarts, Clears, OverCapacity uint64
	// BadRank counts batches from a data-parallel rank out of range.
	BadRank uint64
	// BlockSizeMismatch counts BlockStored events whose block_size differs
	// from Config.Scheme.BlockSize: their keys cannot match requests.
	BlockSizeMismatch uint64
}

// Resident is one vLLM hash the index holds on a tier (for tests against
// the simulator's ground truth).
type Resident struct {
	Hash uint64
	Key  blockkey.Key
	Pos  int
	Refs int
	Rank int
}
