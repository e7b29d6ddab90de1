package route

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Claim says a peer was just sent a request whose first Keys routing keys
// end in Key, so its cache will hold that prefix once the prefill runs,
// before any digest can show it. Sidecars share the claims of what they
// place with their load pushes: a burst of one new prefix spread over many
// sidecars then follows its first request by Affinity, as far as the
// claimed tokens outweigh the holder's extra load (a short shared prefix
// is not worth a queue; a long system prompt is).
type Claim struct {
	// Key is the routing key the claimed prefix ends in; only its
	// ClaimTag is compared, so a claim the mesh carried as its tag alone
	// holds the same.
	Key  blockkey.Key
	Keys int       // the prefix length Key ends, in routing keys
	At   time.Time // when the receiving table learned it
}

// ClaimTag is the part of a claim's key that the mesh carries and that a
// request's key at the claim's depth must equal: its low 32 bits. Every
// member hears every front's claims, and a claim is mostly its key: with
// 4 bytes of 8 a request's claims take two thirds of the bytes. A
// request's key at that depth equals the tag of another prefix's key by
// chance once in 2^32 claims compared: among the newest 32 claims of
// each of a thousand peers, a routed prompt's matches one in about
// 130,000 requests, and then it scores one peer as holding a prefix it
// does not hold until the claim expires (ClaimTTL).
func ClaimTag(k blockkey.Key) uint32 { return uint32(k) }

// ClaimsFor returns the claims to share for a request with these keys: the
// rendezvous key, where requests that share MinMatchFraction of a prompt
// meet, and then keys at 1.5, 2.25... times its depth; and keys 16, 8, 4
// and 2 before the last, and the last; only those deeper than held, the
// leading keys the target is known to hold already (its match in the
// choice), which every member sees in its digest or heard claimed. Empty
// for a prompt with no keys, or held at its end.
//
// The burst's other requests match a claim that ends within what they
// share, so the claims are checkpoints of the prompt. Those spaced by
// half again keep a shared prefix to two thirds of its length or more: at
// doublings a 1,024-token system prompt in front of 24 tokens of question
// was claimed at 544 tokens, less than half the prefill queued on its way
// to the claimant, and the next request of the burst went elsewhere to
// compute it again. Those back from the end keep it to within the
// requests' own ends, which is where an agent's parallel calls differ
// (their task's context shared, then a few hundred tokens each): agent
// fan-out's calls of 7,200 tokens shared 7,000 with their claimant but
// matched its claim at 6,080, no more than any other pod that held the
// agent's system prompt held, and one in sixteen went to one of those.
//
// Every member receives every front's claims, so at a thousand pods they
// are a term of the mesh's traffic of their own (docs/scale): a request
// that extends a prefix its target holds claims only the extension.
func ClaimsFor(cfg Config, keys []blockkey.Key, held int) []Claim {
	n := len(keys)
	if n == 0 || held >= n {
		return nil
	}
	var buf [48]int
	depths := buf[:0]
	depth := RendezvousDepth(cfg, n)
	for d := depth; d < n; d = (3*d + 1) / 2 {
		depths = append(depths, d)
	}
	for j := tailClaims; j > 0; j-- {
		if d := n - 1<<j; d > depth {
			depths = append(depths, d)
		}
	}
	depths = append(depths, n)
	slices.Sort(depths)
	depths = slices.Compact(depths)
	i, _ := slices.BinarySearch(depths, held+1)
	depths = depths[i:]
	out := make([]Claim, len(depths)) // one allocation per request
	for i, d := range depths {
		out[i] = Claim{Key: keys[d-1], Keys: d}
	}
	return out
}

// tailClaims is how many claims ClaimsFor places back from a prompt's
// end, at 2, 4 ... 2^tailClaims keys before its last.
const tailClaims = 4

// claimedLen is the longest prefix of keys that a live claim covers.
func claimedLen(claims []Claim, keys []blockkey.Key, now time.Time, ttl time.Duration) int {
	best := 0
	for _, c := range claims {
		if c.Keys > best && c.Keys <= len(keys) && ClaimTag(keys[c.Keys-1]) == ClaimTag(c.Key) && (ttl <= 0 || now.Sub(c.At) < ttl) {
			best = c.Keys
		}
	}
	return best
}
