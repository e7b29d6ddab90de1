package route

import (
	"slices"

	"github.com/kvroute/kvroute/blockkey"
)

// ClaimIndex is which peers hold claims, by where a request's keys would
// meet them: a claim on a prefix of d keys ending in key k matches a
// request whose d-th key has k's ClaimTag (claimedLen). A peer table adds
// each claim it keeps and drops each it stops keeping; a Shortlist then
// reads the claims of only the peers a request may match, where it read
// every peer's: at a thousand peers each holding its last 32 claims, that
// was most of a choice. The zero value is empty and ready.
type ClaimIndex struct {
	by     map[uint64][]string // claimSlot: a peer per claim it holds there
	depths map[int]int         // how many claims are held at each depth
	sorted []int               // depths' keys in order; nil: to be made again
}

func claimSlot(depth int, tag uint32) uint64 { return uint64(depth)<<32 | uint64(tag) }

// Add records that peer holds claims cs.
func (x *ClaimIndex) Add(peer string, cs []Claim) {
	if x.by == nil {
		x.by, x.depths = map[uint64][]string{}, map[int]int{}
	}
	for _, c := range cs {
		s := claimSlot(c.Keys, ClaimTag(c.Key))
		x.by[s] = append(x.by[s], peer)
		if x.depths[c.Keys]++; x.depths[c.Keys] == 1 {
			x.sorted = nil
		}
	}
}

// Drop records that peer no longer holds claims cs (each added before).
func (x *ClaimIndex) Drop(peer string, cs []Claim) {
	for _, c := range cs {
		s := claimSlot(c.Keys, ClaimTag(c.Key))
		ps := x.by[s]
		i := slices.Index(ps, peer)
		if i < 0 {
			continue
		}
		if ps = slices.Delete(ps, i, i+1); len(ps) == 0 {
			delete(x.by, s)
		} else {
			x.by[s] = ps
		}
		if x.depths[c.Keys]--; x.depths[c.Keys] == 0 {
			delete(x.depths, c.Keys)
			x.sorted = nil
		}
	}
}

// Len is how many claims the index holds.
func (x *ClaimIndex) Len() int {
	n := 0
	for _, c := range x.depths {
		n += c
	}
	return n
}

// Peers appends to dst the peers holding a claim that keys match at its
// depth, a peer once per such claim: a lookup per depth claims are held
// at, up to the keys' length. Whether a claim is still live (ClaimTTL)
// its holder's claims say.
func (x *ClaimIndex) Peers(keys []blockkey.Key, dst []string) []string {
	if len(x.by) == 0 {
		return dst
	}
	if x.sorted == nil {
		x.sorted = make([]int, 0, len(x.depths))
		for d := range x.depths {
			x.sorted = append(x.sorted, d)
		}
		slices.Sort(x.sorted)
	}
	for _, d := range x.sorted {
		if d > len(keys) {
			break
		}
		if d > 0 {
			dst = append(dst, x.by[claimSlot(d, ClaimTag(keys[d-1]))]...)
		}
	}
	return dst
}
