package gossip

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// TestTableGroupFollowsDigests drives the table through random digests,
// deltas (in order, early, of a new epoch), engine changes, epoch-changing
// metas and departures, and checks after each step that the group holds
// exactly the peers' current plain digests: each view's digest answers
// in the group as it does alone.
func TestTableGroupFollowsDigests(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	tb := newTable(4)
	chain := make([]blockkey.Key, 30)
	for i := range chain {
		chain[i] = blockkey.Key(rng.Uint64())
	}
	ids := []string{"a", "b", "c", "d", "e"}
	epochs := map[string]uint64{}
	seq := map[string]uint64{}
	now := t0
	for step := range 600 {
		now = now.Add(time.Second)
		id := ids[rng.IntN(len(ids))]
		switch op := rng.IntN(10); {
		case op < 2: // joins or changes its meta, maybe to a new epoch
			if rng.IntN(3) == 0 {
				epochs[id]++
			}
			tb.upsert(id, metaAt(epochs[id], 1), true, now)
		case op < 4: // a full digest, sometimes with a CPU tier or of another size
			keys := slices.Clone(chain[:rng.IntN(len(chain))])
			if rng.IntN(4) == 0 {
				keys = append(keys, bloom.TierMarker(8))
			}
			d := testDigest(id, epochs[id], uint64(rng.IntN(4)), keys...)
			if rng.IntN(3) == 0 {
				d = bloom.Build(bloom.Header{Node: id, Epoch: epochs[id], Params: bloom.ParamsFor(3000, 0.01)}, keys)
			}
			tb.applyDigest(d, now)
		case op < 7: // a delta, in order or not
			p := tb.peers[id]
			if p == nil || p.digest == nil {
				continue
			}
			h := p.digest.Header()
			from := h.Version + uint64(rng.IntN(2))
			x := bloom.Delta{Node: id, Epoch: h.Epoch, From: from, To: from + 1,
				Keys: chain[:rng.IntN(len(chain))], Removed: chain[rng.IntN(len(chain)):]}
			tb.applyDelta(x, now)
		case op < 9: // a load push: engine down, back in another epoch, or serving
			seq[id]++
			r := loadReport{Node: id, Seq: seq[id], HasState: true, Engine: route.EngineServing, Epoch: epochs[id]}
			switch rng.IntN(3) {
			case 0:
				r.Engine = route.EngineDown
			case 1:
				epochs[id]++
				r.Epoch = epochs[id]
			}
			tb.applyLoad(r, now)
		default:
			tb.remove(id)
		}
		held, misfits := 0, 0
		n := tb.group.Slots()
		out, stamps := make([]int, n), make([]uint64, n)
		tb.group.PrefixLens(chain, out, stamps)
		for id, p := range tb.peers {
			switch {
			case p.grouped == nil:
				plain := p.digest != nil && bloom.Groupable(p.digest)
				if plain && p.digest.Header().Params == tb.group.Shape() {
					t.Fatalf("step %d: %s holds a plain digest of the group's shape the group does not", step, id)
				}
				if p.misfit != plain {
					t.Fatalf("step %d: %s misfit %v; its digest plain and not in the group: %v", step, id, p.misfit, plain)
				}
				if p.misfit {
					misfits++
				}
			case p.grouped.TierMatcher != p.digest:
				t.Fatalf("step %d: %s's group member is not its digest", step, id)
			default:
				held++
				s := p.grouped.Slot
				if out[s] != p.digest.PrefixLen(chain) || stamps[s] != p.grouped.Stamp {
					t.Fatalf("step %d: %s in slot %d: group says %d (stamp %d); digest %d (stamp %d)",
						step, id, s, out[s], stamps[s], p.digest.PrefixLen(chain), p.grouped.Stamp)
				}
			}
		}
		if got := tb.group.Len(); got != held {
			t.Fatalf("step %d: group holds %d digests; peers hold %d in it", step, got, held)
		}
		if tb.misfits != misfits {
			t.Fatalf("step %d: misfits counted %d; peers say %d", step, tb.misfits, misfits)
		}
	}
}

// TestTableGroupTakesTheCommonShape: an odd pod whose digest came first
// does not keep its shape in the copy once two pods of another shape
// outnumber it; it is then matched alone, and the views hand out the new
// copy's members.
func TestTableGroupTakesTheCommonShape(t *testing.T) {
	tb := newTable(4)
	odd := bloom.ParamsFor(3000, 0.01)
	for _, id := range []string{"odd", "a", "b"} {
		tb.upsert(id, metaAt(1, 1), true, t0)
	}
	tb.applyDigest(bloom.Build(bloom.Header{Node: "odd", Epoch: 1, Version: 1, Params: odd}, []blockkey.Key{1}), t0)
	tb.applyDigest(testDigest("a", 1, 1, 1), t0)
	if tb.group.Shape() != odd || tb.peers["a"].grouped != nil {
		t.Fatalf("after the odd digest and one other: shape %v, a grouped %v; want the odd shape, a alone", tb.group.Shape(), tb.peers["a"].grouped)
	}
	tb.applyDigest(testDigest("b", 1, 1, 1), t0)
	if tb.group.Shape() == odd || tb.group.Len() != 2 || tb.peers["odd"].grouped != nil || tb.misfits != 1 {
		t.Fatalf("after two of the common shape: shape %v, %d members, odd grouped %v, %d misfits; want the common shape, 2, alone, 1",
			tb.group.Shape(), tb.group.Len(), tb.peers["odd"].grouped, tb.misfits)
	}
	for _, v := range tb.views() {
		_, grouped := v.Digest.(route.Grouped)
		if grouped != (v.ID != "odd") {
			t.Errorf("view %s grouped %v", v.ID, grouped)
		}
		if n := v.Digest.PrefixLen([]blockkey.Key{1}); n != 1 {
			t.Errorf("view %s PrefixLen = %d; want 1", v.ID, n)
		}
	}
}
