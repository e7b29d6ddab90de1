package bloom

import (
	"math/bits"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/blockkey"
)

// Transposed holds many pods' digests bit by bit across pods, so that the
// prefix of one prompt is matched against all of them in one pass: for
// each filter bit, a row with one bit per member digest. A key's K bits lie
// in one 512-bit block (hash scheme 2), so testing a key against every
// member is the AND of K rows, and walking a prompt's keys narrows the set
// of members still matching until it is empty. Asking each digest instead
// costs at least a cache miss per digest: at a thousand peers, 1000
// filters of a few hundred KB each are far past any core's cache.
//
// Only digests of one shape share the rows (M, K, hash scheme 2, the shape
// of the first member; one model on one GPU type has one), and only plain
// ones: one data-parallel rank, no lower-tier entries, whose TierPrefix is
// their PrefixLen. Put refuses the others, which callers match one by one.
//
// The rows cost as much memory as the member digests' bits (M bits per
// member, rounded up to 64 members); Put costs O(M/64) and the bits that
// changed, Remove the bits that were set.
//
// It is safe for concurrent use: PrefixLens reads while Put and Remove
// write.
type Transposed struct {
	mu    sync.RWMutex
	shape Params // of every member; zero while there are none
	w     int    // words per row: members rounded up to 64, over 64
	// rows[b*w : b*w+w] is filter bit b across members: bit s of it is bit
	// b of member s's digest.
	rows    []uint64
	members []*Digest // by slot; nil: free
	stamps  []uint64  // by slot: which Put the member's bits are from
	stamp   uint64    // the last Put's
	free    []int
	// gone maps each key some member holds as removed (gone.go) to those
	// members' slots: the rows cannot say a key is gone, as a Bloom
	// filter's bits cannot.
	gone map[blockkey.Key][]int
}

// NewTransposed returns an empty Transposed.
func NewTransposed() *Transposed { return &Transposed{gone: map[blockkey.Key][]int{}} }

// Groupable reports whether d can be a member of a Transposed of its
// shape: a plain scheme-2 digest.
func Groupable(d *Digest) bool {
	return !d.empty() && d.h.HashScheme == hashBlocked && d.ranks == 1 && d.tierStride == 0
}

// Shape returns the Params every member has, zero while there are none.
func (t *Transposed) Shape() Params {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.shape
}

// Put makes d the member in slot (a new slot when slot is negative) and
// returns its slot and stamp, or -1 when d cannot be a member (then slot,
// if it held one, is removed). A member's stamp changes with every Put:
// PrefixLens reports it, so a caller holding an older digest of the same
// slot can tell its answer is not about that digest.
func (t *Transposed) Put(slot int, d *Digest) (int, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot >= len(t.members) || (slot >= 0 && t.members[slot] == nil) {
		slot = -1
	}
	if !Groupable(d) || (t.shape != (Params{}) && d.h.Params != t.shape) {
		if slot >= 0 {
			t.removeLocked(slot)
		}
		return -1, 0
	}
	if t.shape == (Params{}) {
		t.shape = d.h.Params
	}
	var old []uint64
	var oldGone []blockkey.Key
	if slot < 0 {
		slot = t.allocLocked()
	} else {
		old, oldGone = t.members[slot].bits.Words(), t.members[slot].gone
	}
	t.flipLocked(slot, old, d.bits.Words())
	t.regoneLocked(slot, oldGone, d.gone)
	t.stamp++
	t.members[slot], t.stamps[slot] = d, t.stamp
	return slot, t.stamp
}

// Remove takes slot's member out; a free or unknown slot is ignored.
func (t *Transposed) Remove(slot int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot >= 0 && slot < len(t.members) && t.members[slot] != nil {
		t.removeLocked(slot)
	}
}

// Len returns how many members there are.
func (t *Transposed) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.members) - len(t.free)
}

// Slots returns the number of slots, free ones included: the length
// PrefixLens's out and stamps need.
func (t *Transposed) Slots() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.members)
}

// PrefixLens sets out[s] to member s's PrefixLen(keys) and stamps[s] to
// its stamp, for every slot s below len(out) and len(stamps) (0 and 0 for
// a free slot). It reads K rows per key, each of one word per 64 members
// still matching, and stops when none is.
func (t *Transposed) PrefixLens(keys []blockkey.Key, out []int, stamps []uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := min(len(out), len(stamps), len(t.members))
	clear(out)
	clear(stamps)
	copy(stamps, t.stamps[:n])
	active := make([]uint64, t.w)
	next := make([]uint64, t.w)
	nz := make([]int, 0, t.w) // words of active with a bit set: sized, not grown by appends
	// Every slot below n but the free ones (a slot's member is nil just
	// while it is free): a word at a time, where asking each slot's
	// member was a load and a branch per slot.
	for j := 0; j*64 < n; j++ {
		active[j] = ^uint64(0) >> (64 - min(n-j*64, 64))
	}
	for _, s := range t.free {
		if s < n {
			active[s/64] &^= 1 << (s % 64)
		}
	}
	for j, a := range active {
		if a != 0 {
			nz = append(nz, j)
		}
	}
	var rows [MaxK]int
	for i, k := range keys {
		if len(nz) == 0 {
			return
		}
		nr := t.rowsOf(k, rows[:])
		for _, j := range nz {
			a := active[j]
			for _, r := range rows[:nr] {
				a &= t.rows[r*t.w+j]
			}
			next[j] = a
		}
		if len(t.gone) > 0 {
			for _, s := range t.gone[k] {
				next[s/64] &^= 1 << (s % 64)
			}
		}
		kept, left := nz[:0], 0
		for _, j := range nz {
			for ended := active[j] &^ next[j]; ended != 0; ended &= ended - 1 {
				out[j*64+bits.TrailingZeros64(ended)] = i
			}
			active[j] = next[j]
			if active[j] != 0 {
				kept = append(kept, j)
				left += bits.OnesCount64(active[j])
			}
		}
		nz = kept
		if left <= tail {
			// A long match is usually one pod's: its own digest reads one
			// cache line a key where the rows read K.
			for _, j := range nz {
				for a := active[j]; a != 0; a &= a - 1 {
					s := j*64 + bits.TrailingZeros64(a)
					out[s] = i + 1 + t.members[s].PrefixLen(keys[i+1:])
				}
			}
			return
		}
	}
	for _, j := range nz {
		for a := active[j]; a != 0; a &= a - 1 {
			out[j*64+bits.TrailingZeros64(a)] = len(keys)
		}
	}
}

// tail is how few members still matching PrefixLens hands over to their
// own digests.
const tail = 2

// rowsOf writes the filter bits k sets (test2's) into rows and returns
// how many it wrote.
func (t *Transposed) rowsOf(k blockkey.Key, rows []int) int {
	h1 := mix(uint64(k))
	block, _ := bits.Mul64(h1, t.shape.M/blockBits)
	seed, r := h1, uint64(0)
	for i := range int(t.shape.K) {
		if i%posPerMix == 0 {
			seed += golden
			r = mix(seed)
		}
		rows[i] = int(block)*blockBits + int(r&(blockBits-1))
		r >>= posBits
	}
	return int(t.shape.K)
}

// allocLocked returns a free slot, widening the rows by 64 members when
// there is none.
func (t *Transposed) allocLocked() int {
	if n := len(t.free); n > 0 {
		s := t.free[n-1]
		t.free = t.free[:n-1]
		return s
	}
	s := len(t.members)
	if s == t.w*64 {
		w := t.w + 1
		rows := make([]uint64, int(t.shape.M)*w)
		for b := range int(t.shape.M) {
			copy(rows[b*w:], t.rows[b*t.w:b*t.w+t.w])
		}
		t.rows, t.w = rows, w
	}
	t.members = append(t.members, nil)
	t.stamps = append(t.stamps, 0)
	return s
}

// flipLocked sets slot's column from words old to new (nil: all clear;
// else both M/64 long).
func (t *Transposed) flipLocked(slot int, old, new []uint64) {
	j, bit := slot/64, uint64(1)<<(slot%64)
	for i := range int(t.shape.M / 64) {
		var x uint64
		if old != nil {
			x = old[i]
		}
		if new != nil {
			x ^= new[i]
		}
		for ; x != 0; x &= x - 1 {
			t.rows[(i*64+bits.TrailingZeros64(x))*t.w+j] ^= bit
		}
	}
}

// regoneLocked moves slot's removals from the sorted list old to new.
func (t *Transposed) regoneLocked(slot int, old, new []blockkey.Key) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || (i < len(old) && old[i] < new[j]):
			t.ungoneLocked(old[i], slot)
			i++
		case i == len(old) || new[j] < old[i]:
			t.gone[new[j]] = append(t.gone[new[j]], slot)
			j++
		default:
			i, j = i+1, j+1
		}
	}
}

func (t *Transposed) ungoneLocked(k blockkey.Key, slot int) {
	ss := t.gone[k]
	if i := slices.Index(ss, slot); i >= 0 {
		ss = slices.Delete(ss, i, i+1)
	}
	if len(ss) == 0 {
		delete(t.gone, k)
		return
	}
	t.gone[k] = ss
}

func (t *Transposed) removeLocked(slot int) {
	d := t.members[slot]
	t.flipLocked(slot, d.bits.Words(), nil)
	t.regoneLocked(slot, d.gone, nil)
	t.members[slot], t.stamps[slot] = nil, 0
	t.free = append(t.free, slot)
	if len(t.free) == len(t.members) { // empty: the next member may have another shape
		t.shape, t.w, t.rows, t.members, t.stamps, t.free = Params{}, 0, nil, nil, nil, nil
	}
}
