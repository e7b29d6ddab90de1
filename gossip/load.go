package gossip

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/route"
)

// pusher is what this node pushes to every member in its load reports: its
// load, its engine state and digest epoch, and the claims it just made. It
// also keeps the claims on this node, which are void while the engine does
// not serve.
type pusher struct {
	mu        sync.Mutex
	load      route.Load
	at        time.Time     // when load was last set
	seq       uint64        // Seq of the last report; starts at the join time
	engine    route.Engine  // also in the advertised meta (advert)
	epoch     uint64        // of the advertised digest; 0 for none
	version   uint64        // of the advertised digest, in every report
	stateSent bool          // the last report carried engine and epoch as they are
	claims    []peerClaim   // to go out with the next report
	self      []route.Claim // claims on this node, by us or peers
	since     time.Time     // when this node's cache began: engine or epoch last changed (route.PeerView.Since)
	kick      chan struct{} // wakes loadLoop: the load changed
	claimed   chan struct{} // ends loadLoop's wait after a push early: a claim (Config.ClaimPushInterval)
	now       chan struct{} // wakes loadLoop: the engine's state or digest epoch, to go at once
}

// setEpoch records a new digest epoch for the next report, which goes by
// TCP and soon. A new epoch is a new cache, as peers take it.
func (p *pusher) setEpoch(e uint64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch, p.since = e, now
	p.stateChangedLocked()
}

// withdraw records that no digest is advertised: the next report says
// epoch 0, and the claims on this node are void with the cache.
func (p *pusher) withdraw(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch, p.version, p.self, p.since = 0, 0, nil, now
	p.stateChangedLocked()
}

// setVersion records the local digest's version for the next report, by
// which peers notice a lost last delta (table: lagging). It goes with the
// next push, within LoadRefresh: no push of its own.
func (p *pusher) setVersion(v uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.version = v
}

// stateChangedLocked makes the next report carry a changed engine or
// epoch, reliably, and soon.
func (p *pusher) stateChangedLocked() {
	p.stateSent = false
	p.pushNow()
}

// pushSoon wakes loadLoop, which pushes after LoadPushDelay, and within
// LoadPushInterval of its last push.
func (p *pusher) pushSoon() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// pushNow is pushSoon without the delay.
func (p *pusher) pushNow() {
	select {
	case p.now <- struct{}{}:
	default:
	}
}

// SetLoad records the local vLLM's scraped load (Running, Waiting,
// KVUsage; Serving, Prefilling, QueuedPrefillTokens and PrefillShare are
// the front's, from SetServing, and the in-flight fields are a sender's,
// so those are ignored). Peers get it pushed within LoadPushInterval, and
// in the next meta update.
func (m *Mesh) SetLoad(l route.Load) {
	m.load.mu.Lock()
	cur := m.load.load
	l.Serving, l.Prefilling, l.QueuedPrefillTokens, l.PrefillShare = cur.Serving, cur.Prefilling, cur.QueuedPrefillTokens, cur.PrefillShare
	l.InFlight, l.InFlightPrefilling, l.InFlightPrefillTokens = 0, 0, 0
	m.setLoadLocked(l)
	m.load.mu.Unlock()
}

// SetServing records how many requests the local front has at its vLLM
// right now, how many of them wait for their first token and their prompt
// tokens still to prefill, and its engine's prefill share
// (route.Load.PrefillShare). It is cheap: call it on every change.
func (m *Mesh) SetServing(n, prefilling, prefillTokens int, share float64) {
	m.load.mu.Lock()
	l := m.load.load
	l.Serving, l.Prefilling, l.QueuedPrefillTokens, l.PrefillShare = n, prefilling, prefillTokens, share
	m.setLoadLocked(l)
	m.load.mu.Unlock()
}

func (m *Mesh) setLoadLocked(l route.Load) {
	p := &m.load
	changed := l != p.load
	p.load, p.at = l, m.now()
	if changed {
		m.advert.note(func(mt *Meta) { metaLoad(mt, l) })
		p.pushSoon()
	}
}

// SetEngine records the local vLLM's state and advertises it at once: in
// a push to every member (by TCP) and in the node meta. Peers choose a
// node only while its engine is serving; a node whose engine is not also
// withdraws its digest (WithdrawDigest).
func (m *Mesh) SetEngine(e route.Engine) {
	p := &m.load
	p.mu.Lock()
	if p.engine != e {
		p.engine = e
		p.self, p.since = nil, m.now() // about the cache before the change
		p.stateChangedLocked()
		m.advert.edit(func(mt *Meta) bool { mt.Engine = e; return true })
	}
	p.mu.Unlock()
	m.advert.kickNow()
}

// Claim records that this node just sent a request to peer (this node's
// own name included) whose prefix cs claim, and shares the claims with
// every member in the next load push.
func (m *Mesh) Claim(peer string, cs []route.Claim) {
	if len(cs) == 0 || peer == "" {
		return
	}
	now := m.now()
	p := &m.load
	p.mu.Lock()
	m.claimLocked(peer, now, cs...)
	for _, c := range cs {
		if len(p.claims) >= maxClaims {
			p.claims = slices.Delete(p.claims, 0, 1)
		}
		p.claims = append(p.claims, peerClaim{Peer: peer, Key: c.Key, Keys: c.Keys})
	}
	p.mu.Unlock()
	p.pushSoon()
	select {
	case p.claimed <- struct{}{}:
	default:
	}
}

// claimLocked records claims made at at on peer: on this node unless its
// engine does not serve (a claim on no cache is void), else in the table.
// The caller holds load.mu.
func (m *Mesh) claimLocked(peer string, at time.Time, cs ...route.Claim) {
	if peer == m.cfg.NodeName {
		if m.load.engine == route.EngineServing {
			m.load.self = addClaims(m.load.self, at, cs...)
		}
		return
	}
	m.tableMu.Lock()
	m.table.claim(peer, at, cs...)
	m.tableMu.Unlock()
}

// loadLoop pushes the local load to every member LoadPushDelay after it
// changed, at most once per LoadPushInterval, and every LoadRefresh
// regardless. It returns
// when Shutdown closes done.
func (m *Mesh) loadLoop() {
	defer m.wg.Done()
	refresh := time.NewTimer(m.cfg.LoadRefresh)
	defer refresh.Stop()
	p := &m.load
	for {
		select {
		case <-m.done:
			return
		case <-p.now:
		case <-p.kick:
			// Let the request that made the change get on its way first
			// (Config.LoadPushDelay).
			if m.cfg.LoadPushDelay > 0 {
				select {
				case <-m.done:
					return
				case <-p.now:
				case <-time.After(m.cfg.LoadPushDelay):
				}
			}
		case <-refresh.C:
		}
		refresh.Reset(m.cfg.LoadRefresh)
		select {
		case <-p.claimed: // the report takes every claim made until now
		default:
		}
		pushed := time.Now()
		if r, b, reliable, ok := m.nextReport(); ok {
			// Each peer's own lane: never behind its queue, never
			// dropped (sender.pushLoad).
			m.members.each(func(s *sender) { s.pushLoad(r, b, reliable) })
		}
		if !m.pushWait(pushed) {
			return
		}
	}
}

// pushWait waits after a push at pushed until the next may go:
// LoadPushInterval, or ClaimPushInterval once a claim is made. It returns
// false when Shutdown closes done.
func (m *Mesh) pushWait(pushed time.Time) bool {
	t := time.NewTimer(m.cfg.LoadPushInterval - time.Since(pushed))
	defer t.Stop()
	select {
	case <-m.done:
		return false
	case <-t.C:
		return true
	case <-m.load.claimed:
	}
	if d := m.cfg.ClaimPushInterval - time.Since(pushed); d > 0 {
		t.Reset(d)
		select {
		case <-m.done:
			return false
		case <-t.C:
		}
	}
	return true
}

// nextReport builds the next load report, taking the claims it carries:
// the report, its bytes, and whether it must go reliably.
func (m *Mesh) nextReport() (loadReport, []byte, bool, bool) {
	grouped := m.OldestWire() >= 2 // before load.mu: OldestWire takes the table's lock
	p := &m.load
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	r := loadReport{Node: m.cfg.NodeName, Seq: p.seq, Load: p.load, Claims: p.claims,
		Engine: p.engine, Epoch: p.epoch, Version: p.version, HasVersion: true, HasState: true, GroupClaims: grouped}
	p.claims = nil
	b, err := encodeLoad(r)
	if err != nil {
		m.log.Error().Err(err).Msg("encode load report")
		return loadReport{}, nil, false, false
	}
	// A change of engine or epoch goes by TCP: a lost one would leave peers
	// routing to a dead engine until the next refresh.
	reliable := !p.stateSent
	p.stateSent = true
	return r, b, reliable, true
}

// metaLoad is loadOf's inverse, up to the meta's 1/1000 KV-usage precision.
func metaLoad(m *Meta, l route.Load) {
	m.Running, m.Waiting, m.Serving, m.QueuedPrefill = l.Running, l.Waiting, l.Serving, l.QueuedPrefillTokens
	m.KVUsageMilli = kvMilli(l.KVUsage)
}
