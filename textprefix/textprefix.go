// Package textprefix routes chat prompts without waiting for a tokenization
// of what was seen before. It maps a hash of a conversation's leading
// messages (with everything else that changes their rendering) to the
// routing keys and token count of those messages as the engine rendered
// them, learned from earlier requests.
//
// The facts it rests on: a chat template puts special tokens at message
// boundaries, so the tokens of a conversation's first k messages are
// usually a prefix of the tokens of the whole; and a prompt's newest
// message is by definition cached nowhere, so routing needs only the keys
// of what came before it. "Usually" is checked, not assumed: every entry
// learned for a request that was routed on a shorter entry is compared with
// it (Store.Check), a mismatch drops the entry, and a template that
// mismatches often stops being trusted. A wrong guess costs at most a
// cache hit: the request itself is served with its body untouched.
//
// The package is pure (no sockets, goroutines or logging, and no clock but
// the one a Store is given); the front does the tokenizing and calls it.
package textprefix

import (
	"container/list"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/blockkey"
)

// Hash identifies a conversation prefix: the rendering context and its
// first k messages, byte for byte.
type Hash uint64

// Version is the hash scheme's version; it goes into every chain so that a
// change of scheme never matches old entries.
const Version = 1

// Message is one element of a chat request's messages array.
type Message struct {
	// Raw is the element's JSON as the client sent it. Two spellings of one
	// message hash differently: a miss, never a wrong match.
	Raw []byte
	// Role is the element's top-level "role" string as sent (nil when it
	// has none): an alias into the request, never copied.
	Role []byte
}

// Assistant reports whether m is an assistant turn (a prefix ending in one
// is worth learning only as part of a longer one; see Plan).
func (m Message) Assistant() bool { return string(m.Role) == "assistant" }

// Chain returns the prefix hashes of msgs: out[k-1] identifies ctx plus
// msgs[:k]. ctx must hold everything besides the messages that changes the
// tokens of a prefix: model and adapter, cache salt, tools, chat template
// and its kwargs, add_special_tokens. Each hash covers its whole prefix, so
// equal hashes mean equal prefixes up to a 64-bit collision.
func Chain(ctx []byte, msgs []Message) []Hash {
	out := make([]Hash, len(msgs))
	var d xxhash.Digest
	var buf [8]byte
	h := xxhash.Sum64(append([]byte{Version}, ctx...))
	for i, m := range msgs {
		d.Reset()
		putUint64(buf[:], h)
		d.Write(buf[:])
		putUint64(buf[:], uint64(len(m.Raw))) // no two splits of one byte run collide
		d.Write(buf[:])
		d.Write(m.Raw)
		h = d.Sum64()
		out[i] = Hash(h)
	}
	return out
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// Entry is what a conversation prefix rendered to: its routing keys (the
// caller's key scheme over the prefix's tokens), its token count, and the
// bytes of its messages' JSON (to estimate the tokens of what follows).
// When Chained, Last and Tail continue its key chain (blockkey.Prefix), so
// a longer prefix's entry can be had by tokenizing only what it adds;
// Composed says it was had that way, not by a tokenization of the whole.
type Entry struct {
	Keys     []blockkey.Key
	Tokens   int
	Bytes    int
	Chained  bool
	Composed bool
	Last     blockkey.Key
	Tail     []uint32
}

// NewEntry is the entry of a prefix at p whose messages are bytes long.
func NewEntry(p blockkey.Prefix, bytes int) Entry {
	return Entry{Keys: p.Keys, Tokens: p.Tokens, Bytes: bytes, Chained: true, Last: p.Last, Tail: p.Tail}
}

// Prefix is e's place in the key chain (meaningful when e.Chained).
func (e Entry) Prefix() blockkey.Prefix {
	return blockkey.Prefix{Keys: e.Keys, Tokens: e.Tokens, Last: e.Last, Tail: e.Tail}
}

// DefaultTTL is how long NewStore's entries are kept unused. An entry
// saves one /tokenize call for a conversation's next turn and is worth it
// only while that conversation's prefix may still be cached: a busy pod
// turns its cache over in about two minutes (the simulator's H100 holds
// 432k tokens and prefills 16.7k a second, so a quarter of that in new
// prefixes evicts all of it in 104 s). A conversation idle for longer pays
// one /tokenize call on its next turn, as a new one does. It also makes
// the store's size a function of the last few minutes' traffic, reached
// within them, rather than of everything since the start: without it the
// 30-minute soak's stores grew the whole run (every sidecar holds the
// mesh's entries), at about 0.5 MB of heap a minute.
const DefaultTTL = 3 * time.Minute

// entryBytes is what an entry costs besides its keys' and tail's arrays:
// its item (96 B), list element (48 B), map slot and a share of the
// map's buckets (TestStoreMemory measures it). The size bound counts it,
// so that entries of no keys (prefixes shorter than a routing key) are
// bounded too.
const entryBytes = 200

// Store is a bounded map of prefix entries, least recently used evicted
// first, sized by memory in units of a key (8 bytes: an entry's keys, its
// tail and its fixed cost), and aged: an entry unused (Get or Put) for the
// TTL is dropped. It is not safe for concurrent use.
type Store struct {
	maxKeys int
	cost    int // of every entry, in keys (entryCost)
	keys    int
	ttl     time.Duration
	now     func() time.Time
	ll      *list.List // of *item, most recent first
	items   map[Hash]*list.Element

	checks, mismatches int
}

type item struct {
	h    Hash
	e    Entry
	used int64 // when last used (Get or Put), Unix nanoseconds
}

// NewStore returns a store of at most maxKeys keys' memory (at least one
// entry is always kept), whose entries unused for DefaultTTL are dropped.
func NewStore(maxKeys int) *Store { return NewStoreTTL(maxKeys, DefaultTTL, time.Now) }

// NewStoreTTL is NewStore with entries kept unused for ttl (0: until the
// size bound evicts them), by the clock now.
func NewStoreTTL(maxKeys int, ttl time.Duration, now func() time.Time) *Store {
	return &Store{maxKeys: maxKeys, ttl: ttl, now: now, ll: list.New(), items: map[Hash]*list.Element{}}
}

// entryCost is e's memory in keys, rounded up.
func entryCost(e Entry) int { return cap(e.Keys) + (4*cap(e.Tail)+entryBytes+7)/8 }

// Len is the number of entries; Keys the keys they hold.
func (s *Store) Len() int  { return s.ll.Len() }
func (s *Store) Keys() int { return s.keys }

// Get returns h's entry and marks it used.
func (s *Store) Get(h Hash) (Entry, bool) {
	now := s.expire()
	el, ok := s.items[h]
	if !ok {
		return Entry{}, false
	}
	s.ll.MoveToFront(el)
	it := el.Value.(*item)
	it.used = now
	return it.e, true
}

// Has reports whether h has an entry, without marking it used.
func (s *Store) Has(h Hash) bool {
	s.expire()
	_, ok := s.items[h]
	return ok
}

// Put stores e under h (replacing any entry) and evicts the least recently
// used entries past the size bound. e.Keys is kept, not copied.
func (s *Store) Put(h Hash, e Entry) {
	now := s.expire()
	if el, ok := s.items[h]; ok {
		it := el.Value.(*item)
		s.keys += len(e.Keys) - len(it.e.Keys)
		s.cost += entryCost(e) - entryCost(it.e)
		it.e, it.used = e, now
		s.ll.MoveToFront(el)
	} else {
		s.items[h] = s.ll.PushFront(&item{h: h, e: e, used: now})
		s.keys += len(e.Keys)
		s.cost += entryCost(e)
	}
	for s.cost > s.maxKeys && s.ll.Len() > 1 {
		s.remove(s.ll.Back())
	}
}

// Delete drops h's entry.
func (s *Store) Delete(h Hash) {
	if el, ok := s.items[h]; ok {
		s.remove(el)
	}
}

// expire drops the entries unused for the TTL (the list's tail, which is
// in order of use) and returns the time now.
func (s *Store) expire() int64 {
	now := s.now().UnixNano()
	if s.ttl <= 0 {
		return now
	}
	for el := s.ll.Back(); el != nil && now-el.Value.(*item).used >= int64(s.ttl); el = s.ll.Back() {
		s.remove(el)
	}
	return now
}

func (s *Store) remove(el *list.Element) {
	it := s.ll.Remove(el).(*item)
	delete(s.items, it.h)
	s.keys -= len(it.e.Keys)
	s.cost -= entryCost(it.e)
}

// Trust thresholds: after minChecks checks, a store whose guesses were
// wrong more than one time in maxWrongRatio stops routing on them (the
// engine's template does not render prefixes as prefixes).
const (
	minChecks     = 20
	maxWrongRatio = 20 // 5%
)

// Check compares a guess with the truth for one request: used is the entry
// it was routed on (stored under h), learned the entry later tokenized for a
// longer prefix of the same conversation. The guess was right when used's
// keys are a prefix of learned's and its tokens no more. A wrong entry is
// dropped. It returns whether the guess was right.
func (s *Store) Check(h Hash, used, learned Entry) bool {
	ok := used.Tokens <= learned.Tokens && len(used.Keys) <= len(learned.Keys) &&
		(len(used.Keys) == 0 || learned.Keys[len(used.Keys)-1] == used.Keys[len(used.Keys)-1])
	s.checks++
	if !ok {
		s.mismatches++
		s.Delete(h)
	}
	return ok
}

// Trusted reports whether guesses have been right often enough to route on.
func (s *Store) Trusted() bool {
	return s.checks < minChecks || s.mismatches*maxWrongRatio <= s.checks
}

// Checks returns how many guesses were checked and how many were wrong.
func (s *Store) Checks() (checks, wrong int) { return s.checks, s.mismatches }
