package route

import (
	"sort"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Recent remembers, for a short TTL, which keys this sidecar just sent to
// which peer (docs/design.md D4), so the next request of a burst or a
// conversation follows the first before the target's digest shows it.
//
// A Recent is a value machine like the rest of the package: it takes now
// as an argument and has no locks. The caller serialises access (one
// mutex around Record, PrefixLen and Expire). Memory is bounded by
// RecentConfig.MaxEntries.
type Recent struct {
	cfg  RecentConfig
	live map[recentKey]int64 // expiry, Unix ns; the latest of every Record
	// queue holds entries in Record order, each request's keys tail first,
	// so expiry and eviction drop a chain's tail before its prefix and the
	// live set stays prefix-closed: PrefixLen can binary-search.
	queue []recentEntry
	head  int
}

type recentKey struct {
	peer string
	key  blockkey.Key
}

type recentEntry struct {
	recentKey
	exp int64
}

// NewRecent returns an empty Recent.
func NewRecent(cfg RecentConfig) *Recent {
	d := DefaultRecentConfig()
	if cfg.TTL < 1 {
		cfg.TTL = d.TTL
	}
	if cfg.MaxEntries < 1 {
		cfg.MaxEntries = d.MaxEntries
	}
	return &Recent{cfg: cfg, live: make(map[recentKey]int64)}
}

// Record notes that keys, a chain, were sent to peer at now. Only the
// first MaxEntries keys are kept. A nil Recent records nothing.
func (r *Recent) Record(peer string, keys []blockkey.Key, now time.Time) {
	if r == nil || len(keys) == 0 {
		return
	}
	r.Expire(now)
	keys = keys[:min(len(keys), r.cfg.MaxEntries)]
	exp := now.Add(r.cfg.TTL).UnixNano()
	for i := len(keys) - 1; i >= 0; i-- {
		k := recentKey{peer, keys[i]}
		if old, ok := r.live[k]; !ok || exp > old {
			r.live[k] = exp
		}
		r.queue = append(r.queue, recentEntry{k, exp})
	}
	for len(r.queue)-r.head > r.cfg.MaxEntries {
		r.pop()
	}
	r.compact()
}

// PrefixLen returns how many leading keys were sent to peer within the
// TTL. It tests O(log n) keys: the live set is prefix-closed because keys
// are chained (keys[i] implies keys[:i]). A nil Recent holds nothing.
func (r *Recent) PrefixLen(peer string, keys []blockkey.Key, now time.Time) int {
	return r.prefixLen(peer, keys, now, time.Time{})
}

// prefixLen is PrefixLen counting only entries recorded after since.
func (r *Recent) prefixLen(peer string, keys []blockkey.Key, now, since time.Time) int {
	if r == nil || len(keys) == 0 || len(r.live) == 0 {
		return 0
	}
	t, after := now.UnixNano(), int64(0)
	if !since.IsZero() {
		after = since.Add(r.cfg.TTL).UnixNano() // an entry's expiry is its record time + TTL
	}
	has := func(i int) bool {
		exp, ok := r.live[recentKey{peer, keys[i]}]
		return ok && exp > t && exp > after
	}
	if !has(0) {
		return 0
	}
	return sort.Search(len(keys), func(i int) bool { return !has(i) })
}

// Match returns how many leading keys p holds by its digest or by r's
// recent forwards, whichever is longer: what Affinity uses. A peer with
// another key scheme matches nothing. r may be nil.
func (r *Recent) Match(p PeerView, keys []blockkey.Key, now time.Time) int {
	n, _ := matchPeer(p, keys, now, Config{}, r)
	return n
}

// Expire drops entries whose TTL has passed by now.
func (r *Recent) Expire(now time.Time) {
	if r == nil {
		return
	}
	t := now.UnixNano()
	for r.head < len(r.queue) && r.queue[r.head].exp <= t {
		r.pop()
	}
	r.compact()
}

// Len returns the number of live (peer, key) entries, expired or not yet
// swept.
func (r *Recent) Len() int {
	if r == nil {
		return 0
	}
	return len(r.live)
}

// pop removes the oldest queue entry, and its key unless a later Record
// refreshed it.
func (r *Recent) pop() {
	e := r.queue[r.head]
	r.queue[r.head] = recentEntry{}
	r.head++
	if r.live[e.recentKey] == e.exp {
		delete(r.live, e.recentKey)
	}
}

// compact reclaims the queue's popped front once it is half the slice.
func (r *Recent) compact() {
	if r.head == len(r.queue) {
		r.queue, r.head = r.queue[:0], 0
		return
	}
	if r.head > 1024 && r.head > len(r.queue)/2 {
		n := copy(r.queue, r.queue[r.head:])
		clear(r.queue[n:])
		r.queue, r.head = r.queue[:n], 0
	}
}
