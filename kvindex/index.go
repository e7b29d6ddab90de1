package kvindex

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// Index is the exact local index. Create it with New.
type Index struct {
	mu  sync.RWMutex
	cfg Config

	ranks []*rankIndex // by data-parallel rank; nil until the rank's first event

	epoch, version uint64
	uncertain      bool
	stats          Stats
	// clock is the latest time seen, in Unix seconds: a batch's ts or
	// Expire's now. swept is when Expire last looked at every block.
	clock, swept float64

	// Per-batch scratch, kept to avoid allocating on every batch.
	touched map[place]uint8 // (rank, key) → its digest entries before the batch (see state)
	order   []place
	dirty   bool      // a clear in this batch emptied a non-empty routing set
	pending []pending // resolved parents whose orphans still need linking
}

// rankIndex is one data-parallel rank's cache: each rank is its own engine
// core with its own blocks and hash seed (vLLM's DP ranks are processes).
type rankIndex struct {
	blocks  map[uint64]block      // vLLM hash held on some tier → where it sits in our chain
	keys    map[blockkey.Key]kset // routing key → hashes carrying it, per tier
	orphans orphans
	recall  recall
	// removes says the tier sent a removal this epoch: it evicts, so its
	// copies are not aged (Config.StoreOnlyTTL).
	removes [numTiers]bool
	held    [numTiers]int // hashes with a copy on each tier
	gpuKeys int           // routing keys with a GPU copy
}

type block struct {
	key  blockkey.Key
	pos  int32
	refs [numTiers]int32 // physical copies per tier
	at   float64         // last store on any tier, Index.clock seconds; 0 unknown
}

// kset is a routing key's resident hashes per tier, and whether its
// position carries lower-tier digest entries (Config.TierStride).
type kset struct {
	n       [numTiers]int32
	aligned bool
}

// state is the digest entries a key has, a bit per tier (1 << tier): its
// GPU's if it holds a GPU copy, and, at an aligned position only, each
// lower tier's that holds a copy. A lower tier's entry stays while the
// GPU also holds the key: a block loaded back from the CPU, and evicted to
// it again, keeps its CPU copy all along, and peers need hear nothing of
// it (when the GPU copy replaced the CPU entry, every such round trip cost
// two more delta keys, and at a CPU tier four times the GPU cache the tier
// cost 25% more upkeep at 16 pods instead of the 12.5% its entries add).
func (s kset) state() uint8 {
	var st uint8
	if s.n[GPU] > 0 {
		st |= 1 << GPU
	}
	if s.aligned {
		for t := CPU; t < numTiers; t++ {
			if s.n[t] > 0 {
				st |= 1 << t
			}
		}
	}
	return st
}

type place struct {
	rank int
	key  blockkey.Key
}

type pending struct {
	hash uint64
	key  blockkey.Key
	pos  int
}

// New returns an empty index at cfg.Epoch.
func New(cfg Config) *Index {
	cfg = cfg.normalized()
	return &Index{
		cfg:     cfg,
		epoch:   cfg.Epoch,
		touched: make(map[place]uint8),
	}
}

func (ix *Index) newRank() *rankIndex {
	return &rankIndex{
		blocks:  make(map[uint64]block),
		keys:    make(map[blockkey.Key]kset),
		orphans: newOrphans(),
		recall:  newRecall(ix.cfg.RecallLimit),
	}
}

// rank returns rank r's index, creating it.
func (ix *Index) rank(r int) *rankIndex {
	for len(ix.ranks) <= r {
		ix.ranks = append(ix.ranks, nil)
	}
	if ix.ranks[r] == nil {
		ix.ranks[r] = ix.newRank()
	}
	return ix.ranks[r]
}

// Apply applies one batch, in the order vLLM published it, to the
// batch's data-parallel rank (DPRank; absent means 0: the subscriber sets
// it from the socket when a vLLM before #18925 leaves it out). Sequencing
// is the caller's: vllmclient's subscriber delivers each stream's batches
// in order, reports gaps (SetUncertain) and restarts (Restart) as items of
// their own, and runs replay. Apply only changes blocks.
func (ix *Index) Apply(b kvevent.Batch) Change {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var ch Change
	ix.apply(b, &ch)
	return ch
}

func (ix *Index) apply(b kvevent.Batch, ch *Change) {
	ix.stats.Batches++
	rank := 0
	if b.DPRank != nil {
		if *b.DPRank < 0 || *b.DPRank >= MaxRanks {
			ix.stats.BadRank++
			for i := range b.Events {
				ch.Ignored += len(b.Events[i].BlockHashes)
			}
			ix.stats.Ignored += uint64(ch.Ignored)
			return
		}
		rank = int(*b.DPRank)
	}
	at := ix.clock
	if b.TS > 0 {
		at = b.TS
		ix.clock = max(ix.clock, b.TS)
	}
	r := ix.rank(rank)
	for i := range b.Events {
		ev := &b.Events[i]
		ix.stats.Events++
		switch ev.Kind {
		case kvevent.BlockStored:
			ix.store(r, rank, ev, at, ch)
		case kvevent.BlockRemoved:
			ix.remove(r, rank, ev, ch)
		case kvevent.AllBlocksCleared:
			ix.reset(rank, ch)
			ch.Cleared = true
			ix.stats.Clears++
		default:
			ix.stats.UnknownEvents++
		}
	}
	if c := ix.cfg.CapacityBlocks; c > 0 && r.held[GPU] > 2*c {
		ch.OverCapacity = true
		ix.uncertain = true
		ix.stats.OverCapacity++
	}
	ix.finish(ch)
}

// finish turns the entries touched in this batch into the net delta.
func (ix *Index) finish(ch *Change) {
	for _, s := range ix.order {
		before, now := ix.touched[s], uint8(0)
		if r := ix.ranks[s.rank]; r != nil {
			now = r.keys[s.key].state()
		}
		for t := GPU; t < numTiers; t++ {
			if before&^now&(1<<t) != 0 {
				ch.remove(Entry{s.key, t, s.rank})
			}
		}
		for t := GPU; t < numTiers; t++ {
			if now&^before&(1<<t) != 0 {
				ch.add(Entry{s.key, t, s.rank})
			}
		}
	}
	if ch.changed() || ix.dirty {
		ix.version++
	}
	clear(ix.touched)
	ix.order = ix.order[:0]
	ix.dirty = false
}

func (ix *Index) store(r *rankIndex, rank int, ev *kvevent.Event, at float64, ch *Change) {
	tier := TierOf(ev.Medium)
	hashes, tokens := ev.BlockHashes, ev.TokenIDs
	if len(tokens) == 0 {
		ix.storeHashes(r, rank, tier, hashes, at, ch)
		return
	}
	bs := ev.BlockSize
	if bs <= 0 {
		bs = ix.cfg.Scheme.BlockSize
	}
	if bs <= 0 {
		ch.Ignored += len(hashes)
		ix.stats.Ignored += uint64(len(hashes))
		return
	}
	if bs != ix.cfg.Scheme.BlockSize {
		ix.stats.BlockSizeMismatch++
	}
	if n := len(tokens) / bs; n < len(hashes) {
		ch.Ignored += len(hashes) - n
		ix.stats.Ignored += uint64(len(hashes) - n)
		hashes = hashes[:n]
	}
	if len(hashes) == 0 {
		return
	}
	tokens = tokens[:len(hashes)*bs]
	extras := eventExtras(ev, len(hashes))
	if ev.Parent == nil {
		lora := ""
		if ev.LoRAName != nil {
			lora = *ev.LoRAName
		}
		ix.link(r, rank, blockkey.ModelRoot(ix.cfg.Model, lora), 0, hashes, tokens, extras, bs, nil, tier, at)
		ix.resolve(r, rank, ch)
		return
	}
	key, pos, ok := r.keyOf(*ev.Parent)
	if !ok {
		n, expired := r.orphans.hold(*ev.Parent, hashes, tokens, extras, bs, tier, at, ix.cfg.OrphanLimit)
		ch.Orphaned += n
		ix.stats.Orphaned += uint64(n)
		ch.Expired += expired
		ix.stats.Expired += uint64(expired)
		return
	}
	ix.link(r, rank, key, pos+1, hashes, tokens, extras, bs, nil, tier, at)
	ix.resolve(r, rank, ch)
}

// keyOf returns the key and position of hash h: held on some tier, or
// remembered since no tier holds it (recall).
func (r *rankIndex) keyOf(h uint64) (blockkey.Key, int, bool) {
	if b, ok := r.blocks[h]; ok {
		return b.key, int(b.pos), true
	}
	if x, ok := r.recall.get(h); ok {
		return x.key, int(x.pos), true
	}
	return 0, 0, false
}

// storeHashes stores the copies of a store with no token ids: a KV
// connector's offload events name block hashes the GPU stored before and
// carry neither tokens nor a parent (api-and-tiers §3.2), so each hash is
// keyed from what the index knows of it, or not at all.
func (ix *Index) storeHashes(r *rankIndex, rank int, tier Tier, hashes []uint64, at float64, ch *Change) {
	for _, h := range hashes {
		key, pos, ok := r.keyOf(h)
		if !ok {
			ch.Unresolved++
			ix.stats.Unresolved++
			continue
		}
		ix.storeOne(r, rank, h, key, pos, tier, at)
	}
}

// link keys a run of blocks after the block with key parent and position
// pos-1, and stores the ones not marked gone. Parents it stores that
// orphans wait for are queued for resolve.
func (ix *Index) link(r *rankIndex, rank int, parent blockkey.Key, pos int, hashes []uint64, tokens []uint32,
	extras [][]string, bs int, gone []bool, tier Tier, at float64) {
	k := parent
	for i, h := range hashes {
		if extras != nil {
			k = blockkey.Extend(k, extras[i])
		}
		k = blockkey.Next(k, tokens[i*bs:(i+1)*bs])
		if gone == nil || !gone[i] {
			ix.storeOne(r, rank, h, k, pos+i, tier, at)
		}
		if r.orphans.waiting(h) {
			ix.pending = append(ix.pending, pending{h, k, pos + i})
		}
	}
}

// resolve links every orphan group whose parent has just been keyed, and
// their descendants in turn (a work list, not recursion: chains of held
// groups can be OrphanLimit deep).
func (ix *Index) resolve(r *rankIndex, rank int, ch *Change) {
	for len(ix.pending) > 0 {
		p := ix.pending[len(ix.pending)-1]
		ix.pending = ix.pending[:len(ix.pending)-1]
		for _, g := range r.orphans.take(p.hash) {
			ch.Resolved += g.live
			ix.stats.Resolved += uint64(g.live)
			ix.link(r, rank, p.key, p.pos+1, g.hashes, g.tokens, g.extras, g.bs, g.gone, g.tier, g.at)
		}
	}
}

// storeOne adds a copy of hash h on tier. Any store renews the age of
// the hash's lower-tier copies (Config.StoreOnlyTTL).
func (ix *Index) storeOne(r *rankIndex, rank int, h uint64, k blockkey.Key, pos int, tier Tier, at float64) {
	ix.stats.Stored++
	b, ok := r.blocks[h]
	if !ok {
		b = block{key: k, pos: int32(pos)}
	}
	if tier == GPU && b.refs[GPU] == 0 {
		// A block stored on the GPU while a lower tier holds it: vLLM
		// loaded it from there (or computed it again).
		switch {
		case b.refs[CPU] > 0:
			ix.stats.Reloads[CPU]++
		case b.refs[Disk] > 0:
			ix.stats.Reloads[Disk]++
		}
	}
	if b.refs[tier] > 0 {
		ix.stats.Duplicates++
	}
	b.refs[tier]++
	if at > 0 || b.at == 0 {
		b.at = at
	}
	r.blocks[h] = b
	if tier != GPU {
		ix.stats.TierStored[tier]++
	}
	if b.refs[tier] > 1 {
		return
	}
	r.held[tier]++
	if !ix.cfg.Scheme.Routed(int(b.pos)) {
		return
	}
	ix.touch(rank, r, b.key)
	s, ok := r.keys[b.key]
	if !ok {
		s.aligned = (int(b.pos)+1)%(max(ix.cfg.Scheme.Stride, 1)*ix.cfg.TierStride) == 0
	}
	if tier == GPU && s.n[GPU] == 0 {
		r.gpuKeys++
	}
	s.n[tier]++
	r.keys[b.key] = s
}

// drop removes copies of h from tier: one, or every one when all is set.
// A hash no tier holds any more is forgotten, but its key is recalled.
func (ix *Index) drop(r *rankIndex, rank int, h uint64, b block, tier Tier, all bool) {
	if all {
		b.refs[tier] = 0
	} else {
		b.refs[tier]--
	}
	if b.refs[tier] > 0 {
		r.blocks[h] = b
		return
	}
	r.held[tier]--
	if b.refs == ([numTiers]int32{}) {
		delete(r.blocks, h)
		r.recall.put(h, b.key, b.pos)
	} else {
		r.blocks[h] = b
	}
	if !ix.cfg.Scheme.Routed(int(b.pos)) {
		return
	}
	ix.touch(rank, r, b.key)
	s := r.keys[b.key]
	s.n[tier]--
	if tier == GPU && s.n[GPU] == 0 {
		r.gpuKeys--
	}
	if s.n == ([numTiers]int32{}) {
		delete(r.keys, b.key)
	} else {
		r.keys[b.key] = s
	}
}

func (ix *Index) remove(r *rankIndex, rank int, ev *kvevent.Event, ch *Change) {
	tier := TierOf(ev.Medium)
	if tier != GPU {
		r.removes[tier] = true
	}
	for _, h := range ev.BlockHashes {
		b, ok := r.blocks[h]
		if !ok || b.refs[tier] == 0 {
			if r.orphans.cancel(h, tier) {
				ix.stats.OrphanRemoved++
				continue
			}
			ch.UnknownRemoved++
			ix.stats.UnknownRemoved++
			continue
		}
		ix.stats.Removed++
		ix.drop(r, rank, h, b, tier, false)
	}
}

// touch records an entry's state before its first change in this batch.
func (ix *Index) touch(rank int, r *rankIndex, k blockkey.Key) {
	s := place{rank, k}
	if _, ok := ix.touched[s]; !ok {
		ix.touched[s] = r.keys[k].state()
		ix.order = append(ix.order, s)
	}
}

// Restart records that vLLM's cache is gone (it restarted, or its engine
// came back from being down): every rank is cleared and the epoch bumped.
func (ix *Index) Restart() Change {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var ch Change
	ix.reset(-1, &ch)
	ch.Restarted = true
	ix.stats.Restarts++
	return ch
}

// reset empties one rank, or every rank when rank < 0, for a new epoch.
// The delta restarts from the empty set: the caller rebuilds from
// Entries, which still has the other ranks'.
func (ix *Index) reset(rank int, ch *Change) {
	for i, r := range ix.ranks {
		if r == nil || (rank >= 0 && i != rank) {
			continue
		}
		if len(r.keys) > 0 {
			ix.dirty = true
		}
		clear(r.blocks)
		clear(r.keys)
		n := r.orphans.expireAll()
		ch.Expired += n
		ix.stats.Expired += uint64(n)
		r.recall.reset()
		r.removes, r.held, r.gpuKeys = [numTiers]bool{}, [numTiers]int{}, 0
	}
	clear(ix.touched)
	ix.order = ix.order[:0]
	ix.epoch++
	ix.uncertain = false
}

// Expire ages out the lower-tier copies Config.StoreOnlyTTL covers (tiers
// that never sent a removal this epoch) whose last store is older than the
// TTL at now, and returns the change. It looks at every block at most
// every TTL/16, so the caller may call it on every tick: a copy goes
// between TTL and 17/16 TTL after its last store. A copy stored with no
// batch time yet is dated now.
func (ix *Index) Expire(now time.Time) Change {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var ch Change
	t := float64(now.UnixNano()) / 1e9
	ix.clock = max(ix.clock, t)
	ttl := ix.cfg.StoreOnlyTTL.Seconds()
	if ttl <= 0 || (ix.swept != 0 && t-ix.swept < ttl/16) {
		return ch
	}
	ix.swept = t
	for rank, r := range ix.ranks {
		if r == nil || (r.held[CPU] == 0 || r.removes[CPU]) && (r.held[Disk] == 0 || r.removes[Disk]) {
			continue
		}
		for h, b := range r.blocks {
			if b.refs[CPU] == 0 && b.refs[Disk] == 0 {
				continue
			}
			if b.at == 0 {
				b.at = t
				r.blocks[h] = b
				continue
			}
			if t-b.at <= ttl {
				continue
			}
			for _, tier := range [...]Tier{CPU, Disk} {
				if b.refs[tier] > 0 && !r.removes[tier] {
					ch.Aged++
					ix.stats.Aged++
					ix.drop(r, rank, h, b, tier, true)
					b = r.blocks[h] // drop may have deleted or changed it
				}
			}
		}
	}
	ix.finish(&ch)
	return ch
}

// ExpireOrphans drops every held orphan and returns how many blocks it
// dropped. The caller calls it once replay is known to be unavailable or
// finished: the parents will not come.
func (ix *Index) ExpireOrphans() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	n := 0
	for _, r := range ix.ranks {
		if r != nil {
			n += r.orphans.expireAll()
		}
	}
	ix.stats.Expired += uint64(n)
	return n
}

// SetUncertain marks (or clears) the index as possibly inexact, e.g. after
// a gap that replay could not fill. A clear or restart resets it.
func (ix *Index) SetUncertain(u bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.uncertain = u
}

// Uncertain reports whether events may have been lost since the last
// clear or restart.
func (ix *Index) Uncertain() bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.uncertain
}

// Keys returns the routing keys held on a GPU, of any rank, sorted and
// each once.
func (ix *Index) Keys() []blockkey.Key {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var ks []blockkey.Key
	for _, r := range ix.ranks {
		if r == nil {
			continue
		}
		if ks == nil {
			ks = make([]blockkey.Key, 0, r.gpuKeys)
		}
		for k, s := range r.keys {
			if s.n[GPU] > 0 {
				ks = append(ks, k)
			}
		}
	}
	if ks == nil {
		ks = []blockkey.Key{}
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// Entries returns every digest entry (Entry), sorted by rank, tier and
// key: what a full digest of the index holds (cachestate tags each with
// bloom.Tag).
func (ix *Index) Entries() []Entry {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := 0
	for _, r := range ix.ranks {
		if r != nil {
			n += len(r.keys)
		}
	}
	es := make([]Entry, 0, n)
	for rank, r := range ix.ranks {
		if r == nil {
			continue
		}
		for k, s := range r.keys {
			st := s.state()
			for t := GPU; t < numTiers; t++ {
				if st&(1<<t) != 0 {
					es = append(es, Entry{k, t, rank})
				}
			}
		}
	}
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Key, b.Key))
	})
	return es
}

// Ranks returns 1 plus the highest data-parallel rank that sent an event
// (at least 1): the ranks a digest of the index describes.
func (ix *Index) Ranks() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return max(len(ix.ranks), 1)
}

// TierStride returns Config.TierStride as normalized.
func (ix *Index) TierStride() int { return ix.cfg.TierStride }

// Contains reports whether routing key k is held on a GPU, of any rank.
func (ix *Index) Contains(k blockkey.Key) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, r := range ix.ranks {
		if r != nil && r.keys[k].n[GPU] > 0 {
			return true
		}
	}
	return false
}

// PrefixLen returns how many of keys, from the start, one rank holds on
// its GPU, the most of any rank: the prefix this pod could serve from its
// GPU cache (keys from Scheme.Request).
func (ix *Index) PrefixLen(keys []blockkey.Key) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	best := 0
	for _, r := range ix.ranks {
		if r != nil {
			best = max(best, r.prefix(keys))
		}
	}
	return best
}

func (r *rankIndex) prefix(keys []blockkey.Key) int {
	for i, k := range keys {
		if r.keys[k].n[GPU] == 0 {
			return i
		}
	}
	return len(keys)
}

// TierPrefix returns how many leading keys rank holds on its GPU, and of
// the keys after them how many it holds on its CPU and on disk, to the
// first key held on neither: exactly, key by key (a digest knows lower
// tiers only every TierStride keys). It is route's TierMatcher, for a
// router with an exact index of each pod.
func (ix *Index) TierPrefix(keys []blockkey.Key, rank int) (gpu, cpu, disk int) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if rank < 0 || rank >= len(ix.ranks) || ix.ranks[rank] == nil {
		return 0, 0, 0
	}
	r := ix.ranks[rank]
	gpu = r.prefix(keys)
	for _, k := range keys[gpu:] {
		switch s := r.keys[k]; {
		case s.n[CPU] > 0:
			cpu++
		case s.n[Disk] > 0:
			disk++
		default:
			return gpu, cpu, disk
		}
	}
	return gpu, cpu, disk
}

// Len returns the number of routing keys held on a GPU, summed over ranks.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := 0
	for _, r := range ix.ranks {
		if r != nil {
			n += r.gpuKeys
		}
	}
	return n
}

// Blocks returns the number of distinct vLLM hashes resident on a GPU,
// summed over ranks.
func (ix *Index) Blocks() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.heldLocked(GPU)
}

func (ix *Index) heldLocked(t Tier) int {
	n := 0
	for _, r := range ix.ranks {
		if r != nil {
			n += r.held[t]
		}
	}
	return n
}

// Epoch changes whenever the cache is known to be gone (clear, restart).
func (ix *Index) Epoch() uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.epoch
}

// Version increments with every batch that changes the digest entries,
// across epochs.
func (ix *Index) Version() uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.version
}

// Stats returns current sizes and lifetime counters.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := ix.stats
	s.Blocks, s.Keys, s.Orphans = ix.heldLocked(GPU), 0, 0
	for t := range numTiers {
		s.TierBlocks[t] = ix.heldLocked(t)
	}
	for _, r := range ix.ranks {
		if r != nil {
			s.Keys += r.gpuKeys
			s.Orphans += r.orphans.blocks
			s.Entries += len(r.keys)
		}
	}
	s.Ranks = max(len(ix.ranks), 1)
	s.Epoch, s.Version, s.Uncertain = ix.epoch, ix.version, ix.uncertain
	return s
}

// Resident returns every hash resident on a GPU, sorted by rank and hash;
// Refs counts its GPU copies.
func (ix *Index) Resident() []Resident { return ix.Held(GPU) }

// Held returns every hash with a copy on tier, sorted by rank and hash;
// Refs counts its copies there.
func (ix *Index) Held(t Tier) []Resident {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var rs []Resident
	if t >= numTiers {
		return rs
	}
	rs = make([]Resident, 0, ix.heldLocked(t))
	for rank, r := range ix.ranks {
		if r == nil {
			continue
		}
		for h, b := range r.blocks {
			if b.refs[t] > 0 {
				rs = append(rs, Resident{Hash: h, Key: b.key, Pos: int(b.pos), Refs: int(b.refs[t]), Rank: rank})
			}
		}
	}
	slices.SortFunc(rs, func(a, b Resident) int {
		return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.Hash, b.Hash))
	})
	return rs
}
