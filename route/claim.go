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
// meet, and then keys at twice, four times... its depth, and the last key,
// so a longer shared prefix is claimed at about its length. Empty for a
// prompt with no keys.
func ClaimsFor(cfg Config, keys []blockkey.Key) []Claim {
	if len(keys) == 0 {
		return nil
	}
	var out []Claim
	for n := rendezvousDepth(cfg, len(keys)); n < len(keys); n *= 2 {
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
