package kvindex

import (
	"slices"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// Index is the exact local index. Create it with New.
type Index struct {
	mu  sync.RWMutex
	cfg Config

	blocks  map[uint64]entry     // resident vLLM hash → where it sits in our chain
	keys    map[blockkey.Key]int // routing key → resident hashes carrying it
	orphans orphans

	epoch, version uint64
	uncertain      bool
	stats          Stats

	// Per-batch scratch, kept to avoid allocating on every batch.
	touched map[blockkey.Key]bool // key → present before the batch
	order   []blockkey.Key
	dirty   bool      // a clear in this batch emptied a non-empty routing set
	pending []pending // resolved parents whose orphans still need linking
}

type entry struct {
	key  blockkey.Key
	pos  int
	refs int
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
		blocks:  make(map[uint64]entry),
		keys:    make(map[blockkey.Key]int),
		orphans: newOrphans(),
		epoch:   cfg.Epoch,
		touched: make(map[blockkey.Key]bool),
	}
}

// Apply applies one batch, in the order vLLM published it. Sequencing is
// the caller's: vllmclient's subscriber delivers each stream's batches in
// order, reports gaps (SetUncertain) and restarts (Restart) as items of
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
	for i := range b.Events {
		ev := &b.Events[i]
		ix.stats.Events++
		switch ev.Kind {
		case kvevent.BlockStored:
			ix.store(ev, ch)
		case kvevent.BlockRemoved:
			ix.remove(ev, ch)
		case kvevent.AllBlocksCleared:
			ix.reset(ch)
			ch.Cleared = true
			ix.stats.Clears++
		default:
			ix.stats.UnknownEvents++
		}
	}
	if c := ix.cfg.CapacityBlocks; c > 0 && len(ix.blocks) > 2*c {
		ch.OverCapacity = true
		ix.uncertain = true
		ix.stats.OverCapacity++
	}
	ix.finish(ch)
}

// finish turns the keys touched in this batch into the net delta.
func (ix *Index) finish(ch *Change) {
	for _, k := range ix.order {
		before, now := ix.touched[k], ix.keys[k] > 0
		switch {
		case now && !before:
			ch.Added = append(ch.Added, k)
		case before && !now:
			ch.Removed = append(ch.Removed, k)
		}
	}
	if len(ch.Added) > 0 || len(ch.Removed) > 0 || ix.dirty {
		ix.version++
	}
	clear(ix.touched)
	ix.order = ix.order[:0]
	ix.dirty = false
}

// gpu reports whether an event's medium is the GPU cache (nil means GPU:
// vLLM before #19737 sends none).
func gpu(m *string) bool { return m == nil || strings.EqualFold(*m, "GPU") }

func (ix *Index) store(ev *kvevent.Event, ch *Change) {
	hashes, tokens := ev.BlockHashes, ev.TokenIDs
	bs := ev.BlockSize
	if bs <= 0 {
		bs = ix.cfg.Scheme.BlockSize
	}
	if !gpu(ev.Medium) || len(tokens) == 0 || bs <= 0 {
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
	switch {
	case ev.Parent == nil:
		lora := ""
		if ev.LoRAName != nil {
			lora = *ev.LoRAName
		}
		ix.link(blockkey.ModelRoot(ix.cfg.Model, lora), 0, hashes, tokens, extras, bs, nil)
	default:
		p, ok := ix.blocks[*ev.Parent]
		if !ok {
			ix.hold(*ev.Parent, hashes, tokens, extras, bs, ch)
			return
		}
		ix.link(p.key, p.pos+1, hashes, tokens, extras, bs, nil)
	}
	ix.resolve(ch)
}

// link keys a run of blocks after the block with key parent and position
// pos-1, and stores the ones not marked gone. Parents it stores that
// orphans wait for are queued for resolve.
func (ix *Index) link(parent blockkey.Key, pos int, hashes []uint64, tokens []uint32, extras [][]string, bs int, gone []bool) {
	k := parent
	for i, h := range hashes {
		if extras != nil {
			k = blockkey.Extend(k, extras[i])
		}
		k = blockkey.Next(k, tokens[i*bs:(i+1)*bs])
		if gone == nil || !gone[i] {
			ix.storeOne(h, k, pos+i)
		}
		if ix.orphans.waiting(h) {
			ix.pending = append(ix.pending, pending{h, k, pos + i})
		}
	}
}

// resolve links every orphan group whose parent has just been keyed, and
// their descendants in turn (a work list, not recursion: chains of held
// groups can be OrphanLimit deep).
func (ix *Index) resolve(ch *Change) {
	for len(ix.pending) > 0 {
		p := ix.pending[len(ix.pending)-1]
		ix.pending = ix.pending[:len(ix.pending)-1]
		for _, g := range ix.orphans.take(p.hash) {
			ch.Resolved += g.live
			ix.stats.Resolved += uint64(g.live)
			ix.link(p.key, p.pos+1, g.hashes, g.tokens, g.extras, g.bs, g.gone)
		}
	}
}

func (ix *Index) storeOne(h uint64, k blockkey.Key, pos int) {
	ix.stats.Stored++
	if e, ok := ix.blocks[h]; ok {
		e.refs++
		ix.blocks[h] = e
		ix.stats.Duplicates++
		return
	}
	ix.blocks[h] = entry{key: k, pos: pos, refs: 1}
	if ix.cfg.Scheme.Routed(pos) {
		if ix.keys[k] == 0 {
			ix.touch(k, false)
		}
		ix.keys[k]++
	}
}

func (ix *Index) remove(ev *kvevent.Event, ch *Change) {
	if !gpu(ev.Medium) {
		ch.Ignored += len(ev.BlockHashes)
		ix.stats.Ignored += uint64(len(ev.BlockHashes))
		return
	}
	for _, h := range ev.BlockHashes {
		e, ok := ix.blocks[h]
		if !ok {
			if ix.orphans.cancel(h) {
				ix.stats.OrphanRemoved++
				continue
			}
			ch.UnknownRemoved++
			ix.stats.UnknownRemoved++
			continue
		}
		ix.stats.Removed++
		if e.refs--; e.refs > 0 {
			ix.blocks[h] = e
			continue
		}
		delete(ix.blocks, h)
		if ix.cfg.Scheme.Routed(e.pos) {
			if ix.keys[e.key]--; ix.keys[e.key] <= 0 {
				ix.touch(e.key, true)
				delete(ix.keys, e.key)
			}
		}
	}
}

// touch records a key's presence before its first change in this batch.
func (ix *Index) touch(k blockkey.Key, present bool) {
	if _, ok := ix.touched[k]; !ok {
		ix.touched[k] = present
		ix.order = append(ix.order, k)
	}
}

func (ix *Index) hold(parent uint64, hashes []uint64, tokens []uint32, extras [][]string, bs int, ch *Change) {
	n, expired := ix.orphans.hold(parent, hashes, tokens, extras, bs, ix.cfg.OrphanLimit)
	ch.Orphaned += n
	ix.stats.Orphaned += uint64(n)
	ch.Expired += expired
	ix.stats.Expired += uint64(expired)
}

// Restart records that vLLM's cache is gone (it restarted, or its engine
// came back from being down): the index is cleared and the epoch bumped.
func (ix *Index) Restart() Change {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var ch Change
	ix.reset(&ch)
	ch.Restarted = true
	ix.stats.Restarts++
	return ch
}

// reset empties the index for a new epoch. The delta restarts from the
// empty set.
func (ix *Index) reset(ch *Change) {
	if len(ix.keys) > 0 {
		ix.dirty = true
	}
	clear(ix.blocks)
	clear(ix.keys)
	n := ix.orphans.expireAll()
	ch.Expired += n
	ix.stats.Expired += uint64(n)
	clear(ix.touched)
	ix.order = ix.order[:0]
	ix.epoch++
	ix.uncertain = false
}

// ExpireOrphans drops every held orphan and returns how many blocks it
// dropped. The caller calls it once replay is known to be unavailable or
// finished: the parents will not come.
func (ix *Index) ExpireOrphans() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	n := ix.orphans.expireAll()
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

// Keys returns the routing keys present, sorted.
func (ix *Index) Keys() []blockkey.Key {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	ks := make([]blockkey.Key, 0, len(ix.keys))
	for k := range ix.keys {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Contains reports whether routing key k is present.
func (ix *Index) Contains(k blockkey.Key) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.keys[k] > 0
}

// PrefixLen returns how many of keys, from the start, are present: the
// prefix this pod could serve from cache (keys from Scheme.Request).
func (ix *Index) PrefixLen(keys []blockkey.Key) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for i, k := range keys {
		if ix.keys[k] == 0 {
			return i
		}
	}
	return len(keys)
}

// Len returns the number of routing keys present.
func (ix *Index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.keys)
}

// Blocks returns the number of distinct resident vLLM hashes.
func (ix *Index) Blocks() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.blocks)
}

// Epoch changes whenever the cache is known to be gone (clear, restart).
func (ix *Index) Epoch() uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.epoch
}

// Version increments with every batch that changes the routing set,
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
	s.Blocks, s.Keys, s.Orphans = len(ix.blocks), len(ix.keys), ix.orphans.blocks
	s.Epoch, s.Version, s.Uncertain = ix.epoch, ix.version, ix.uncertain
	return s
}

// Resident returns every resident hash, sorted by hash.
func (ix *Index) Resident() []Resident {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rs := make([]Resident, 0, len(ix.blocks))
	for h, e := range ix.blocks {
		rs = append(rs, Resident{Hash: h, Key: e.key, Pos: e.pos, Refs: e.refs})
	}
	slices.SortFunc(rs, func(a, b Resident) int {
		switch {
		case a.Hash < b.Hash:
			return -1
		case a.Hash > b.Hash:
			return 1
		}
		return 0
	})
	return rs
}
