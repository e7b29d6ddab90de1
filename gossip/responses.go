package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/respown"
)

// Which node holds each stored response (kindResponses). vLLM's Responses
// store lives in one vLLM process, so a follow-up (previous_response_id,
// GET /v1/responses/{id}, POST .../{id}/cancel) must reach the pod that
// created the response, from whichever sidecar it enters. The node that
// served a response announces it to every member, and each keeps the
// mapping in a respown.Table; there is no central store.
//
// An announcement goes by TCP. A lost claim costs a cache miss; a lost
// announcement costs the client a 404 for a response that exists, so it
// cannot ride on the load report's UDP packet. Nor does it go per
// response: what is announced within LoadPushDelay goes out together, at
// most one flush per LoadPushInterval as the load push does, in messages
// of up to respBatch ids. A busy node opens one TCP connection per member
// per flush (25 ms at least apart), not one per response.
//
// A sidecar that restarts has an empty table while its pod's vLLM, and so
// its store, lives on. memberlist's push/pull carries the table's newest
// entries (LocalState; maxRespEntries at a join, respSyncEntries in the
// periodic exchange, which also repairs a lost announcement), so a
// (re)joining node learns who owns what, its own pod's responses included,
// during Join. A peer that joins after an announcement went out gets the
// announcer's latest ones again when the announcer sees it join, which
// covers the window before the join push/pull reached everyone.
//
// Wire form:
//
//	kind | version u8 (1) | flags u8 | owner count uvarint |
//	(name len u8 | name)* | entry count uvarint | (owner index uvarint | id)*
//
// where id is 0 and the 16 bytes of a vLLM id (respown.Key), or its
// length (1 to respown.MaxIDBytes) and its bytes. Flag respState marks
// what a node remembers (push/pull state, a replay) rather than what it
// just served: it fills gaps and never moves an id the receiver holds.

const (
	respVersion      = 1
	respState   byte = 1 << 0
)

const (
	// maxRespEntries bounds the entries in one message, and the push/pull
	// state sent to a joining node, which gets it from every peer it
	// contacts: 8192 vLLM ids are ~150 KB, about one full digest, which it
	// also gets from every peer.
	maxRespEntries = 1 << 13
	// respSyncEntries is the periodic push/pull's share: what a lost
	// announcement needs, which is recent.
	respSyncEntries = 1 << 10
	// respBatch bounds the ids in one announcement (~10 KB).
	respBatch = 512
	// respReplay is how many of its own latest announcements a node sends
	// again to a peer that joins.
	respReplay = 1 << 10
	// respPending bounds the announcements waiting for the next flush; past
	// it the oldest are not sent (peers learn them by push/pull).
	respPending = 1 << 14
	// respNewcomers bounds the peers replayed to in one flush; more joined
	// at once learn by push/pull alone.
	respNewcomers = 64
	// respSweep is how often a quiet table drops gone nodes' entries.
	respSweep = 10 * time.Second
)

// responsesMsg is a list of responses and their owners, in table order.
type responsesMsg struct {
	State   bool // respState: fill gaps only
	Entries []respown.Entry
}

// maxOwnerName is the longest node name an entry can carry (one length
// byte).
const maxOwnerName = 255

func encodeResponses(r responsesMsg) ([]byte, error) {
	if len(r.Entries) > maxRespEntries {
		return nil, fmt.Errorf("encode responses: %d entries, at most %d", len(r.Entries), maxRespEntries)
	}
	index := map[string]uint64{}
	var names []string
	size := 16
	for _, e := range r.Entries {
		if e.Node == "" || len(e.Node) > maxOwnerName || !respown.Valid(e.ID) {
			return nil, fmt.Errorf("encode responses: id of %d bytes on node %q", len(e.ID), e.Node)
		}
		if _, ok := index[e.Node]; !ok {
			index[e.Node] = uint64(len(names))
			names = append(names, e.Node)
			size += 1 + len(e.Node)
		}
		size += binary.MaxVarintLen16 + 1 + len(e.ID)
	}
	var flags byte
	if r.State {
		flags |= respState
	}
	b := make([]byte, 0, size)
	b = append(b, kindResponses, respVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		b = append(b, byte(len(n)))
		b = append(b, n...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Entries)))
	for _, e := range r.Entries {
		b = binary.AppendUvarint(b, index[e.Node])
		if k, ok := respown.KeyOf(e.ID); ok {
			b = append(b, 0)
			b = append(b, k[:]...)
			continue
		}
		b = append(b, byte(len(e.ID)))
		b = append(b, e.ID...)
	}
	return b, nil
}

// decodeResponses parses b without its kind byte. The result does not
// alias b.
func decodeResponses(b []byte) (responsesMsg, error) {
	if len(b) < 2 {
		return responsesMsg{}, errors.New("responses: truncated header")
	}
	if b[0] > respVersion {
		return responsesMsg{}, fmt.Errorf("responses: version %d: %w", b[0], ErrNewer)
	}
	if b[0] != respVersion {
		return responsesMsg{}, fmt.Errorf("responses: version %d", b[0])
	}
	if b[1]&^respState != 0 {
		return responsesMsg{}, fmt.Errorf("responses: flags %#x", b[1])
	}
	r := responsesMsg{State: b[1]&respState != 0}
	b = b[2:]
	// A count is believed only as far as the bytes left could hold it (an
	// owner takes 2 bytes at least, an entry 3), so a bad one cannot make
	// us allocate more than the message's size.
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxRespEntries || n > uint64(len(b)-k)/2 {
		return responsesMsg{}, errors.New("responses: owner count truncated or out of range")
	}
	b = b[k:]
	names := make([]string, n)
	for i := range names {
		if len(b) < 1 || b[0] == 0 || len(b) < 1+int(b[0]) {
			return responsesMsg{}, fmt.Errorf("responses: owner %d truncated or empty", i)
		}
		names[i], b = string(b[1:1+int(b[0])]), b[1+int(b[0]):]
	}
	c, k := binary.Uvarint(b)
	if k <= 0 || c > maxRespEntries || c > uint64(len(b)-k)/3 {
		return responsesMsg{}, errors.New("responses: entry count truncated or out of range")
	}
	b = b[k:]
	r.Entries = make([]respown.Entry, 0, c)
	for i := range c {
		o, k := binary.Uvarint(b)
		if k <= 0 || o >= n {
			return responsesMsg{}, fmt.Errorf("responses: entry %d: owner index truncated or out of range", i)
		}
		b = b[k:]
		var id string
		switch {
		case len(b) < 1:
			return responsesMsg{}, fmt.Errorf("responses: entry %d: truncated id", i)
		case b[0] == 0:
			var key respown.Key
			if len(b) < 1+len(key) {
				return responsesMsg{}, fmt.Errorf("responses: entry %d: truncated id", i)
			}
			copy(key[:], b[1:])
			id, b = key.String(), b[1+len(key):]
		default:
			l := int(b[0])
			if l > respown.MaxIDBytes || len(b) < 1+l {
				return responsesMsg{}, fmt.Errorf("responses: entry %d: id of %d bytes", i, l)
			}
			id, b = string(b[1:1+l]), b[1+l:]
		}
		r.Entries = append(r.Entries, respown.Entry{ID: id, Node: names[o]})
	}
	if len(b) != 0 {
		return responsesMsg{}, fmt.Errorf("responses: %d trailing bytes", len(b))
	}
	return r, nil
}

func decodeResponsesMsg(b []byte) (payload, error) { return decodeResponses(b) }

func (r responsesMsg) encode() ([]byte, error) { return encodeResponses(r) }

// apply records the entries, a run of one owner's at a time, at most
// respBatch under one hold of the lock: NotifyJoin and NotifyLeave wait
// for it under memberlist's node lock. An owner that is not a member now
// (it left before we heard of it, or before its message got here) is
// marked gone, so its entries age out.
func (r responsesMsg) apply(m *Mesh, now time.Time) {
	rs := &m.responses
	ids := make([]string, 0, min(len(r.Entries), respBatch))
	for i := 0; i < len(r.Entries); {
		node := r.Entries[i].Node
		ids = ids[:0]
		for ; i < len(r.Entries) && r.Entries[i].Node == node && len(ids) < respBatch; i++ {
			ids = append(ids, r.Entries[i].ID)
		}
		rs.mu.Lock()
		if r.State {
			rs.table.Fill(node, ids, now)
		} else {
			rs.table.Add(node, ids, now)
		}
		// Under rs.mu, so a NotifyJoin's Back cannot slip in between.
		if !m.isMember(node) {
			rs.table.Gone(node, now)
		}
		rs.mu.Unlock()
	}
}

// responses is this node's table of response owners and what it has yet
// to tell peers about its own. Its lock is taken before members.mu
// (apply), never after.
type responses struct {
	mu         sync.Mutex
	table      *respown.Table
	pending    []respown.Entry // announced, for the next flush
	recent     []respown.Entry // the last respReplay announced, a ring at recentNext
	recentNext int
	newcomers  []string      // peers joined since the last flush: replay recent to them
	kick       chan struct{} // wakes responsesLoop
}

func (r *responses) init() {
	r.table = respown.New(respown.DefaultMaxEntries, respown.DefaultGoneFor, respown.DefaultGrace)
	r.kick = make(chan struct{}, 1)
}

func (r *responses) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// AnnounceResponses records that this node's vLLM stored responses ids and
// tells every member, reliably, within LoadPushDelay to LoadPushInterval.
// This node's own ResponseOwner knows them at once. Ids that are not
// respown.Valid are ignored: such a response is routed like any request.
func (m *Mesh) AnnounceResponses(ids ...string) { m.announce(m.cfg.NodeName, ids) }

// AnnounceResponsesOf is AnnounceResponses for responses that node's vLLM
// stored when this sidecar sent it their requests directly: node's own
// sidecar, away or draining, never saw them pass, and without this the
// mesh would learn of them only by asking every pod (forward's probe).
func (m *Mesh) AnnounceResponsesOf(node string, ids ...string) {
	if node == "" || len(node) > maxOwnerName {
		return
	}
	m.announce(node, ids)
}

func (m *Mesh) announce(node string, ids []string) {
	r := &m.responses
	now := m.now()
	r.mu.Lock()
	r.table.Add(node, ids, now)
	if !m.isMember(node) {
		r.table.Gone(node, now) // away: its entries age out unless it is back
	}
	for _, id := range ids {
		if !respown.Valid(id) {
			continue
		}
		e := respown.Entry{ID: strings.Clone(id), Node: node} // not a piece of the caller's body
		if len(r.pending) == respPending {
			r.pending = r.pending[1:]
		}
		r.pending = append(r.pending, e)
		if len(r.recent) < respReplay {
			r.recent = append(r.recent, e)
		} else {
			r.recent[r.recentNext] = e
			r.recentNext = (r.recentNext + 1) % respReplay
		}
	}
	r.mu.Unlock()
	r.wake()
}

// ResponseOwner returns the node that holds response id, and whether that
// node is a live member now (this node always is). ok is false for an id
// no member announced, or one forgotten: the table keeps the newest
// respown.DefaultMaxEntries, and a gone node's for respown.DefaultGoneFor.
func (m *Mesh) ResponseOwner(id string) (node string, alive, ok bool) {
	r := &m.responses
	r.mu.Lock()
	node, ok = r.table.Owner(id)
	r.mu.Unlock()
	if !ok {
		return "", false, false
	}
	return node, m.isMember(node), true
}

// LookupResponse returns what this node knows of response id's owner: who,
// whether it is a member now (respown.Live), left a moment ago and may be
// back with its store (respown.Away, for respown.DefaultGrace) or left
// long enough ago to be taken as gone (respown.Gone), and when the entry
// was recorded here. ok is false as for ResponseOwner.
func (m *Mesh) LookupResponse(id string) (l respown.Lookup, ok bool) {
	r := &m.responses
	now := m.now()
	r.mu.Lock()
	l, ok = r.table.Lookup(id, now)
	r.mu.Unlock()
	if ok && l.Status == respown.Live && !m.isMember(l.Node) {
		// It left and NotifyLeave has not reached the table yet.
		l.Status, l.Left = respown.Away, now
	}
	return l, ok
}

// AwayNodes returns the nodes that left the mesh less than
// respown.DefaultGrace ago: any may come back holding responses this node
// never heard of (made while a partition hid it).
func (m *Mesh) AwayNodes() []string {
	r := &m.responses
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.Away(m.now())
}

// isMember reports whether node is this one or a live peer.
func (m *Mesh) isMember(node string) bool {
	return node == m.cfg.NodeName || m.members.get(node) != nil
}

// responsesJoined is NotifyJoin's part: a peer back in the mesh owns its
// entries again, and gets our latest announcements replayed.
func (m *Mesh) responsesJoined(node string) {
	r := &m.responses
	r.mu.Lock()
	r.table.Back(node)
	if len(r.recent) > 0 && len(r.newcomers) < respNewcomers {
		r.newcomers = append(r.newcomers, node)
	}
	r.mu.Unlock()
	r.wake()
}

// responsesLeft is NotifyLeave's part: the node's entries are kept, gone,
// and Gone at once (no grace) when it left with its store lost.
func (m *Mesh) responsesLeft(node string, lost bool) {
	r := &m.responses
	r.mu.Lock()
	if lost {
		r.table.Lost(node, m.now())
	} else {
		r.table.Gone(node, m.now())
	}
	r.mu.Unlock()
}

// responseState is the push/pull state (LocalState): the table's newest
// entries of live owners. It is built here, not in advance: memberlist
// holds none of its locks while it asks (net.go sendLocalState), it asks on
// the push/pull's own goroutine, and building ~8k entries takes under a
// millisecond, where keeping it built would cost a rebuild per change.
func (m *Mesh) responseState(join bool) []byte {
	n := respSyncEntries
	if join {
		n = maxRespEntries
	}
	r := &m.responses
	r.mu.Lock()
	es := r.table.Recent(n)
	r.mu.Unlock()
	if len(es) == 0 {
		return nil
	}
	b, err := encodeResponses(responsesMsg{State: true, Entries: es})
	if err != nil { // the table holds only entries that encode
		m.log.Error().Err(err).Msg("encode response owners")
		return nil
	}
	m.stats.sent.count(b)
	return b
}

// responsesLoop sends announcements: LoadPushDelay after the first of a
// burst, at most once per LoadPushInterval, and replays to joined peers;
// it also expires gone nodes' entries in a quiet table. It returns when
// Shutdown closes done.
func (m *Mesh) responsesLoop() {
	defer m.wg.Done()
	r := &m.responses
	sweep := time.NewTicker(respSweep)
	defer sweep.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-sweep.C:
			r.mu.Lock()
			r.table.Expire(m.now())
			r.mu.Unlock()
			continue
		case <-r.kick:
		}
		// Let the response being announced get on its way first
		// (Config.LoadPushDelay).
		if d := m.cfg.LoadPushDelay; d > 0 {
			select {
			case <-m.done:
				return
			case <-time.After(d):
			}
		}
		m.flushResponses()
		select {
		case <-m.done:
			return
		case <-time.After(m.cfg.LoadPushInterval):
		}
	}
}

// flushResponses queues the pending announcements for every member and the
// replays for joined peers.
func (m *Mesh) flushResponses() {
	r := &m.responses
	r.mu.Lock()
	pending, newcomers := r.pending, r.newcomers
	r.pending, r.newcomers = nil, nil
	var replay []respown.Entry
	if len(newcomers) > 0 {
		replay = slices.Concat(r.recent[r.recentNext:], r.recent[:r.recentNext]) // oldest first
	}
	r.mu.Unlock()
	for _, b := range m.announcements(pending, false) {
		m.members.each(func(s *sender) { s.enqueue(out{b: b, reliable: true}) })
	}
	if len(replay) == 0 {
		return
	}
	bs := m.announcements(replay, true)
	for _, id := range newcomers {
		if s := m.members.get(id); s != nil {
			for _, b := range bs {
				s.enqueue(out{b: b, reliable: true})
			}
		}
	}
}

// announcements encodes es in messages of respBatch, each owner's entries
// together (responsesMsg.apply takes a run of one owner's at a time).
func (m *Mesh) announcements(es []respown.Entry, state bool) [][]byte {
	es = slices.Clone(es)
	slices.SortStableFunc(es, func(a, b respown.Entry) int { return strings.Compare(a.Node, b.Node) })
	var bs [][]byte
	for len(es) > 0 {
		n := min(len(es), respBatch)
		b, err := encodeResponses(responsesMsg{State: state, Entries: es[:n]})
		es = es[n:]
		if err != nil { // ids were checked by announce, the names by validate and AnnounceResponsesOf
			m.log.Error().Err(err).Msg("encode response announcement")
			continue
		}
		bs = append(bs, b)
	}
	return bs
}
