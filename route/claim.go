package route

import (
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
	Key  blockkey.Key
	Keys int       // the prefix length Key ends, in routing keys
	At   time.Time // when the receiving table learned it
}

// ClaimsFor returns the claims to share for a request with these keys: the
// rendezvous key, where requests that share MinMatchFraction of a prompt
// meet, and then keys at 1.5, 2.25... times its depth, and the last key, so
// a longer shared prefix is claimed at two thirds of its length or more.
// The last key holds the request's own end, which the burst's other
// requests do not share, so the checkpoints are what they match: at
// doublings a 1,024-token system prompt in front of 24 tokens of question
// was claimed at 544 tokens, less than half the prefill queued on its way
// to the claimant, and the next request of the burst went elsewhere to
// compute it again. Five claims for a prompt of up to 5x its rendezvous
// depth. Empty for a prompt with no keys.
func ClaimsFor(cfg Config, keys []blockkey.Key) []Claim {
	if len(keys) == 0 {
		return nil
	}
	depth, c := rendezvousDepth(cfg, len(keys)), 1
	for n := depth; n < len(keys); n = (3*n + 1) / 2 {
		c++
	}
	out := make([]Claim, 0, c) // counted first: one allocation per request
	for n := depth; n < len(keys); n = (3*n + 1) / 2 {
		out = append(out, Claim{Key: keys[n-1], Keys: n})
	}
	return append(out, Claim{Key: keys[len(keys)-1], Keys: len(keys)})
}

// claimedLen is the longest prefix of keys that a live claim covers.
func claimedLen(claims []Claim, keys []blockkey.Key, now time.Time, ttl time.Duration) int {
	best := 0
	for _, c := range claims {
		if c.Keys > best && c.Keys <= len(keys) && keys[c.Keys-1] == c.Key && (ttl <= 0 || now.Sub(c.At) < ttl) {
			best = c.Keys
		}
	}
	return best
}
