package gossip

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/membership"
	"github.com/kvroute/kvroute/route"
)

// Mesh is this node's membership in the cluster and its view of every peer.
// It is safe for concurrent use.
//
// Each job keeps its state in its own part, under its own lock: the local
// digest (digests, digest.go), what the load reports carry (load, load.go),
// the advertised meta (advert, advert.go), the peer table (tableMu), the
// response owners (responses, responses.go) and the peer senders (members,
// members.go). A method that needs several takes them in that order, never
// the other way round.
type Mesh struct {
	cfg   Config
	log   zerolog.Logger
	now   func() time.Time
	hooks hooks
	ms    atomic.Pointer[membership.Members] // set once membership.New returns
	stats counters
	inbox chan []byte   // NotifyMsg → run
	done  chan struct{} // closed by Shutdown
	// streams holds a token per TCP send in progress (Config.MaxStreams).
	streams chan struct{}
	wg      sync.WaitGroup // every goroutine the mesh starts, the membership's aside
	// textPrefix receives the text prefixes peers share (OnTextPrefix).
	textPrefix atomic.Pointer[func(TextPrefix)]

	digests   exchange
	load      pusher
	advert    advert
	responses responses
	members   members
	tableMu   sync.Mutex
	table     *table
}

// hooks let in-package tests watch and break the exchange. Join leaves
// them nil; only joinWith, which tests call, sets them.
type hooks struct {
	dropOut   func(peer string, b []byte) bool    // lose chosen outgoing messages
	streaming func(peer string)                   // a TCP send holds its slot (MaxStreams); may block
	applied   func(origin string, version uint64) // origin's copy is now at version; runs under tableMu
}

// Join starts memberlist, joins the seeds in cfg.Join and returns the running
// mesh. Being alone is not an error: when no seed answers (the first pod, or
// DNS not ready yet) the mesh runs alone and keeps trying in the background,
// with backoff, then every RejoinInterval. Join waits for the first attempt
// (memberlist bounds each contact by its TCPTimeout) or for ctx, whichever
// ends first. Join fails only on a bad configuration or when memberlist
// cannot bind.
func Join(ctx context.Context, cfg Config) (*Mesh, error) { return joinWith(ctx, cfg, hooks{}) }

func joinWith(ctx context.Context, cfg Config, h hooks) (*Mesh, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Mesh{
		cfg:     cfg,
		log:     cfg.Log.With().Str("component", "gossip").Logger(),
		now:     time.Now,
		hooks:   h,
		inbox:   make(chan []byte, cfg.InboxDepth),
		done:    make(chan struct{}),
		streams: make(chan struct{}, cfg.MaxStreams),
		table:   newTable(cfg.RoutingStride),
		members: members{senders: map[string]*sender{}},
	}
	m.advert.kick = make(chan struct{}, 1)
	m.advert.meta = Meta{
		APIAddr:    cfg.APIAddr,
		EngineAddr: cfg.EngineAddr,
		Models:     slices.Clone(cfg.Models),
		KeyScheme:  uint8(cfg.KeyScheme),
		Stride:     cfg.RoutingStride,
		Engine:     cfg.Engine,
	}
	if err := m.advert.encodeLocked(); err != nil { // no one else holds m yet
		return nil, err
	}
	m.load.kick = make(chan struct{}, 1)
	m.load.now = make(chan struct{}, 1)
	m.load.claimed = make(chan struct{}, 1)
	m.load.engine = cfg.Engine
	// A restarted node's reports must outrank its old ones, which peers
	// may still hold if they never saw it leave.
	m.load.seq = uint64(m.now().UnixNano())
	m.responses.init()

	ms, err := membership.New(cfg.Config, delegate{m}, delegate{m})
	if err != nil {
		return nil, err
	}
	m.ms.Store(ms)
	m.wg.Add(4)
	go m.run()
	go m.metaLoop()
	go m.loadLoop()
	go m.responsesLoop()
	ms.Join(ctx)
	return m, nil
}

// run applies received messages and drives the periodic full digest and
// the repair of lagging copies. It is the only goroutine that decodes
// messages. It returns when Shutdown closes done.
func (m *Mesh) run() {
	defer m.wg.Done()
	full := time.NewTicker(m.cfg.FullDigestInterval)
	defer full.Stop()
	repair := time.NewTicker(max(m.cfg.ReorderWait/2, 5*time.Millisecond))
	defer repair.Stop()
	for {
		select {
		case <-m.done:
			return
		case b := <-m.inbox:
			m.handle(b)
		case <-full.C:
			m.sendFulls()
		case <-repair.C:
			m.repair(m.now())
		}
	}
}

// handle applies one received message. Bad input is counted and dropped.
func (m *Mesh) handle(b []byte) {
	if len(b) > 0 {
		m.stats.recv.count(b)
	}
	msg, err := decodeMsg(b)
	if errors.Is(err, ErrNewer) {
		m.stats.newerDropped.Add(1)
		m.log.Debug().Err(err).Int("bytes", len(b)).Msg("dropped gossip message of a newer version")
		return
	}
	if err != nil {
		m.stats.decodeErrors.Add(1)
		m.log.Debug().Err(err).Int("bytes", len(b)).Msg("dropped gossip message")
		return
	}
	msg.body.apply(m, m.now())
}

// MarkFailed records that a forward to peerID failed at at; route treats
// the peer as down for a while. Unknown peers are ignored.
func (m *Mesh) MarkFailed(peerID string, at time.Time) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	m.table.markFailed(peerID, at)
}

// Snapshot returns every live peer with a readable meta, and this node
// (Local true, with its own digest), sorted by ID. The local node's DigestAt
// is now: its digest is current by definition. The views share immutable
// digests with the mesh and nothing else.
func (m *Mesh) Snapshot(now time.Time) []route.PeerView { return m.AppendSnapshot(nil, now) }

// AppendSnapshot is Snapshot written over buf (its length ignored), in
// its array when that is large enough: a front that keeps its buffers
// builds a thousand views without a 320 KB allocation per request.
func (m *Mesh) AppendSnapshot(buf []route.PeerView, now time.Time) []route.PeerView {
	self := m.self(now)
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	return m.table.viewsWith(buf, &self)
}

// EachPeer calls f with the view of every live peer, this node's own
// first, then the others in Snapshot's order, until f returns false. It
// builds the views a few at a time as it goes, so a caller that stops
// early (admission at the first pod with room) pays for the peers it
// read, not for a thousand; the table may change between them. f may
// keep nothing it is passed.
func (m *Mesh) EachPeer(now time.Time, f func(*route.PeerView) bool) {
	self := m.self(now)
	if !f(&self) {
		return
	}
	var buf [8]route.PeerView // on the heap (f may be anything): 2.5 KB a walk
	for after, more := "", true; more; {
		var vs []route.PeerView
		m.tableMu.Lock()
		vs, more = m.table.viewsAfter(after, buf[:0])
		m.tableMu.Unlock()
		for i := range vs {
			if !f(&vs[i]) {
				return
			}
		}
		if len(vs) > 0 {
			after = vs[len(vs)-1].ID
		}
	}
}

// self is this node's own view. It holds the locks of the local state
// together, in order, so the view is of one moment: a withdrawn digest is
// never seen with the claims it voided.
func (m *Mesh) self(now time.Time) route.PeerView {
	m.digests.mu.Lock()
	defer m.digests.mu.Unlock()
	m.load.mu.Lock()
	defer m.load.mu.Unlock()
	meta := m.advert.view()
	v := route.PeerView{
		ID:         m.cfg.NodeName,
		Addr:       m.cfg.APIAddr,
		EngineAddr: m.cfg.EngineAddr,
		Local:      true,
		Models:     meta.Models,
		KeyScheme:  m.cfg.KeyScheme,
		Ranks:      meta.Ranks,
		Load:       m.load.load,
		LoadAt:     m.load.at,
		Draining:   meta.Draining,
		Engine:     m.load.engine,
		Claims:     m.load.self, // copy-on-write (addClaim)
		// The front's recent forwards to this node from before its
		// engine restarted are about a cache that is gone, as they are
		// for a peer (table: since).
		Since: m.load.since,
	}
	if d := m.digests.local; d != nil {
		v.Digest, v.DigestAt = d, now
	}
	return v
}

// Grouped returns how many peer digests the table's transposed copy holds
// (route matches them in one pass), and how many plain ones of another
// shape it does not (matched one by one; see regroup).
func (m *Mesh) Grouped() (held, misfits int) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	return m.table.group.Len(), m.table.misfits
}

// Members returns the number of live members, this node included.
func (m *Mesh) Members() int { return m.ms.Load().Len() }

// Stats returns the counters since Join.
func (m *Mesh) Stats() Stats { return m.stats.snapshot(m.ms.Load().Stats()) }

// Leave tells the cluster this node is going, waiting up to timeout for the
// message to leave; peers drop it at once instead of after failure
// detection. Call Shutdown afterwards.
func (m *Mesh) Leave(timeout time.Duration) error {
	return m.ms.Load().Leave(timeout)
}

// Shutdown stops memberlist and every goroutine the mesh started (the
// loops, the joiner, every peer's sender), and returns once they all have:
// a send in progress completes or fails first (memberlist bounds it by
// TCPTimeout), and so does a join attempt; a meta update waits at most
// maxMetaWait, a seed lookup not at all. Without Leave first, peers
// notice only by failure detection (seconds). It is safe to call more than
// once.
func (m *Mesh) Shutdown() error {
	if !m.members.close() {
		return nil
	}
	close(m.done)
	err := m.ms.Load().Shutdown()
	m.wg.Wait()
	return err
}
