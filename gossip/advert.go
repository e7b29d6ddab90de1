package gossip

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bloom"
)

// advert is the node meta this node advertises through memberlist, and
// its encoding, which NodeMeta returns from a memberlist callback and so
// is built in advance by metaLoop.
type advert struct {
	mu    sync.Mutex
	meta  Meta
	bytes []byte // meta encoded at maxMetaBytes
	dirty bool   // meta changed since bytes were built
	// pushed is a change since bytes were built of fields the load reports
	// also carry (load, digest version), which only a v0.1.0 member reads
	// from the meta alone.
	pushed bool
	kick   chan struct{}
	// updating serialises the meta's broadcasts (updateMeta). memberlist
	// drops a queued alive message about this node when another is
	// queued (broadcast.go, Invalidates) and wakes the first one's waiter
	// as if it had been sent: SetStoreGone's wait ended the moment
	// metaLoop's repeat of a drain went out, and the leave that followed
	// dropped the repeat, StoreGone and all (e2e
	// TestStoredResponseOfAPodDeletedGracefully, a loaded make test).
	updating sync.Mutex
}

// edit applies f to the meta; f reports whether it changed anything, and
// a change goes out with the next meta update.
func (a *advert) edit(f func(*Meta) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f(&a.meta) {
		a.dirty = true
	}
}

// note applies f, which changes only fields the load reports carry too:
// the change goes out with the next meta update while a member of wire 1
// is in the mesh, else with the next update something else makes. Every
// member re-broadcasts a node's meta update (memberlist's alive message),
// so a meta that followed every load and digest change cost each node
// about N updates a second to receive and relay: most of memberlist's
// traffic at 24 pods, and more than its gossip carries at hundreds.
func (a *advert) note(f func(*Meta)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&a.meta)
	a.pushed = true
}

// view returns a copy of the meta that shares nothing with it.
func (a *advert) view() Meta {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.meta
	m.Models = slices.Clone(m.Models)
	return m
}

// encodeLocked rebuilds bytes from meta. The caller holds mu.
func (a *advert) encodeLocked() error {
	b, err := EncodeMeta(a.meta, maxMetaBytes)
	if err != nil {
		return err
	}
	a.bytes, a.dirty, a.pushed = b, false, false
	return nil
}

// nodeMeta returns the meta encoded in at most limit bytes, nil if it does
// not fit.
func (a *advert) nodeMeta(limit int) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.bytes) <= limit {
		return a.bytes
	}
	b, err := EncodeMeta(a.meta, limit)
	if err != nil {
		return nil
	}
	return b
}

// kickNow wakes metaLoop for an update without waiting for MetaInterval.
func (a *advert) kickNow() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// maxMetaWait bounds metaLoop's wait for a meta update to leave, and so
// how long Shutdown can wait for it.
const maxMetaWait = time.Second

// metaRepeat is when a kicked meta update is broadcast once more. With a
// few members memberlist sends each broadcast to each peer once, by UDP:
// one lost packet would hide an adapter unload or a drain from that peer
// until the next push-pull (15-30 s).
const metaRepeat = 300 * time.Millisecond

// metaLoop re-advertises the node meta when it changed, at most once per
// MetaInterval, or at once when kicked (draining, engine, models), and
// again metaRepeat after a kicked change. A change of only what the load
// reports carry (advert.note) goes out only while a member of wire 1 is
// in the mesh. It returns when Shutdown closes done.
func (m *Mesh) metaLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.MetaInterval)
	defer t.Stop()
	repeat := time.NewTimer(metaRepeat)
	repeat.Stop()
	defer repeat.Stop()
	a := &m.advert
	for {
		kicked, again := false, false
		select {
		case <-m.done:
			return
		case <-t.C:
		case <-a.kick:
			kicked = true
		case <-repeat.C:
			again = true
		}
		legacy := m.OldestWire() < 2
		a.mu.Lock()
		dirty := a.dirty || (a.pushed && legacy)
		if dirty {
			if err := a.encodeLocked(); err != nil {
				m.log.Error().Err(err).Msg("encode node meta")
				dirty = false
			}
		}
		a.mu.Unlock()
		if !dirty && !again {
			continue
		}
		// UpdateNode waits for the broadcast to leave, and does not stop
		// waiting when memberlist shuts down: bound it so Shutdown is not
		// held up for a long MetaInterval. A broadcast still queued when the
		// wait ends goes out all the same.
		m.updateMeta(min(m.cfg.MetaInterval, maxMetaWait))
		if dirty && kicked {
			repeat.Reset(metaRepeat)
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
	changed := false
	m.advert.edit(func(mt *Meta) bool {
		if slices.Equal(models, mt.Models) {
			return false
		}
		mt.Models, changed = slices.Clone(models), true
		return true
	})
	if changed {
		m.advert.kickNow()
	}
}

// SetRanks advertises how many data-parallel ranks the local engine runs
// (Meta.Ranks) and, when that changed, re-advertises the meta at once:
// peers pin a request to one of this pod's ranks only within the count it
// advertises. A count outside 1..bloom.MaxRanks advertises none.
func (m *Mesh) SetRanks(n int) {
	if n < 1 || n > bloom.MaxRanks {
		n = 0
	}
	changed := false
	m.advert.edit(func(mt *Meta) bool {
		changed = mt.Ranks != n
		mt.Ranks = n
		return changed
	})
	if changed {
		m.advert.kickNow()
	}
}

// SetStoreGone advertises that this node's vLLM no longer listens, so its
// stored responses are gone (Meta.StoreGone), and waits up to
// storeGoneWait for the update to have gone out: call it just before
// Leave, whose peers then answer those responses' follow-ups with the
// final 404 at once rather than after respown's grace.
func (m *Mesh) SetStoreGone() {
	a := &m.advert
	a.mu.Lock()
	a.meta.StoreGone = true
	err := a.encodeLocked()
	a.mu.Unlock()
	if err != nil {
		m.log.Error().Err(err).Msg("encode node meta")
		return
	}
	m.updateMeta(storeGoneWait)
}

// storeGoneWait bounds SetStoreGone's wait for its update to be sent as
// often as memberlist sends a broadcast. It is longer than maxMetaWait
// because Leave follows at once, and the leave's message about this node
// drops from memberlist's queue every message about it not yet done with
// (broadcast.go, Invalidates): an update still queued then never reaches
// anyone. Only a pod whose vLLM has exited waits it, once.
const storeGoneWait = 3 * time.Second

// updateMeta broadcasts the encoded meta, waiting up to wait for it to
// leave, one update at a time (advert.updating).
func (m *Mesh) updateMeta(wait time.Duration) {
	m.advert.updating.Lock()
	defer m.advert.updating.Unlock()
	m.stats.metaUpdates.Add(1)
	if err := m.ms.Load().UpdateMeta(wait); err != nil {
		m.log.Debug().Err(err).Msg("update node meta")
	}
}

// SetDraining sets the draining flag and advertises it at once.
func (m *Mesh) SetDraining(draining bool) {
	m.advert.edit(func(mt *Meta) bool { mt.Draining = draining; return true })
	m.advert.kickNow()
}
