package route

import (
	"math/bits"
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
	cfg RecentConfig
	// peers holds each peer's live keys and their expiry (Unix ns; the
	// latest of every Record). One map per peer keyed by the key alone: a
	// 32k-token forward writes 512 entries, and a (peer, key) map key
	// hashed the peer's name every time, ~4x the cost.
	peers map[string]*recentPeer
	// queue holds entries in Record order, each request's keys tail first,
	// so expiry and eviction drop a chain's tail before its prefix and the
	// live set stays prefix-closed: PrefixLen can binary-search.
	queue []recentEntry
	head  int
}

type recentPeer struct {
	name string
	hash uint64 // IDHash(name)
	live map[blockkey.Key]int64
}

type recentEntry struct {
	peer *recentPeer
	key  blockkey.Key
	exp  int64
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
	return &Recent{cfg: cfg, peers: make(map[string]*recentPeer)}
}

// Record notes that keys, a chain, were sent to peer at now. Only the
// chain's checkpoints are kept (floorCheckpoint), the first MaxEntries of
// them. A nil Recent records nothing.
func (r *Recent) Record(peer string, keys []blockkey.Key, now time.Time) {
	if r == nil || len(keys) == 0 {
		return
	}
	r.Expire(now)
	exp := now.Add(r.cfg.TTL).UnixNano()
	p := r.peers[peer]
	if p == nil {
		p = &recentPeer{name: peer, hash: IDHash(peer), live: make(map[blockkey.Key]int64)}
		r.peers[peer] = p
	}
	count := 0
	for i := floorCheckpoint(len(keys) - 1); i >= 0; i = floorCheckpoint(i - 1) {
		count++
	}
	skip := max(0, count-r.cfg.MaxEntries) // from the tail
	for i := floorCheckpoint(len(keys) - 1); i >= 0; i = floorCheckpoint(i - 1) {
		if skip > 0 {
			skip--
			continue
		}
		k := keys[i]
		if old, ok := p.live[k]; !ok || exp > old {
			p.live[k] = exp
		}
		r.queue = append(r.queue, recentEntry{p, k, exp})
	}
	for len(r.queue)-r.head > r.cfg.MaxEntries {
		r.pop()
	}
	r.compact()
}

// checkpointDense is how many leading keys of a chain Recent keeps all
// of; past them it keeps 16 per doubling of the length.
const checkpointDense = 32

// floorCheckpoint returns the index of the last checkpoint at or before
// index i (-1 if i < 0). The key at index i stands for a prefix of i+1
// keys; the checkpoints are every one of the first checkpointDense, then
// those whose prefix length is a multiple of 2^(⌊log2 n⌋-4). A recorded
// prefix is thus known to within 1/16 of its length, for 5x fewer map
// writes at 512 keys: a 32k-token forward recorded every key in ~250 µs
// of the sidecar's one core, the map cold in cache between requests, and
// the claims (ClaimsFor) hold the exact end of the chain anyway.
func floorCheckpoint(i int) int {
	n := i + 1
	if n <= checkpointDense {
		return i
	}
	step := 1 << (bits.Len(uint(n)) - 5)
	return n/step*step - 1
}

// PrefixLen returns how many leading keys were sent to peer within the
// TTL, to the last checkpoint (floorCheckpoint) at or below it. It tests
// O(log n) keys: the live set is prefix-closed because keys are chained
// (keys[i] implies keys[:i]) and a chain's checkpoints expire tail first.
// A nil Recent holds nothing.
func (r *Recent) PrefixLen(peer string, keys []blockkey.Key, now time.Time) int {
	return r.prefixLen(peer, keys, now, time.Time{})
}

// knows reports whether r holds entries for peer (live or not yet
// expired): a peer it does not know matches nothing by r.
func (r *Recent) knows(peer string) bool {
	return r != nil && r.peers[peer] != nil
}

// known is whom a Recent holds entries for (knows), as one choice asks
// it of every peer: the tags of their names, so that a peer it does not
// know, most of a large mesh's, is answered without a map lookup, which
// hashed each peer's name. A tag set sends the peer to knows.
type known struct {
	r    *Recent   // nil: it knows no one
	tags [4]uint64 // bit t: a name tagged t; every bit while there are many
}

// maxKnown is how many peers a Recent may know for known to list their
// tags: past it most tags are set, and listing costs what it spares.
const maxKnown = 32

// known returns whom r knows now (a nil Recent: no one). A Record or an
// Expire makes it out of date.
func (r *Recent) known() known {
	k := known{r: r}
	switch {
	case r == nil || len(r.peers) == 0:
		k.r = nil // no name to read
	case len(r.peers) > maxKnown:
		k.tags = [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}
	default:
		for name := range r.peers {
			t := tag(name)
			k.tags[t/64] |= 1 << (t % 64)
		}
	}
	return k
}

// has reports whether peer is known: r.knows(peer). Small enough to
// inline: a choice whose Recent knows no one pays a nil test a peer.
func (k *known) has(peer string) bool {
	return k.r != nil && k.tagged(peer)
}

// tagged is has for a Recent that knows someone.
func (k *known) tagged(peer string) bool {
	t := tag(peer)
	return k.tags[t/64]&(1<<(t%64)) != 0 && k.r.knows(peer)
}

// tag is 8 bits of a name from its length and its last 8 bytes (all of
// a shorter one), where one mesh's names differ (an ordinal, a generated
// suffix, an address): a load or two where a hash of the whole name
// costs what the lookup it spares does.
func tag(s string) uint8 {
	n := len(s)
	v := uint64(n)
	switch {
	case n >= 8:
		t := s[n-8 : n]
		v ^= uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
			uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
	case n >= 4: // the first 4 bytes and the last 4, which may overlap
		h, t := s[:4], s[n-4:n]
		v ^= (uint64(h[0]) | uint64(h[1])<<8 | uint64(h[2])<<16 | uint64(h[3])<<24) << 8
		v ^= (uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24) << 32
	default:
		for i := range n {
			v ^= uint64(s[i]) << (8 * (i + 1))
		}
	}
	return uint8((v * 0x9e3779b97f4a7c15) >> 56)
}

// prefixLen is PrefixLen counting only entries recorded after since.
func (r *Recent) prefixLen(peer string, keys []blockkey.Key, now, since time.Time) int {
	if r == nil || len(keys) == 0 {
		return 0
	}
	p := r.peers[peer]
	if p == nil {
		return 0
	}
	t, after := now.UnixNano(), int64(0)
	if !since.IsZero() {
		after = since.Add(r.cfg.TTL).UnixNano() // an entry's expiry is its record time + TTL
	}
	// has(i): the checkpoint at or before i is live; monotone in i.
	has := func(i int) bool {
		exp, ok := p.live[keys[floorCheckpoint(i)]]
		return ok && exp > t && exp > after
	}
	if !has(0) {
		return 0
	}
	n := sort.Search(len(keys), func(i int) bool { return !has(i) })
	return floorCheckpoint(n-1) + 1
}

// Match returns how many leading keys p holds by its digest or by r's
// recent forwards, whichever is longer: what Affinity uses. A peer with
// another key scheme matches nothing. r may be nil.
func (r *Recent) Match(p PeerView, keys []blockkey.Key, now time.Time) int {
	m, _ := newMatcher(&Config{}, &Request{Keys: keys}, DefaultTokensPerKey, now, r).match(&p)
	return m.keys()
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
	n := 0
	for _, p := range r.peers {
		n += len(p.live)
	}
	return n
}

// pop removes the oldest queue entry, and its key unless a later Record
// refreshed it.
func (r *Recent) pop() {
	e := r.queue[r.head]
	r.queue[r.head] = recentEntry{}
	r.head++
	if e.peer.live[e.key] == e.exp {
		delete(e.peer.live, e.key)
		if len(e.peer.live) == 0 {
			delete(r.peers, e.peer.name)
		}
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

// recentSet is whom a Recent knows, for a Shortlist's briefs: a bit per
// IDHash modulo 4096, so that most briefs are passed over without a
// lookup of their ID.
type recentSet struct {
	r    *Recent // nil: it knows no one
	bits [64]uint64
}

// knownNow sets s to whom r knows now (a nil Recent: no one).
func (r *Recent) knownNow(s *recentSet) {
	*s = recentSet{}
	if r == nil || len(r.peers) == 0 {
		return
	}
	s.r = r
	for _, p := range r.peers {
		s.bits[p.hash>>6&63] |= 1 << (p.hash & 63)
	}
}

// may says s may know the peer whose IDHash is h: false for most
// peers a Recent does not know, without a lookup.
func (s *recentSet) may(h uint64) bool { return s.bits[h>>6&63]&(1<<(h&63)) != 0 }

// reaches reports whether the peer of b holds more than depth leading
// keys by r's own forwards: prefixLen > depth, asked of the one entry
// that decides it. A forward records every checkpoint of its chain
// (Record), so the checkpoints it holds of a prompt's keys are a
// prefix of them, and its prefix passes depth exactly when it holds the
// first key and the first checkpoint at or past depth.
func (s *recentSet) reaches(b *Brief, keys []blockkey.Key, depth int, now time.Time) bool {
	if s.r == nil || depth >= len(keys) || !s.may(b.Hash) {
		return false
	}
	p := s.r.peers[b.ID]
	if p == nil {
		return false
	}
	t, after := now.UnixNano(), int64(0)
	if b.Since != 0 {
		after = b.Since + int64(s.r.cfg.TTL)
	}
	has := func(i int) bool {
		exp, ok := p.live[keys[i]]
		return ok && exp > t && exp > after
	}
	c := ceilCheckpoint(depth)
	return c < len(keys) && has(0) && has(c)
}

// ceilCheckpoint is the first checkpoint index at or after i
// (floorCheckpoint's).
func ceilCheckpoint(i int) int {
	n := i + 1
	if n <= checkpointDense {
		return i
	}
	step := 1 << (bits.Len(uint(n)) - 5)
	return (n+step-1)/step*step - 1
}
