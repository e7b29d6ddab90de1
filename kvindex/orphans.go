package kvindex

// orphans holds stored blocks whose parent hash the index has not seen,
// keyed by that parent, until the parent arrives (replay, or a later store
// of the same prefix) or they expire. Without the parent's key their own
// keys cannot be computed: treating them as chain roots would give wrong
// keys (docs/reference/vllm-interface.md §5.3).
type orphans struct {
	byParent map[uint64][]*group // missing parent hash → groups waiting on it
	held     map[uint64][]slot   // held hash → where it is held, for removals
	queue    []*group            // insertion order, for oldest-first expiry
	head     int
	dead     int // done groups in queue[head:]
	blocks   int // live held blocks
}

// group is the tail of one BlockStored event, copied (the caller owns the
// batch's slices).
type group struct {
	parent uint64
	hashes []uint64
	tokens []uint32
	extras [][]string // per block, nil when no block has any
	bs     int
	tier   Tier    // where the blocks were stored
	at     float64 // when (Index.clock seconds)
	gone   []bool  // removed while held: keyed for descendants, never stored
	live   int
	done   bool
}

type slot struct {
	g *group
	i int
}

func newOrphans() orphans {
	return orphans{byParent: make(map[uint64][]*group), held: make(map[uint64][]slot)}
}

func (o *orphans) waiting(h uint64) bool {
	return len(o.byParent) > 0 && len(o.byParent[h]) > 0
}

// hold adds a group within limit blocks, expiring the oldest groups to make
// room. It returns the blocks held and the blocks expired (a group larger
// than limit is expired at once).
func (o *orphans) hold(parent uint64, hashes []uint64, tokens []uint32, extras [][]string, bs int, tier Tier, at float64, limit int) (held, expired int) {
	n := len(hashes)
	if n > limit {
		return 0, n
	}
	for o.blocks+n > limit && o.blocks > 0 {
		expired += o.expireOldest()
	}
	g := &group{
		parent: parent,
		hashes: append([]uint64(nil), hashes...),
		tokens: append([]uint32(nil), tokens...),
		extras: extras,
		bs:     bs,
		tier:   tier,
		at:     at,
		gone:   make([]bool, n),
		live:   n,
	}
	o.byParent[parent] = append(o.byParent[parent], g)
	for i, h := range g.hashes {
		o.held[h] = append(o.held[h], slot{g, i})
	}
	o.queue = append(o.queue, g)
	o.blocks += n
	return n, expired
}

// take removes and returns the groups waiting on parent h.
func (o *orphans) take(h uint64) []*group {
	gs := o.byParent[h]
	delete(o.byParent, h)
	for _, g := range gs {
		o.release(g)
	}
	o.compact()
	return gs
}

// cancel marks one copy of h held on tier removed, the newest. It
// reports false if no copy of h is held on that tier.
func (o *orphans) cancel(h uint64, tier Tier) bool {
	ss := o.held[h]
	i := len(ss) - 1
	for ; i >= 0 && ss[i].g.tier != tier; i-- {
	}
	if i < 0 {
		return false
	}
	s := ss[i]
	s.g.gone[s.i] = true
	s.g.live--
	o.blocks--
	if len(ss) == 1 {
		delete(o.held, h)
	} else {
		o.held[h] = append(ss[:i], ss[i+1:]...)
	}
	if s.g.live == 0 {
		// Nothing left to store; vLLM evicts tails first, so its
		// descendants are gone too.
		o.drop(s.g)
		o.compact()
	}
	return true
}

func (o *orphans) expireOldest() int {
	o.compact() // the head is now the oldest live group, if any
	if o.head == len(o.queue) {
		return 0
	}
	g := o.queue[o.head]
	n := g.live
	o.drop(g)
	o.compact()
	return n
}

// expireAll drops every group and returns the live blocks dropped.
func (o *orphans) expireAll() int {
	n := o.blocks
	clear(o.byParent)
	clear(o.held)
	clear(o.queue)
	o.queue, o.head, o.dead, o.blocks = o.queue[:0], 0, 0, 0
	return n
}

// drop removes g from byParent as well as releasing it.
func (o *orphans) drop(g *group) {
	gs := o.byParent[g.parent]
	for i, x := range gs {
		if x == g {
			gs = append(gs[:i], gs[i+1:]...)
			break
		}
	}
	if len(gs) == 0 {
		delete(o.byParent, g.parent)
	} else {
		o.byParent[g.parent] = gs
	}
	o.release(g)
}

// release forgets g's held slots and live count; byParent is the caller's.
func (o *orphans) release(g *group) {
	if g.done {
		return
	}
	g.done = true
	o.dead++
	o.blocks -= g.live
	for i, h := range g.hashes {
		if g.gone[i] {
			continue
		}
		ss := o.held[h]
		for j, s := range ss {
			if s.g == g {
				ss = append(ss[:j], ss[j+1:]...)
				break
			}
		}
		if len(ss) == 0 {
			delete(o.held, h)
		} else {
			o.held[h] = ss
		}
	}
}

// compact drops finished groups from the queue, so that the queue stays
// proportional to the groups still held: groups resolved behind an old
// one that never resolves would otherwise pile up.
func (o *orphans) compact() {
	for o.head < len(o.queue) && o.queue[o.head].done {
		o.queue[o.head] = nil
		o.head++
		o.dead--
	}
	if o.dead+o.head <= 64 || o.dead+o.head <= len(o.queue)/2 {
		return
	}
	q := o.queue[:0]
	for _, g := range o.queue[o.head:] {
		if !g.done {
			q = append(q, g)
		}
	}
	clear(o.queue[len(q):])
	o.queue, o.head, o.dead = q, 0, 0
}
