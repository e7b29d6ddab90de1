// Package respown is the table of which node owns each stored response.
//
// vLLM keeps the Responses API store (VLLM_ENABLE_RESPONSES_API_STORE=1)
// in one process's memory, so a follow-up naming a response
// (previous_response_id, GET /v1/responses/{id}, POST .../{id}/cancel)
// works only on the pod that created it. Every sidecar keeps this table of
// response id to owning node, filled by what the mesh announces, so that
// whichever sidecar a request enters can send it on to the owner.
//
// The table is bounded by entry count and forgets the oldest first. A node
// that leaves the mesh keeps its entries for GoneFor, marked gone (Gone);
// a node that comes back (Back) has them again. Leaving is not proof that
// the pod's store is gone: a sidecar that restarts, or is killed and
// restarted, leaves and comes back with its vLLM, and so its store, alive.
// So Lookup calls an owner Away for Grace after it left (its responses may
// be back: answer retryably) and Gone only after that (answer that the pod
// holding it is gone, rather than that it never existed); Away lists the
// nodes that may still come back, of which any may hold a response the
// table never heard of. Each entry keeps when it was recorded, so a caller
// that sees the owner's engine begin anew after it can tell the response
// went with the old one. The table is plain data, with time passed in: it
// starts no goroutine, and the caller serialises its use.
package respown

import (
	"strings"
	"time"
)

// Defaults for New.
const (
	// DefaultMaxEntries bounds the table at about 19 MB of vLLM-made ids:
	// BenchmarkAdd measures 75 bytes per entry of an id Key packs (the
	// ring's 28 and the map's), 171 for other ids (which the table keeps
	// as strings). At 20 new responses a second across the mesh that is
	// 3.6 hours of them.
	DefaultMaxEntries = 1 << 18
	// DefaultGoneFor is how long a gone node's entries are kept.
	DefaultGoneFor = 30 * time.Minute
	// DefaultGrace is how long a node that left is Away rather than Gone.
	// It covers a sidecar restarting with its pod's vLLM alive: a graceful
	// restart was back in the mesh ~2 s after it left, a SIGKILLed one
	// ~2 s after memberlist declared it dead (chaos restart-sidecar and
	// kill-sidecar). The price is on pods that really went (a replaced or
	// deleted pod): their responses' follow-ups get a retryable 503 for
	// this long before the final 404. A sidecar whose restart takes longer
	// (a crash-loop backoff) gets 404s for its responses until it is back;
	// then they are served again.
	DefaultGrace = 10 * time.Second
)

// Entry is one response and the node that owns it.
type Entry struct{ ID, Node string }

// Status is what the table knows of an entry's owner.
type Status uint8

const (
	// Live: the owner is in the mesh.
	Live Status = iota + 1
	// Away: the owner left less than Grace ago; it may come back with its
	// store.
	Away
	// Gone: the owner left Grace ago or more; its store is taken as gone.
	Gone
)

func (s Status) String() string {
	switch s {
	case Live:
		return "live"
	case Away:
		return "away"
	case Gone:
		return "gone"
	}
	return "unknown"
}

// Lookup is what the table holds about one response.
type Lookup struct {
	Node   string
	Status Status
	// At is when the entry was recorded here, to the second (rounded
	// down): the response was made no later than At+1s.
	At time.Time
	// Left is when the owner left the mesh; zero while it is Live.
	Left time.Time
}

// Table maps response ids to their owning node. Its zero value is not
// usable; call New. It is not safe for concurrent use.
//
// The entries live in a ring of at most max slots, in the order they were
// added, so the oldest is the next one overwritten. A removed entry (moved
// to another owner, or its gone owner expired) leaves an empty slot that
// the ring passes over in turn, so the table holds the newest entries of
// the last max added.
type Table struct {
	max     int
	goneFor time.Duration
	grace   time.Duration
	ring    []slot // grows to max, then wraps at next
	next    int
	live    int               // entries held
	packed  map[Key]uint32    // ids KeyOf packs → slot index
	raw     map[string]uint32 // other ids → slot index
	rawAt   map[uint32]string // slot index → its raw id
	owners  []owner           // by slot.owner-1; a freed one has no name
	byName  map[string]uint32 // owner name → index in owners
	free    []uint32          // freed indexes in owners
	due     time.Time         // when the first gone owner expires; zero for none
}

// slot is one ring position. It holds no pointer: the ring of a full table
// costs the garbage collector nothing to mark.
type slot struct {
	key   Key    // the packed id; zero for a raw one
	owner uint32 // 1 + index in owners; 0: empty
	at    uint32 // when recorded, in Unix seconds (4 bytes, not a time.Time's 24)
	raw   bool   // the id is in rawAt
}

type owner struct {
	name   string
	n      int // entries
	gone   bool
	goneAt time.Time
	lost   bool // gone with its store: Gone at once (Lost)
}

// New returns an empty table of at most maxEntries entries (at least 1),
// whose gone nodes' entries are kept for goneFor, Away for the first grace
// of it.
func New(maxEntries int, goneFor, grace time.Duration) *Table {
	return &Table{
		max:     max(maxEntries, 1),
		goneFor: goneFor,
		grace:   grace,
		packed:  map[Key]uint32{},
		raw:     map[string]uint32{},
		rawAt:   map[uint32]string{},
		byName:  map[string]uint32{},
	}
}

// Add records that node owns ids, newest last. An id already owned by
// another node moves to node, as the newest entry: the latest creation of
// an id a client chose twice is where it now lives. Ids that are not Valid
// are refused; Add returns how many it refused. When the table is full,
// each new entry replaces the oldest. now runs the expiry of gone nodes
// that is due.
func (t *Table) Add(node string, ids []string, now time.Time) (refused int) {
	return t.add(node, ids, now, true)
}

// Fill is Add for what a peer remembers rather than what a node just
// served: it records only the ids the table does not hold, so an older
// copy never undoes a newer announcement.
func (t *Table) Fill(node string, ids []string, now time.Time) (refused int) {
	return t.add(node, ids, now, false)
}

func (t *Table) add(node string, ids []string, now time.Time, move bool) (refused int) {
	t.expireDue(now)
	if node == "" {
		return len(ids)
	}
	o := uint32(0)
	for _, id := range ids {
		if !Valid(id) {
			refused++
			continue
		}
		i, ok := t.find(id)
		if ok {
			if cur := t.ring[i].owner; !move || (o != 0 && cur == o) || t.owners[cur-1].name == node {
				continue
			}
			t.remove(i)
		}
		if o == 0 {
			o = t.ownerOf(node)
		}
		t.insert(id, o, now)
	}
	return refused
}

// Owner returns the node that owns id, gone or not. A gone node's entries
// are dropped by the first Add, Fill, Gone or Expire after they expire.
func (t *Table) Owner(id string) (node string, ok bool) {
	i, ok := t.find(id)
	if !ok {
		return "", false
	}
	return t.owners[t.ring[i].owner-1].name, true
}

// Lookup returns what the table holds about id at now: its owner, whether
// the owner is Live, Away or Gone, and when the entry was recorded.
func (t *Table) Lookup(id string, now time.Time) (Lookup, bool) {
	i, ok := t.find(id)
	if !ok {
		return Lookup{}, false
	}
	s := t.ring[i]
	o := t.owners[s.owner-1]
	l := Lookup{Node: o.name, Status: Live, At: time.Unix(int64(s.at), 0)}
	if o.gone {
		l.Left, l.Status = o.goneAt, t.status(o, now)
	}
	return l, true
}

// status is a gone owner's status at now.
func (t *Table) status(o owner, now time.Time) Status {
	if !o.lost && now.Sub(o.goneAt) < t.grace {
		return Away
	}
	return Gone
}

// Away returns the nodes that left less than Grace ago, in no order: any
// of them may be back with responses this table never heard of (made
// while it was out of reach, or announced to a table that has restarted).
func (t *Table) Away(now time.Time) []string {
	var out []string
	for _, o := range t.owners {
		if o.name != "" && o.gone && t.status(o, now) == Away {
			out = append(out, o.name)
		}
	}
	return out
}

// Gone marks node as having left the mesh at now: its entries, and any
// added for it meanwhile, are kept and dropped GoneFor later unless it
// comes back first. A node already gone keeps the time it went.
func (t *Table) Gone(node string, now time.Time) {
	t.expireDue(now)
	if node == "" {
		return
	}
	o := &t.owners[t.ownerOf(node)-1]
	if o.gone {
		return
	}
	o.gone, o.goneAt = true, now
	if d := now.Add(t.goneFor); t.due.IsZero() || d.Before(t.due) {
		t.due = d
	}
}

// Lost is Gone for a node known to have lost its store as it left (its
// sidecar said so: nothing listened at its vLLM's address): its entries
// are Gone at once, with no grace.
func (t *Table) Lost(node string, now time.Time) {
	t.Gone(node, now)
	if i, ok := t.byName[node]; ok {
		t.owners[i].lost = true
	}
}

// Back undoes Gone: node is in the mesh again and its entries stay.
func (t *Table) Back(node string) {
	if i, ok := t.byName[node]; ok {
		t.owners[i].gone, t.owners[i].goneAt, t.owners[i].lost = false, time.Time{}, false
	}
}

// IsGone reports whether node is marked gone.
func (t *Table) IsGone(node string) bool {
	i, ok := t.byName[node]
	return ok && t.owners[i].gone
}

// Expire drops the entries of every node gone for GoneFor or longer at
// now, and returns how many it dropped. Add, Fill and Gone call it when an
// expiry is due; a caller that may go long without them calls it itself.
func (t *Table) Expire(now time.Time) int {
	var expired []bool // by slot.owner
	dropped := 0
	t.due = time.Time{}
	for i := range t.owners {
		o := &t.owners[i]
		switch end := o.goneAt.Add(t.goneFor); {
		case !o.gone:
		case !now.Before(end):
			if expired == nil {
				expired = make([]bool, len(t.owners)+1)
			}
			expired[i+1] = true
			dropped += o.n
		case t.due.IsZero() || end.Before(t.due):
			t.due = end
		}
	}
	if dropped > 0 {
		for i, s := range t.ring {
			if expired[s.owner] {
				t.remove(uint32(i))
			}
		}
	}
	// Owners with no entries are freed here only, never while an Add may
	// still be inserting for one; a gone one only once it expired, so that
	// what it adds before then is gone too.
	for i := range t.owners {
		if o := &t.owners[i]; o.name != "" && o.n == 0 && (!o.gone || (expired != nil && expired[i+1])) {
			delete(t.byName, o.name)
			*o = owner{}
			t.free = append(t.free, uint32(i))
		}
	}
	return dropped
}

func (t *Table) expireDue(now time.Time) {
	if !t.due.IsZero() && !now.Before(t.due) {
		t.Expire(now)
	}
}

// Len returns the number of entries held, gone nodes' included.
func (t *Table) Len() int { return t.live }

// Recent returns up to n of the newest entries whose node is not gone,
// oldest first, so that adding them in order keeps their order.
func (t *Table) Recent(n int) []Entry {
	if n <= 0 || t.live == 0 {
		return nil
	}
	var out []Entry
	newest := len(t.ring) - 1
	if len(t.ring) == t.max {
		newest = (t.next - 1 + t.max) % t.max
	}
	for k := 0; k < len(t.ring) && len(out) < n; k++ {
		i := uint32((newest - k + len(t.ring)) % len(t.ring))
		s := t.ring[i]
		if s.owner == 0 || t.owners[s.owner-1].gone {
			continue
		}
		if out == nil {
			out = make([]Entry, 0, min(n, t.live))
		}
		out = append(out, Entry{ID: t.idAt(i), Node: t.owners[s.owner-1].name})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func (t *Table) find(id string) (uint32, bool) {
	if k, ok := KeyOf(id); ok {
		i, ok := t.packed[k]
		return i, ok
	}
	i, ok := t.raw[id]
	return i, ok
}

func (t *Table) idAt(i uint32) string {
	if t.ring[i].raw {
		return t.rawAt[i]
	}
	return t.ring[i].key.String()
}

// ownerOf returns 1 + the index of node's owner, made if need be.
func (t *Table) ownerOf(node string) uint32 {
	if i, ok := t.byName[node]; ok {
		return i + 1
	}
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		i = uint32(len(t.owners))
		t.owners = append(t.owners, owner{})
	}
	t.owners[i] = owner{name: node}
	t.byName[node] = i
	return i + 1
}

// insert puts id, owned by o and recorded at now, in the next slot,
// replacing the oldest entry when the ring is full.
func (t *Table) insert(id string, o uint32, now time.Time) {
	var i uint32
	if len(t.ring) < t.max {
		i = uint32(len(t.ring))
		t.ring = append(t.ring, slot{})
	} else {
		i = uint32(t.next)
		t.next = (t.next + 1) % t.max
		if t.ring[i].owner != 0 {
			t.remove(i)
		}
	}
	s := slot{owner: o, at: uint32(max(now.Unix(), 0))}
	if k, ok := KeyOf(id); ok {
		s.key = k
		t.packed[k] = i
	} else {
		s.raw = true
		id = strings.Clone(id) // not a piece of the caller's buffer
		t.raw[id] = i
		t.rawAt[i] = id
	}
	t.ring[i] = s
	t.owners[o-1].n++
	t.live++
}

// remove empties slot i. Its owner stays, even with no entries left, until
// Expire frees it.
func (t *Table) remove(i uint32) {
	s := t.ring[i]
	if s.raw {
		delete(t.raw, t.rawAt[i])
		delete(t.rawAt, i)
	} else {
		delete(t.packed, s.key)
	}
	t.owners[s.owner-1].n--
	t.live--
	t.ring[i] = slot{}
}
