package bloom

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
)

// TestTransposedMatchesEachDigest drives a Transposed through random
// members, deltas with additions and removals, removals of members and
// refused digests, and checks after every step that PrefixLens gives each
// member's own PrefixLen, with its stamp, for chains that members share
// in part, hold whole, or hold as removed.
func TestTransposedMatchesEachDigest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := ParamsFor(2000, 0.01)
	chains := make([][]blockkey.Key, 12)
	for i := range chains {
		chains[i] = make([]blockkey.Key, 40)
		for j := range chains[i] {
			chains[i][j] = blockkey.Key(rng.Uint64())
		}
		if i > 0 && i%3 != 0 { // a shared beginning
			copy(chains[i][:10], chains[i-1][:10])
		}
	}
	somePrefixes := func() []blockkey.Key {
		var ks []blockkey.Key
		for range 1 + rng.IntN(4) {
			c := chains[rng.IntN(len(chains))]
			ks = append(ks, c[:rng.IntN(len(c)+1)]...)
		}
		for range rng.IntN(300) {
			ks = append(ks, blockkey.Key(rng.Uint64()))
		}
		return ks
	}
	tr := NewTransposed()
	members := map[int]member{} // by slot
	check := func(step string) {
		t.Helper()
		n := tr.Slots()
		if got := tr.Len(); got != len(members) {
			t.Fatalf("%s: Len = %d; want %d", step, got, len(members))
		}
		out, stamps := make([]int, n), make([]uint64, n)
		for _, c := range chains {
			tr.PrefixLens(c, out, stamps)
			for s := range n {
				m, ok := members[s]
				want, wantStamp := 0, uint64(0)
				if ok {
					want, wantStamp = m.d.PrefixLen(c), m.stamp
				}
				if out[s] != want || stamps[s] != wantStamp {
					t.Fatalf("%s: slot %d: PrefixLens = %d, stamp %d; want %d, stamp %d", step, s, out[s], stamps[s], want, wantStamp)
				}
			}
		}
	}
	nodes := 0
	for step := range 400 {
		switch op := rng.IntN(10); {
		case op < 4 || len(members) == 0: // a new member
			nodes++
			d := Build(Header{Node: fmt.Sprint("n", nodes), Epoch: 1, Params: p}, somePrefixes())
			s, st := tr.Put(-1, d)
			if s < 0 {
				t.Fatalf("step %d: Put of a plain digest refused", step)
			}
			if _, taken := members[s]; taken {
				t.Fatalf("step %d: Put gave slot %d, which is taken", step, s)
			}
			members[s] = member{d, st}
		case op < 8: // a delta to a member
			s := anySlot(rng, members)
			m := members[s]
			h := m.d.Header()
			var removed []blockkey.Key
			c := chains[rng.IntN(len(chains))]
			if m.d.PrefixLen(c) > 0 {
				removed = append(removed, c[rng.IntN(m.d.PrefixLen(c))])
			}
			next, err := m.d.Apply(Delta{Node: h.Node, Epoch: h.Epoch, From: h.Version, To: h.Version + 1,
				Keys: somePrefixes()[:rng.IntN(20)], Removed: removed})
			if err != nil {
				t.Fatal(err)
			}
			s2, st := tr.Put(s, next)
			if s2 != s || st <= m.stamp {
				t.Fatalf("step %d: Put(%d) of the next version = %d, stamp %d; want %d, a stamp above %d", step, s, s2, st, s, m.stamp)
			}
			members[s] = member{next, st}
		case op < 9:
			s := anySlot(rng, members)
			tr.Remove(s)
			delete(members, s)
		default: // a member turns into one the rows cannot hold: a CPU tier
			s := anySlot(rng, members)
			tiered := Build(Header{Node: "tiered", Params: p}, append(somePrefixes(), TierMarker(8)))
			if s2, _ := tr.Put(s, tiered); s2 != -1 {
				t.Fatalf("step %d: Put of a tiered digest = %d; want -1", step, s2)
			}
			delete(members, s)
		}
		check(fmt.Sprint("step ", step))
	}
}

type member struct {
	d     *Digest
	stamp uint64
}

func anySlot(rng *rand.Rand, m map[int]member) int {
	ss := make([]int, 0, len(m))
	for s := range m {
		ss = append(ss, s)
	}
	slices.Sort(ss)
	return ss[rng.IntN(len(ss))]
}

// TestTransposedShapes: past 64 members the rows widen and keep every
// member's bits; a digest of another shape is refused while there are
// members, and accepted once the last has gone.
func TestTransposedShapes(t *testing.T) {
	tr := NewTransposed()
	p := ParamsFor(500, 0.01)
	keys := func(i int) []blockkey.Key {
		return []blockkey.Key{blockkey.Key(i), blockkey.Key(i + 1), blockkey.Key(i + 2)}
	}
	var slots []int
	for i := range 130 {
		s, _ := tr.Put(-1, Build(Header{Node: fmt.Sprint(i), Params: p}, keys(3*i)))
		slots = append(slots, s)
	}
	out, stamps := make([]int, tr.Slots()), make([]uint64, tr.Slots())
	for i, s := range slots {
		tr.PrefixLens(keys(3*i), out, stamps)
		if out[s] != 3 {
			t.Fatalf("member %d (slot %d) after widening: PrefixLens = %d; want 3", i, s, out[s])
		}
	}
	other := Build(Header{Node: "x", Params: ParamsFor(5000, 0.01)}, keys(1))
	if s, _ := tr.Put(-1, other); s != -1 {
		t.Fatalf("Put of another shape beside members = %d; want -1", s)
	}
	for _, s := range slots {
		tr.Remove(s)
	}
	if s, _ := tr.Put(-1, other); s != 0 {
		t.Fatalf("Put of another shape into the empty Transposed = %d; want 0", s)
	}
	out, stamps = make([]int, 1), make([]uint64, 1)
	if tr.PrefixLens(keys(1), out, stamps); out[0] != 3 {
		t.Errorf("PrefixLens of the new shape's member = %d; want 3", out[0])
	}
}

// TestTransposedConcurrent: PrefixLens while Put and Remove run answers
// every slot for the digest its stamp names (run with -race).
func TestTransposedConcurrent(t *testing.T) {
	tr := NewTransposed()
	p := ParamsFor(500, 0.01)
	chain := uniformKeys(70, 20)
	var mu sync.Mutex
	byStamp := map[uint64]*Digest{}
	put := func(slot, n int) int {
		d := Build(Header{Node: "x", Params: p}, chain[:n])
		mu.Lock()
		defer mu.Unlock() // the stamp is recorded before any reader can see it answered
		s, st := tr.Put(slot, d)
		byStamp[st] = d
		return s
	}
	slots := []int{put(-1, 5), put(-1, 10), put(-1, 15)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			s := slots[i%3]
			if i%50 == 49 {
				tr.Remove(s)
				slots[i%3] = put(-1, i%20)
				continue
			}
			put(s, i%20)
		}
	}()
	out, stamps := make([]int, 8), make([]uint64, 8)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		tr.PrefixLens(chain, out, stamps)
		mu.Lock()
		for s, st := range stamps {
			if st == 0 {
				continue
			}
			if want := byStamp[st].PrefixLen(chain); out[s] != want {
				t.Fatalf("slot %d stamp %d: PrefixLens = %d; its digest %d", s, st, out[s], want)
			}
		}
		mu.Unlock()
	}
}

// TestTransposedShortOut: PrefixLens answers for the slots below the
// length of out and stamps alone, free slots among them 0, whatever the
// number of slots beyond.
func TestTransposedShortOut(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p := ParamsFor(500, 0.01)
	chain := make([]blockkey.Key, 30)
	for i := range chain {
		chain[i] = blockkey.Key(rng.Uint64())
	}
	tr := NewTransposed()
	ds := make([]*Digest, 150)
	for i := range ds {
		ds[i] = Build(Header{Node: fmt.Sprint("n", i), Params: p}, chain[:rng.IntN(len(chain)+1)])
		if s, _ := tr.Put(-1, ds[i]); s != i {
			t.Fatalf("Put %d gave slot %d", i, s)
		}
	}
	for _, s := range []int{0, 63, 64, 100, 149} {
		tr.Remove(s)
		ds[s] = nil
	}
	for _, n := range []int{0, 1, 63, 64, 65, 101, 128, 149, 150} {
		out, stamps := make([]int, n), make([]uint64, n)
		tr.PrefixLens(chain, out, stamps)
		for s := range n {
			want := 0
			if ds[s] != nil {
				want = ds[s].PrefixLen(chain)
			}
			if out[s] != want || (stamps[s] == 0) != (ds[s] == nil) {
				t.Fatalf("%d slots asked: slot %d: PrefixLens %d, stamp %d; want %d", n, s, out[s], stamps[s], want)
			}
		}
	}
}
