package gossip

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// ErrNoDigest is returned by PublishDelta before any PublishDigest: a delta
// needs a digest to follow.
var ErrNoDigest = errors.New("no local digest to apply the delta to")

// Mesh is this node's membership in the cluster and its view of every peer.
// It is safe for concurrent use.
type Mesh struct {
	cfg     Config
	log     zerolog.Logger
	ml      atomic.Pointer[memberlist.Memberlist]
	inbox   chan []byte   // NotifyMsg → run
	done    chan struct{} // closed by Shutdown
	kick    chan struct{} // wakes the meta loop for an urgent update
	wg      sync.WaitGroup
	stats   counters
	now     func() time.Time
	dropOut func(peer string, b []byte) bool // tests: lose chosen messages
	// textPrefix receives shared text prefixes (OnTextPrefix).
	textPrefix atomic.Pointer[func(TextPrefix)]

	mu        sync.Mutex
	closed    bool
	table     *table
	senders   map[string]*sender
	local     *bloom.Digest // our own digest, replaced wholesale
	full      fullCache
	meta      Meta   // what we advertise
	metaBytes []byte // meta encoded, what NodeMeta returns
	metaDirty bool
	load      route.Load
	loadAt    time.Time
	loadSeq   uint64        // Seq of the last pushed report; starts at the join time
	loadKick  chan struct{} // wakes loadLoop: the load changed
	stateSent bool          // the last push carried the current engine and epoch
	claims    []peerClaim   // to go out with the next load report
	selfClaim []route.Claim // claims on this node, by us or peers
}

// fullCache keeps the encoded full message of one local digest, so a digest
// sent to fifty peers is marshalled once.
type fullCache struct {
	d *bloom.Digest
	b []byte
}

// Join starts memberlist, joins the seeds in cfg.Join and returns the running
// mesh. Being alone is not an error: when no seed answers (the first pod, or
// DNS not ready yet) the mesh runs alone and keeps trying in the background,
// with backoff, then every RejoinInterval. Join waits for the first attempt
// (memberlist bounds each contact by its TCPTimeout) or for ctx, whichever
// ends first. Join fails only on a bad configuration or when memberlist
// cannot bind.
func Join(ctx context.Context, cfg Config) (*Mesh, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Mesh{
		cfg:      cfg,
		log:      cfg.Log.With().Str("component", "gossip").Logger(),
		inbox:    make(chan []byte, cfg.InboxDepth),
		done:     make(chan struct{}),
		kick:     make(chan struct{}, 1),
		loadKick: make(chan struct{}, 1),
		now:      time.Now,
		dropOut:  cfg.dropOut,
		table:    newTable(),
		senders:  map[string]*sender{},
		meta: Meta{
			APIAddr:   cfg.APIAddr,
			Models:    slices.Clone(cfg.Models),
			KeyScheme: uint8(cfg.KeyScheme),
			Engine:    cfg.Engine,
		},
	}
	// A restarted node's reports must outrank its old ones, which peers
	// may still hold if they never saw it leave.
	m.loadSeq = uint64(m.now().UnixNano())
	if err := m.encodeMetaLocked(); err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(cfg.memberlistConfig(delegate{m}))
	if err != nil {
		return nil, fmt.Errorf("start memberlist: %w", err)
	}
	m.ml.Store(ml)

	rng := cfg.Rand
	if rng == nil {
		h := fnv.New64a()
		h.Write([]byte(cfg.NodeName))
		rng = rand.New(rand.NewPCG(h.Sum64(), 0))
	}
	j := &joiner{m: m, seeds: cfg.Join, resolver: cfg.Resolver, rng: rng, last: map[string][]string{}}
	if j.resolver == nil {
		j.resolver = net.DefaultResolver
	}
	first := make(chan bool, 1)
	m.wg.Add(4)
	go m.run()
	go m.metaLoop()
	go m.loadLoop()
	go j.loop(first)
	select {
	case <-first:
	case <-ctx.Done(): // still alone, and still trying in the background
	}
	return m, nil
}

// run applies received messages to the table and drives the periodic full
// digest and the repair of lagging copies. It is the only goroutine that
// decodes digests. It returns when Shutdown closes done.
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
			m.mu.Lock()
			if m.local != nil {
				for _, s := range m.senders {
					s.requestFull()
				}
			}
			m.mu.Unlock()
		case <-repair.C:
			now := m.now()
			m.mu.Lock()
			for _, id := range m.table.repairs(now, m.cfg.ReorderWait, m.cfg.RepairAfter, m.cfg.NeedFullInterval) {
				m.sendNeedFullLocked(id)
			}
			m.mu.Unlock()
		}
	}
}

// handle applies one received message. Bad input is counted and dropped.
func (m *Mesh) handle(b []byte) {
	if len(b) > 0 {
		m.stats.recv.count(b)
	}
	if len(b) > 0 && b[0] == kindTextPrefix {
		m.handleTextPrefix(b)
		return
	}
	msg, err := decodeMsg(b)
	if err != nil {
		m.stats.decodeErrors.Add(1)
		m.log.Debug().Err(err).Int("bytes", len(b)).Msg("dropped gossip message")
		return
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch msg.kind {
	case kindDigest:
		o := m.table.applyDigest(msg.digest, now)
		m.count(o)
		m.reportApplied(o, msg.digest.Header().Node)
	case kindDelta:
		o, dropped := m.table.applyDelta(msg.delta, now)
		m.count(o)
		m.reportApplied(o, msg.delta.Node)
		if dropped {
			m.stats.epochDrops.Add(1)
		}
		if o == gap {
			m.askLocked(msg.delta.Node, now)
		}
	case kindLoad:
		if m.table.applyLoad(msg.load, now) == unknown {
			m.stats.unknownOrigin.Add(1)
		}
		// Claims hold whatever the report's order: each is a fact of its own.
		for _, c := range msg.load.Claims {
			m.claimLocked(c.Peer, route.Claim{Key: c.Key, Keys: c.Keys, At: now})
		}
	case kindNeedFull:
		s := m.senders[msg.needFull.Requester]
		if msg.needFull.Origin != m.cfg.NodeName || s == nil || m.local == nil {
			m.stats.unknownOrigin.Add(1)
			return
		}
		m.stats.fullServed.Add(1)
		s.requestFull()
	}
}

// reportApplied tells a test hook the origin's copy version after a change.
func (m *Mesh) reportApplied(o outcome, origin string) {
	if o != applied || m.cfg.applied == nil {
		return
	}
	if p := m.table.peers[origin]; p != nil && p.digest != nil {
		m.cfg.applied(origin, p.digest.Header().Version)
	}
}

func (m *Mesh) count(o outcome) {
	switch o {
	case held:
		m.stats.held.Add(1)
	case stale:
		m.stats.stale.Add(1)
	case gap:
		m.stats.gaps.Add(1)
	case unknown:
		m.stats.unknownOrigin.Add(1)
	}
}

// askLocked sends a need-full request to id unless one went recently.
func (m *Mesh) askLocked(id string, now time.Time) {
	if m.table.ask(id, now, m.cfg.NeedFullInterval) {
		m.sendNeedFullLocked(id)
	}
}

func (m *Mesh) sendNeedFullLocked(id string) {
	s := m.senders[id]
	if s == nil {
		return
	}
	b, err := encodeNeedFull(needFull{Requester: m.cfg.NodeName, Origin: id})
	if err != nil {
		return // names are bounded by validate and memberlist
	}
	m.stats.fullRequests.Add(1)
	s.enqueue(out{b: b})
}

// fullBytes returns the encoded full local digest, nil if there is none.
func (m *Mesh) fullBytes() []byte {
	m.mu.Lock()
	d, c := m.local, m.full
	m.mu.Unlock()
	if d == nil {
		return nil
	}
	if c.d == d {
		return c.b
	}
	b, err := encodeDigest(d)
	if err != nil {
		return nil // PublishDigest checked that d encodes
	}
	m.mu.Lock()
	if m.local == d {
		m.full = fullCache{d: d, b: b}
	}
	m.mu.Unlock()
	return b
}

// metaLoop re-advertises the node meta when it changed, at most once per
// MetaInterval, or at once when kicked (draining). It returns when Shutdown
// closes done.
func (m *Mesh) metaLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.MetaInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		case <-m.kick:
		}
		m.mu.Lock()
		dirty := m.metaDirty
		if dirty {
			if err := m.encodeMetaLocked(); err != nil {
				m.log.Error().Err(err).Msg("encode node meta")
				dirty = false
			}
		}
		m.mu.Unlock()
		if !dirty {
			continue
		}
		// UpdateNode waits for the broadcast to leave; bound it so Shutdown
		// is not held up.
		if err := m.ml.Load().UpdateNode(m.cfg.MetaInterval); err != nil {
			m.log.Debug().Err(err).Msg("update node meta")
		}
	}
}

func (m *Mesh) encodeMetaLocked() error {
	b, err := EncodeMeta(m.meta, maxMetaBytes)
	if err != nil {
		return err
	}
	m.metaBytes, m.metaDirty = b, false
	return nil
}

// PublishDigest makes d the local digest and sends it in full to every
// member by TCP. Call it on start, on an epoch change and whenever the
// digest is rebuilt; the mesh itself resends it every FullDigestInterval.
// d must be this node's (Header().Node == NodeName).
func (m *Mesh) PublishDigest(d *bloom.Digest) error {
	if d == nil {
		return fmt.Errorf("publish digest: nil digest")
	}
	h := d.Header()
	if h.Node != m.cfg.NodeName {
		return fmt.Errorf("publish digest: digest of node %q, we are %q", h.Node, m.cfg.NodeName)
	}
	b, err := encodeDigest(d)
	if err != nil {
		return fmt.Errorf("publish digest: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.local == nil || m.local.Header().Epoch != h.Epoch {
		m.stateChangedLocked() // peers match a digest only of the epoch pushes name
	}
	m.local, m.full = d, fullCache{d: d, b: b}
	m.meta.HasDigest, m.meta.DigestEpoch, m.meta.DigestVersion = true, h.Epoch, h.Version
	m.metaDirty = true
	for _, s := range m.senders {
		s.requestFull()
	}
	return nil
}

// PublishDelta applies x to the local digest and sends it to every member:
// by UDP when it fits PacketBytes, else by TCP. It fails, changing nothing,
// with ErrNoDigest before the first PublishDigest and with an error wrapping
// bloom.ErrGap or bloom.ErrStale when x does not follow the local digest;
// publish a full digest then.
func (m *Mesh) PublishDelta(x bloom.Delta) error {
	if x.Node != m.cfg.NodeName {
		return fmt.Errorf("publish delta: delta of node %q, we are %q", x.Node, m.cfg.NodeName)
	}
	b, err := encodeDelta(x)
	if err != nil {
		return fmt.Errorf("publish delta: %w", err)
	}
	o := out{b: b, reliable: len(b) > m.cfg.PacketBytes}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.local == nil {
		return ErrNoDigest
	}
	next, err := m.local.Apply(x)
	if err != nil {
		return fmt.Errorf("publish delta: %w", err)
	}
	m.local = next
	m.meta.DigestVersion = x.To
	m.metaDirty = true
	for _, s := range m.senders {
		s.enqueue(o)
	}
	return nil
}

// SetLoad records the local vLLM's scraped load (Running, Waiting,
// KVUsage, QueuedPrefillTokens; Serving and InFlight are ignored). Peers
// get it pushed within LoadPushInterval, and in the next meta update.
func (m *Mesh) SetLoad(l route.Load) {
	m.mu.Lock()
	l.Serving, l.InFlight = m.load.Serving, 0
	m.setLoadLocked(l)
	m.mu.Unlock()
}

// SetServing records how many requests the local front has at its vLLM
// right now. It is cheap: call it on every change.
func (m *Mesh) SetServing(n int) {
	m.mu.Lock()
	l := m.load
	l.Serving = n
	m.setLoadLocked(l)
	m.mu.Unlock()
}

func (m *Mesh) setLoadLocked(l route.Load) {
	changed := l != m.load
	m.load, m.loadAt = l, m.now()
	metaLoad(&m.meta, l)
	m.metaDirty = m.metaDirty || changed
	if changed {
		m.pushSoon()
	}
}

// pushSoon wakes loadLoop, which pushes within LoadPushInterval.
func (m *Mesh) pushSoon() {
	select {
	case m.loadKick <- struct{}{}:
	default:
	}
}

// Claim records that this node just sent a request to peer (this node's
// own name included) whose prefix cs claim, and shares the claims with
// every member in the next load push.
func (m *Mesh) Claim(peer string, cs []route.Claim) {
	if len(cs) == 0 || peer == "" {
		return
	}
	now := m.now()
	m.mu.Lock()
	for _, c := range cs {
		c.At = now
		m.claimLocked(peer, c)
		if len(m.claims) >= maxClaims {
			m.claims = slices.Delete(m.claims, 0, 1)
		}
		m.claims = append(m.claims, peerClaim{Peer: peer, Key: c.Key, Keys: c.Keys})
	}
	m.mu.Unlock()
	m.pushSoon()
}

func (m *Mesh) claimLocked(peer string, c route.Claim) {
	if peer == m.cfg.NodeName {
		if m.meta.Engine == route.EngineServing { // a claim on no cache is void
			m.selfClaim = addClaim(m.selfClaim, c)
		}
		return
	}
	m.table.claim(peer, c)
}

// loadRefresh re-pushes an unchanged load, so peers can tell a steady load
// from a silent node (route.Config.LoadTTL, 5 s by default).
const loadRefresh = time.Second

// loadLoop pushes the local load to every member when it changed, at most
// once per LoadPushInterval, and every loadRefresh regardless. It returns
// when Shutdown closes done.
func (m *Mesh) loadLoop() {
	defer m.wg.Done()
	refresh := time.NewTimer(loadRefresh)
	defer refresh.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-m.loadKick:
		case <-refresh.C:
		}
		refresh.Reset(loadRefresh)
		m.mu.Lock()
		m.loadSeq++
		r := loadReport{Node: m.cfg.NodeName, Seq: m.loadSeq, Load: m.load, Claims: m.claims,
			Engine: m.meta.Engine, HasState: true}
		if m.local != nil {
			r.Epoch = m.local.Header().Epoch
		}
		b, err := encodeLoad(r)
		m.claims = nil
		if err == nil {
			// A change of engine or epoch goes by TCP: a lost one would leave
			// peers routing to a dead engine until the next refresh.
			o := out{b: b, reliable: !m.stateSent}
			for _, s := range m.senders {
				s.enqueue(o)
			}
			m.stateSent = true
		}
		m.mu.Unlock()
		if err != nil {
			m.log.Error().Err(err).Msg("encode load report")
		}
		select {
		case <-m.done:
			return
		case <-time.After(m.cfg.LoadPushInterval):
		}
	}
}

// SetModels replaces the models this node advertises (base model first,
// then adapters, as Config.Models) and, when they changed, re-advertises
// the meta at once: a pod that loads an adapter becomes a candidate for it
// as soon as the update reaches its peers, and one that unloads it stops
// being one. Names that do not fit the meta are left out and the meta says
// so (Meta.ModelsTruncated); route decides what peers make of that.
func (m *Mesh) SetModels(models []string) {
	m.mu.Lock()
	if slices.Equal(models, m.meta.Models) {
		m.mu.Unlock()
		return
	}
	m.meta.Models = slices.Clone(models)
	m.metaDirty = true
	m.mu.Unlock()
	m.kickMeta()
}

// SetEngine records the local vLLM's state and advertises it at once: in
// a push to every member (by TCP) and in the node meta. Peers choose a
// node only while its engine is serving; a node whose engine is not also
// withdraws its digest (WithdrawDigest).
func (m *Mesh) SetEngine(e route.Engine) {
	m.mu.Lock()
	if m.meta.Engine != e {
		m.meta.Engine = e
		m.metaDirty = true
		m.selfClaim = nil // about the cache before the change
		m.stateChangedLocked()
	}
	m.mu.Unlock()
	m.kickMeta()
}

// WithdrawDigest stops advertising the local digest: peers drop their copy
// and the claims on this node at the next push, which goes at once. The
// next PublishDigest advertises again.
func (m *Mesh) WithdrawDigest() {
	m.mu.Lock()
	if m.local != nil {
		m.local, m.full = nil, fullCache{}
		m.meta.HasDigest, m.meta.DigestEpoch, m.meta.DigestVersion = false, 0, 0
		m.metaDirty = true
		m.selfClaim = nil
		m.stateChangedLocked()
	}
	m.mu.Unlock()
	m.kickMeta()
}

// stateChangedLocked makes the next push carry a changed engine or epoch,
// reliably, and soon.
func (m *Mesh) stateChangedLocked() {
	m.stateSent = false
	m.pushSoon()
}

func (m *Mesh) kickMeta() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// SetDraining sets the draining flag and advertises it at once.
func (m *Mesh) SetDraining(draining bool) {
	m.mu.Lock()
	m.meta.Draining = draining
	m.metaDirty = true
	m.mu.Unlock()
	m.kickMeta()
}

// MarkFailed records that a forward to peerID failed at at; route treats
// the peer as down for a while. Unknown peers are ignored.
func (m *Mesh) MarkFailed(peerID string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.table.markFailed(peerID, at)
}

// Snapshot returns every live peer with a readable meta, and this node
// (Local true, with its own digest), sorted by ID. The local node's DigestAt
// is now: its digest is current by definition. The views share immutable
// digests with the mesh and nothing else.
func (m *Mesh) Snapshot(now time.Time) []route.PeerView {
	m.mu.Lock()
	defer m.mu.Unlock()
	self := route.PeerView{
		ID:        m.cfg.NodeName,
		Addr:      m.cfg.APIAddr,
		Local:     true,
		Models:    slices.Clone(m.meta.Models),
		KeyScheme: m.cfg.KeyScheme,
		Load:      m.load,
		LoadAt:    m.loadAt,
		Draining:  m.meta.Draining,
		Engine:    m.meta.Engine,
		Claims:    m.selfClaim, // copy-on-write (addClaim)
	}
	if m.local != nil {
		self.Digest, self.DigestAt = m.local, now
	}
	vs := m.table.views()
	i, _ := slices.BinarySearchFunc(vs, self.ID, func(v route.PeerView, id string) int {
		switch {
		case v.ID < id:
			return -1
		case v.ID > id:
			return 1
		}
		return 0
	})
	return slices.Insert(vs, i, self)
}

// Members returns the number of live members, this node included.
func (m *Mesh) Members() int { return m.ml.Load().NumMembers() }

// Stats returns the counters since Join.
func (m *Mesh) Stats() Stats { return m.stats.snapshot() }

// Leave tells the cluster this node is going, waiting up to timeout for the
// message to leave; peers drop it at once instead of after failure
// detection. Call Shutdown afterwards.
func (m *Mesh) Leave(timeout time.Duration) error {
	return m.ml.Load().Leave(timeout)
}

// Shutdown stops memberlist and every goroutine of the mesh, waiting for
// sends in progress. Without Leave first, peers notice only by failure
// detection (seconds). It is safe to call more than once.
func (m *Mesh) Shutdown() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.done)
	m.mu.Unlock()
	err := m.ml.Load().Shutdown()
	m.wg.Wait()
	return err
}
