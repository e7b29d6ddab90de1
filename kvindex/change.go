package kvindex

import "github.com/kvroute/kvroute/blockkey"

// Change is what one batch did to the index: the digest delta and the
// epoch events the caller must act on.
type Change struct {
	// Added and Removed are the routing keys whose presence in the routing
	// set changed in this batch (net: a key added and removed again within
	// the batch is in neither), each at most once, in the order first
	// touched. After a clear or restart they are relative to the empty set:
	// the caller rebuilds from Keys() in the new epoch.
	Added, Removed []blockkey.Key
	// Restarted: Restart cleared the index and bumped the epoch.
	Restarted bool
	// Cleared: the batch held AllBlocksCleared; the epoch was bumped.
	Cleared bool
	// OverCapacity: resident hashes exceed 2*CapacityBlocks after this batch;
	// the index is now marked uncertain.
	OverCapacity bool
	// Orphaned blocks were held aside for an unseen parent; Resolved held
	// blocks found their parent and entered the index; Expired held blocks
	// were dropped (OrphanLimit, clear or restart).
	Orphaned, Resolved, Expired int
	// Ignored blocks were not GPU-resident (medium other than GPU, no token
	// ids, or hashes beyond the token ids sent).
	Ignored int
	// UnknownRemoved counts removals of hashes the index did not hold.
	UnknownRemoved int
}

// Stats are the index's current sizes and lifetime counters (blocks unless
// named otherwise), for metrics.
type Stats struct {
	Blocks, Keys, Orphans int
	Epoch, Version        uint64
	Uncertain             bool

	Batches, Events, UnknownEvents             uint64
	Stored, Duplicates, Removed, Ignored       uint64
	UnknownRemoved                             uint64
	Orphaned, Resolved, Expired, OrphanRemoved uint64
	// Restarts, Clears and OverCapacity count batches.
	Restarts, Clears, OverCapacity uint64
	// BlockSizeMismatch counts BlockStored events whose block_size differs
	// from Config.Scheme.BlockSize: their keys cannot match requests.
	BlockSizeMismatch uint64
}

// Resident is one vLLM hash the index holds (for tests against the
// simulator's ground truth).
type Resident struct {
	Hash uint64
	Key  blockkey.Key
	Pos  int
	Refs int
}
