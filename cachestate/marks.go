package cachestate

import (
	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/kvindex"
)

// marks are the markers a digest holds (bloom's tier.go): one per
// data-parallel rank above 0 that has sent an event, and the tier marker
// once a lower-tier entry exists. They only grow within an epoch: a rank
// or a tier that went quiet costs peers a few tests, while a marker
// withdrawn by delta would hide entries still held.
type marks struct {
	ranks  int // ranks described (1: rank 0 alone)
	stride int // lower-tier stride advertised, 0 for none
}

// markers returns the markers the index calls for now.
func (s *State) markers() marks {
	mk := marks{ranks: max(s.ix.Ranks(), 1)}
	st := s.ix.Stats()
	if st.TierBlocks[kvindex.CPU]+st.TierBlocks[kvindex.Disk] > 0 {
		mk.stride = s.ix.TierStride()
	}
	return mk
}

// keys returns mk's marker keys.
func (mk marks) keys() []blockkey.Key {
	var ks []blockkey.Key
	for r := 1; r < min(mk.ranks, bloom.MaxRanks); r++ {
		ks = append(ks, bloom.RankMarker(r))
	}
	if mk.stride > 0 {
		ks = append(ks, bloom.TierMarker(mk.stride))
	}
	return ks
}

// newer returns the marker keys mk has and old has not.
func (mk marks) newer(old marks) []blockkey.Key {
	var ks []blockkey.Key
	for r := max(old.ranks, 1); r < min(mk.ranks, bloom.MaxRanks); r++ {
		ks = append(ks, bloom.RankMarker(r))
	}
	if mk.stride > 0 && old.stride == 0 {
		ks = append(ks, bloom.TierMarker(mk.stride))
	}
	return ks
}

// union is the markers of a digest that held old and got mk's newer ones.
func (mk marks) union(old marks) marks {
	return marks{ranks: max(mk.ranks, old.ranks), stride: max(old.stride, mk.stride)}
}
