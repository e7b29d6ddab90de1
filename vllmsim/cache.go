package vllmsim

import (
	"slices"

	"github.com/kvroute/kvroute/kvevent"
)

// kvBlock is one physical KV-cache block (vLLM's KVCacheBlock).
type kvBlock struct {
	id  int
	ref int // requests holding the block; >0 means pinned
	// cached: the block is full and registered under hash until it is
	// reallocated (lazy eviction, as vLLM).
	cached bool
	hash   digest
	parent *uint64 // wire hash of the block before, nil at token 0
	tokens []uint32
	lora   string
	extra  []string // the extra keys hashed into hash, nil when none
	// free-list links; inFree says whether the block is in the queue.
	prev, next *kvBlock
	inFree     bool
}

// pool is vLLM's BlockPool: fixed capacity, a free queue that doubles as
// the eviction order, and a hash → copies map of cached blocks. It records
// the KV events its operations cause; the scheduler drains them per step.
type pool struct {
	blocks []kvBlock
	// head and tail are sentinels of the free queue (FreeKVCacheBlockQueue):
	// allocation pops after head; freed cached blocks are appended before
	// tail, freed uncached blocks are pushed after head.
	head, tail kvBlock
	nFree      int
	cached     map[digest][]*kvBlock
	blockSize  int
	events     []kvevent.Event
	// tier holds what GPU evictions offload (nil: no offloading).
	tier *tier
}

var gpu = "GPU"

func newPool(numBlocks, blockSize int, o Offload) *pool {
	p := &pool{blockSize: blockSize, tier: newTier(o)}
	p.reset(numBlocks)
	return p
}

// reset empties the pool without events: every block free, in id order.
func (p *pool) reset(numBlocks int) {
	p.blocks = make([]kvBlock, numBlocks)
	p.head.next, p.tail.prev = &p.tail, &p.head
	p.nFree = 0
	p.cached = make(map[digest][]*kvBlock)
	p.events = nil
	for i := range p.blocks {
		p.blocks[i].id = i
		p.pushTail(&p.blocks[i])
	}
}

func (p *pool) unlink(b *kvBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next, b.inFree = nil, nil, false
	p.nFree--
}

func (p *pool) pushTail(b *kvBlock) {
	b.prev, b.next = p.tail.prev, &p.tail
	b.prev.next, p.tail.prev = b, b
	b.inFree = true
	p.nFree++
}

func (p *pool) pushHead(b *kvBlock) {
	b.prev, b.next = &p.head, p.head.next
	b.next.prev, p.head.next = b, b
	b.inFree = true
	p.nFree++
}

// used is the number of pinned blocks (vLLM's KV usage numerator).
func (p *pool) used() int { return len(p.blocks) - p.nFree }

// lookup returns the cached blocks of the longest prefix of hashes present,
// at most max blocks (the caller applies vLLM's (n-1)//bs cap).
func (p *pool) lookup(hashes []digest, max int) []*kvBlock {
	var hit []*kvBlock
	for i, h := range hashes {
		if i >= max {
			break
		}
		copies := p.cached[h]
		if len(copies) == 0 {
			break
		}
		hit = append(hit, copies[0])
	}
	return hit
}

// offloaded counts the hashes[from:max] the tier holds in a row from from,
// without refreshing them (0 without a tier).
func (p *pool) offloaded(hashes []digest, from, max int) int {
	if p.tier == nil {
		return 0
	}
	n := 0
	for i := from; i < max && i < len(hashes); i++ {
		if _, ok := p.tier.at[hashes[i]]; !ok {
			break
		}
		n++
	}
	return n
}

// load marks hashes as read from the tier (most recently used).
func (p *pool) load(hashes []digest) {
	for _, h := range hashes {
		p.tier.has(h)
	}
}

// canAllocate reports whether n new blocks fit after touching hit (hit
// blocks that sit in the free queue stop being available).
func (p *pool) canAllocate(n int, hit []*kvBlock) bool {
	avail := p.nFree
	for _, b := range hit {
		if b.ref == 0 {
			avail--
		}
	}
	return n <= avail
}

// touch pins prefix-hit blocks.
func (p *pool) touch(hit []*kvBlock) {
	for _, b := range hit {
		if b.ref == 0 && b.inFree {
			p.unlink(b)
		}
		b.ref++
	}
}

// take pops n blocks from the head of the free queue, evicting any that
// are still cached (one BlockRemoved each). Callers check canAllocate.
func (p *pool) take(n int) []*kvBlock {
	out := make([]*kvBlock, 0, n)
	for range n {
		b := p.head.next
		if b == &p.tail {
			break
		}
		p.unlink(b)
		if b.cached {
			p.evict(b)
		}
		b.ref = 1
		out = append(out, b)
	}
	return out
}

func (p *pool) evict(b *kvBlock) {
	copies := p.cached[b.hash]
	if i := slices.Index(copies, b); i >= 0 {
		copies = slices.Delete(copies, i, i+1)
	}
	if len(copies) == 0 {
		delete(p.cached, b.hash)
	} else {
		p.cached[b.hash] = copies
	}
	// The CPU copy is announced before the GPU removal, as vLLM's offload
	// finishes storing before the GPU block can be reused: a consumer
	// resolving the hash-only store still knows the hash.
	if p.tier != nil {
		p.events = p.tier.put(b.hash, p.events)
	}
	p.events = append(p.events, kvevent.Event{
		Kind:        kvevent.BlockRemoved,
		Tag:         kvevent.BlockRemoved.String(),
		BlockHashes: []uint64{b.hash.wire()},
		Medium:      &gpu,
	})
	b.cached, b.parent, b.tokens, b.lora, b.extra = false, nil, nil, "", nil
}

// store registers blocks[from:to] of a request under hashes[from:to] and
// records one BlockStored (BlockPool.cache_full_blocks). tokens are the
// request's tokens; a new physical copy is added even when the hash is
// already cached, as vLLM does for blocks computed concurrently. Like
// vLLM since #33304 the event's extra_keys has one entry per stored block,
// None for a block without extra keys, so a plain request sends
// [None, ...].
func (p *pool) store(blocks []*kvBlock, hashes []digest, tokens []uint32, from, to int, k blockKeys, loraID int64) {
	if to <= from {
		return
	}
	bs := p.blockSize
	var parent *uint64
	if from > 0 {
		w := hashes[from-1].wire()
		parent = &w
	}
	ev := kvevent.Event{
		Kind:      kvevent.BlockStored,
		Tag:       kvevent.BlockStored.String(),
		Parent:    parent,
		TokenIDs:  slices.Clone(tokens[from*bs : to*bs]),
		BlockSize: bs,
		Medium:    &gpu,
		ExtraKeys: make([][]any, 0, to-from),
	}
	if k.lora != "" {
		l := k.lora
		ev.LoRAName = &l
	}
	if loraID > 0 {
		id := loraID
		ev.LoRAID = &id
	}
	for i := from; i < to; i++ {
		b := blocks[i]
		b.cached, b.hash, b.lora = true, hashes[i], k.lora
		b.extra = extraKeys(k, i, bs)
		// Own copy: the sink may keep or change the event's slice.
		b.tokens = slices.Clone(tokens[i*bs : (i+1)*bs])
		if i > 0 {
			w := hashes[i-1].wire()
			b.parent = &w
		}
		p.cached[b.hash] = append(p.cached[b.hash], b)
		ev.BlockHashes = append(ev.BlockHashes, b.hash.wire())
		ev.ExtraKeys = append(ev.ExtraKeys, anys(b.extra))
	}
	p.events = append(p.events, ev)
}

// anys is keys as an extra_keys entry: a new slice (the sink may keep or
// change it), nil for none.
func anys(keys []string) []any {
	if keys == nil {
		return nil
	}
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

// free releases a request's blocks, given in allocation order. They are
// released tail first (vLLM frees reversed) so a chain's last blocks are
// evicted first and cached chains stay prefix-closed; blocks that drop to
// ref 0 uncached go to the head, to be reused before any cached block.
func (p *pool) free(blocks []*kvBlock) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		b.ref--
		if b.ref > 0 {
			continue
		}
		if b.cached {
			p.pushTail(b)
		} else {
			p.pushHead(b)
		}
	}
}

// clear drops every cached hash (reset_prefix_cache). It fails while any
// block is pinned. On success it records AllBlocksCleared.
func (p *pool) clear() bool {
	if p.used() > 0 {
		return false
	}
	for i := range p.blocks {
		b := &p.blocks[i]
		b.cached, b.parent, b.tokens, b.lora, b.extra = false, nil, nil, "", nil
	}
	p.cached = make(map[digest][]*kvBlock)
	if p.tier != nil {
		p.tier.clear()
	}
	p.events = append(p.events, kvevent.Event{
		Kind: kvevent.AllBlocksCleared,
		Tag:  kvevent.AllBlocksCleared.String(),
	})
	return true
}

// takeEvents returns and forgets the recorded events.
func (p *pool) takeEvents() []kvevent.Event {
	ev := p.events
	p.events = nil
	return ev
}

// snapshot lists cached hashes with their copy counts, sorted by hash.
func (p *pool) snapshot() []CachedBlock {
	out := make([]CachedBlock, 0, len(p.cached))
	for h, copies := range p.cached {
		b := copies[0]
		cb := CachedBlock{Hash: h.wire(), Tokens: slices.Clone(b.tokens), LoRA: b.lora, Extra: slices.Clone(b.extra), Copies: len(copies)}
		if b.parent != nil {
			v := *b.parent
			cb.Parent = &v
		}
		out = append(out, cb)
	}
	slices.SortFunc(out, func(a, b CachedBlock) int {
		switch {
		case a.Hash < b.Hash:
			return -1
		case a.Hash > b.Hash:
			return 1
		}
		return 0
	})
	return out
}
