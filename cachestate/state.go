package cachestate

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/vllmclient"
)

// Advertiser is how the mesh learns this pod's cache and engine;
// *gossip.Mesh satisfies it.
type Advertiser interface {
	PublishDigest(d *bloom.Digest) error
	PublishDelta(x bloom.Delta) error
	WithdrawDigest()
	SetEngine(e route.Engine)
	// OldestWire is the lowest gossip wire version in the mesh: below 2 a
	// member reads no removals.
	OldestWire() uint8
}

// Front is the front's switch for serving from the local vLLM;
// *forward.Handler satisfies it.
type Front interface{ SetLocalReady(ok bool) }

// State turns the local vLLM's event stream into the exact index and
// the digest that peers test (docs/design.md §2, cache-state flow), and owns the
// engine's state as the mesh sees it (D10): a digest is advertised only
// while the engine serves, and an engine that comes back is a new epoch,
// published empty, before it is advertised again. Its run loop is the only
// writer of the index; readers use the index's own lock.
type State struct {
	cfg     Config
	ix      *kvindex.Index
	pub     Advertiser
	front   Front
	log     zerolog.Logger
	metrics *Metrics

	version  uint64                // digest version last published
	epoch    uint64                // digest epoch last published
	pending  map[blockkey.Key]bool // digest entries changed since the last publish: true added, false removed
	removed  int                   // removals published or pending since the last full digest
	marks    marks                 // the markers the published digest holds
	params   bloom.Params          // the published digest's size
	load     int                   // entries added to it since it was built, and at the build
	needFull bool
	lastFull time.Time
	streams  map[vllmclient.Stream]bool // streams seen since the last restart
	silence  *engine.Silence
	start    float64 // the engine's process start time, 0 when unknown
	prompts  float64 // the engine's prompt-token counter at the last scrape
	scraped1 bool    // a scrape has been taken
	// startAt is when a scrape first showed start, lastAt the last scrape
	// (this sidecar's clock): how long the process has been seen alive.
	startAt, lastAt time.Time

	// What the admin endpoints show; written by Run only.
	state   atomic.Uint32 // route.Engine as advertised
	reason  atomic.Value  // string: why the engine is in its state
	silent  atomic.Bool   // the engine serves but no KV event ever arrived
	partial atomic.Bool   // chains stored before we subscribed are unknown

	// kept: the engine is down by a hang and the index kept as it was; it
	// is advertised again if the same process resumes (Transition.Resumed).
	kept bool
}

// New returns the state of an index that has advertised nothing, with the
// engine starting. Zero fields of cfg take DefaultConfig's values; m may be
// nil (nothing is exported).
func New(cfg Config, ix *kvindex.Index, pub Advertiser, front Front, m *Metrics, log zerolog.Logger) *State {
	cfg = cfg.withDefaults()
	if m == nil {
		m = NewMetrics(nil)
	}
	s := &State{cfg: cfg, ix: ix, pub: pub, front: front, metrics: m, log: log, needFull: true, pending: map[blockkey.Key]bool{},
		silence: engine.NewSilence(cfg.SilenceWindow, cfg.SilenceTokens), streams: map[vllmclient.Stream]bool{}}
	s.state.Store(uint32(route.EngineStarting))
	s.reason.Store("waiting for the first healthy /health")
	return s
}

// Engine returns the engine state as advertised, and why.
func (s *State) Engine() (route.Engine, string) {
	return route.Engine(s.state.Load()), s.reason.Load().(string)
}

// Run applies events, engine transitions and /metrics scrapes until ctx is
// done or items is closed, and publishes digest changes every
// Config.PublishInterval. It is the only writer of the index.
func (s *State) Run(ctx context.Context, items <-chan vllmclient.Item, engineC <-chan engine.Transition,
	scrapes <-chan vllmclient.Load) {
	t := time.NewTicker(s.cfg.PublishInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case it, ok := <-items:
			if !ok {
				s.log.Error().Msg("kv event subscriber stopped")
				return
			}
			s.apply(it)
		case tr, ok := <-engineC:
			if !ok {
				engineC = nil
				continue
			}
			s.transition(tr)
		case l := <-scrapes:
			s.scraped(l, s.cfg.Now())
		case now := <-t.C:
			s.publish(now)
		}
	}
}

// transition carries out an engine state change. Down withdraws at once;
// serving again starts a new, empty epoch and publishes it before the
// engine is advertised, so no peer can match the old engine's blocks.
// A hang keeps the index: when the same process answers again (Resumed),
// its cache is as it was, and the index goes out again whole. Clearing it
// there made the pod cold to every peer for minutes after a hang of
// seconds, while its vLLM held every prefix. A new process clears it all
// the same: by a refusal while down (not Resumed), its start time, or
// its event sequence going back.
func (s *State) transition(tr engine.Transition) {
	s.metrics.engineTransitions.WithLabelValues(tr.To.String()).Inc()
	s.reason.Store(tr.Reason)
	switch tr.To {
	case route.EngineServing:
		resumed := tr.Resumed && s.kept // Resumed implies Restarted
		switch {
		case resumed:
			s.needFull = true // peers dropped our digest at the withdrawal
			s.log.Info().Int("blocks", s.ix.Len()).Msg("the engine answers again after a hang: its cache advertised again")
		case tr.Restarted:
			s.restart("the engine came back after being down")
			s.partial.Store(true) // a resumed engine may still hold chains we no longer know
		}
		s.kept = false
		s.send(tr.At)
		if s.needFull { // the publish failed; the mesh has no digest of ours
			s.log.Error().Msg("engine serving but no digest published; peers route to this pod by load only")
		}
		s.state.Store(uint32(route.EngineServing))
		s.pub.SetEngine(route.EngineServing)
		s.front.SetLocalReady(true)
		s.metrics.engineUp.Set(1)
		if s.cfg.OnServing != nil {
			s.cfg.OnServing()
		}
		s.log.Info().Str("from", tr.From.String()).Bool("new_epoch", tr.Restarted && !resumed).Msg("engine serving")
	default:
		s.state.Store(uint32(tr.To))
		s.front.SetLocalReady(false)
		s.pub.SetEngine(tr.To)
		s.pub.WithdrawDigest()
		s.kept = tr.Hung
		if !s.kept {
			s.restart("the engine cannot serve")
		}
		s.metrics.engineUp.Set(0)
		s.log.Warn().Str("state", tr.To.String()).Str("reason", tr.Reason).Msg("engine cannot serve: not ready, digest withdrawn")
	}
}

// restart clears the index into a new epoch: the cache it described is gone.
func (s *State) restart(why string) {
	s.ix.Restart()
	s.restarted(why)
}

// restarted resets what followed the index's old epoch.
func (s *State) restarted(why string) {
	s.needFull = true
	s.kept = false // a hang's index is of the old epoch
	clear(s.pending)
	s.removed = 0
	clear(s.streams)
	s.silence.Reset()
	s.silent.Store(false)
	s.metrics.eventsSilent.Set(0)
	s.log.Info().Str("why", why).Uint64("epoch", s.ix.Epoch()).Msg("index cleared: new epoch")
}

// startJitter is how far process_start_time_seconds moves with no new
// process: it is the kernel's boot time, which Linux derives from the wall
// clock at each read and truncates to the second, plus the process's start
// in ticks, so it steps by a second under clock slewing and by the step
// under a clock step (prometheus/client_golang#289; seen here: every pod's
// sidecar cleared its index at the same second of a run, a third of the
// run's hits gone).
const startJitter = 2.0

// newProcess reports whether a process start time that went from old to
// cur says a new engine process, the old one having been seen alive for
// watched: a later start by more than the jitter, and by at least how
// long the old one was watched, since the new one started after the last
// scrape that showed the old. A clock stepped forward by less than that
// moves the start time alone; so does one stepped back, which no restart
// does.
func newProcess(old, cur float64, watched time.Duration) bool {
	return cur-old > startJitter && cur-old >= watched.Seconds()-startJitter
}

// scraped takes a /metrics scrape of the engine: a new process or a counter
// that went down is a restart even if no probe saw the engine go (vLLM can
// come back within a probe interval), and the prompt counter tells a silent
// event path from a quiet one.
func (s *State) scraped(l vllmclient.Load, now time.Time) {
	if !s.scraped1 {
		s.scraped1 = true
		if l.PromptTokens > 0 && !s.cfg.Replay && s.ix.Len() == 0 {
			// vLLM served before we followed its events, and nothing can
			// replay them: what it cached then is unknown to us.
			s.partial.Store(true)
		}
	}
	started := s.start != 0 && l.StartTime != 0 && newProcess(s.start, l.StartTime, s.lastAt.Sub(s.startAt))
	if started || l.PromptTokens < s.prompts {
		s.metrics.eventRestarts.Inc()
		s.restart(fmt.Sprintf("the engine's counters restarted (process start %.0f -> %.0f, prompt tokens %.0f -> %.0f)",
			s.start, l.StartTime, s.prompts, l.PromptTokens))
		s.partial.Store(false)
	}
	if s.start == 0 || started {
		s.start, s.startAt = l.StartTime, now
	}
	s.prompts, s.lastAt = l.PromptTokens, now
	if route.Engine(s.state.Load()) != route.EngineServing {
		return
	}
	silent, changed := s.silence.Tokens(l.PromptTokens, now)
	if !changed {
		return
	}
	s.silent.Store(silent)
	if silent {
		s.metrics.eventsSilent.Set(1)
		s.metrics.eventsSilentTotal.Inc()
		s.log.Warn().Msg(silenceWarning)
	}
}

// silenceWarning names the usual cause of an engine that serves while no
// KV event arrives.
const silenceWarning = "vLLM is serving but no KV event has arrived: routing is by load only. " +
	"Exactly one side of the ZMQ pair must bind: vLLM binds for tcp://*:PORT and ipc:// endpoints " +
	"and connects for a host address (tcp://HOST:PORT), so point --kv-events-endpoint at vLLM's " +
	"bound endpoint, or pass --kv-events-bind when vLLM connects; also check --kv-events-topic"

func (s *State) apply(it vllmclient.Item) {
	s.silence.Event()
	if s.silent.Swap(false) {
		s.metrics.eventsSilent.Set(0)
		s.log.Info().Msg("kv events arriving")
	}
	if it.Kind == vllmclient.KindBatch && !s.streams[it.Stream] {
		s.streams[it.Stream] = true
		if it.Batch.Seq > 0 && !it.Replayed && !s.cfg.Replay {
			s.partial.Store(true)
			s.log.Warn().Uint64("seq", it.Batch.Seq).Msg("joined the KV-event stream mid-way without replay: " +
				"blocks vLLM stored before are unknown and not advertised (set --kv-events-replay-endpoint to recover them)")
		}
	}
	ch := vllmclient.ApplyItem(s.ix, it)
	switch it.Kind {
	case vllmclient.KindGap:
		s.metrics.eventGaps.Inc()
		s.log.Warn().Str("topic", it.Stream.Topic).Uint64("expected", it.Expected).Uint64("got", it.Got).Msg("kv events lost; index uncertain until rebuilt")
		return
	case vllmclient.KindRestart:
		s.metrics.eventRestarts.Inc()
		s.log.Warn().Str("topic", it.Stream.Topic).Uint64("seq", it.Seq).Msg("vLLM restarted: its cache is gone")
		s.restarted("the event sequence restarted")
		s.partial.Store(false)
		s.streams[it.Stream] = true
		return
	case vllmclient.KindDecodeError:
		s.metrics.eventErrors.Inc()
		s.log.Warn().Err(it.Err).Uint64("seq", it.Seq).Msg("undecodable kv event batch dropped")
		return
	}
	for _, ev := range it.Batch.Events {
		s.metrics.events.WithLabelValues(ev.Kind.String()).Inc()
	}
	if ch.Restarted || ch.Cleared {
		s.needFull = true
		clear(s.pending)
		return
	}
	s.pend(ch)
}

// pend records what ch changed for the next publish. The last change of an
// entry within a publish interval is the one peers get: a delta's lists
// hold each key once.
func (s *State) pend(ch kvindex.Change) {
	for _, k := range ch.Added {
		s.pending[k] = true
	}
	for _, k := range ch.Removed {
		s.pending[k] = false
	}
	for _, e := range ch.TierAdded {
		s.pending[tag(e)] = true
	}
	for _, e := range ch.TierRemoved {
		s.pending[tag(e)] = false
	}
}

// tag is e's digest entry (bloom.Tag).
func tag(e kvindex.Entry) blockkey.Key { return bloom.Tag(e.Key, uint8(e.Tier), e.Rank) }

// publish sends what changed since the last tick, while the engine serves:
// nothing is advertised for an engine that cannot, and the transition to
// serving sends the first digest itself.
func (s *State) publish(now time.Time) {
	// Lower-tier copies of a producer that never removes (LMCache) age out
	// here (kvindex.Config.StoreOnlyTTL), and leave peers' views with the
	// next delta like any removal.
	if ch := s.ix.Expire(now); ch.Aged > 0 {
		s.pend(ch)
	}
	if route.Engine(s.state.Load()) == route.EngineServing {
		s.send(now)
	}
}

// send publishes a delta of the entries added and removed, or a full
// digest (rebuilt from the exact index) after an epoch change or a failed
// delta, or once the removals since the last full pass
// Config.RebuildRemoved (they are what peers keep beside the bits, and
// the bits keep filling until a rebuild). While a member of wire 1 is in
// the mesh, which reads no removals, removals also rebuild after
// Config.RebuildEvery, as before removals were carried.
func (s *State) send(now time.Time) {
	epoch := s.ix.Epoch()
	mk := s.markers()
	var add, rem []blockkey.Key
	for k, added := range s.pending {
		if added {
			add = append(add, k)
		} else {
			rem = append(rem, k)
		}
	}
	add = append(add, mk.newer(s.marks)...)
	removed := s.removed + len(rem)
	design := s.params.Keys()
	limit := s.cfg.RebuildRemoved
	if limit <= 0 {
		limit = max(design/8, 64)
	}
	full := s.needFull || epoch != s.epoch || removed >= limit || s.load+len(add) > design+limit ||
		(removed > 0 && now.Sub(s.lastFull) >= s.cfg.RebuildEvery && s.pub.OldestWire() < 2)
	if !full && len(add)+len(rem) == 0 {
		return
	}
	if !full {
		x := bloom.Delta{Node: s.cfg.Node, Epoch: epoch, From: s.version, To: s.version + 1, Keys: add, Removed: rem}
		if err := s.pub.PublishDelta(x); err == nil {
			s.version++
			s.removed, s.load = removed, s.load+len(add)
			s.marks = s.marks.union(mk)
			clear(s.pending)
			s.metrics.digestPublished.WithLabelValues("delta").Inc()
			return
		} else {
			s.log.Debug().Err(err).Msg("delta refused; publishing a full digest")
		}
	}
	ks := s.entries(mk)
	params := s.cfg.Params
	if n := len(ks); n > params.Keys() {
		params = bloom.ParamsFor(n+n/4, s.cfg.FPRate)
	}
	d := bloom.Build(bloom.Header{Node: s.cfg.Node, Epoch: epoch, Version: s.version + 1, Params: params}, ks)
	if err := s.pub.PublishDigest(d); err != nil {
		s.log.Error().Err(err).Msg("publish digest")
		return
	}
	s.version++
	s.epoch = epoch
	s.removed, s.needFull, s.lastFull, s.marks = 0, false, now, mk
	s.params, s.load = d.Header().Params, len(ks)
	clear(s.pending)
	s.metrics.digestPublished.WithLabelValues("full").Inc()
	s.metrics.digestBytes.Set(float64(d.Size()))
}

// entries returns the full digest's keys: every index entry tagged with
// its place (bloom.Tag), and the markers mk. For a pod with one rank and
// no lower tier they are its GPU keys alone, the digest of before tiers.
func (s *State) entries(mk marks) []blockkey.Key {
	es := s.ix.Entries()
	ks := make([]blockkey.Key, 0, len(es)+mk.ranks)
	for _, e := range es {
		ks = append(ks, tag(e))
	}
	return append(ks, mk.keys()...)
}

// Health says how far the local index can be trusted and whether KV events
// arrive, as /debug/peers shows them.
func (s *State) Health() (index, events string) {
	switch {
	case s.ix.Uncertain():
		index = "uncertain: KV events were lost; blocks may be missing or stale until they are evicted"
	case s.partial.Load():
		index = "partial: chains vLLM stored before this sidecar followed its events are unknown and not advertised"
	default:
		index = "complete"
	}
	events = "ok"
	if s.silent.Load() {
		events = "silent: " + silenceWarning
	}
	return index, events
}

// Degraded lists what makes routing load-only or partial while the pod
// is ready.
func (s *State) Degraded() []string {
	var out []string
	index, events := s.Health()
	if index != "complete" {
		out = append(out, "index "+index)
	}
	if events != "ok" {
		out = append(out, "kv events "+events)
	}
	return out
}

// Partial reports whether chains vLLM stored before this sidecar followed
// its events are unknown (and so never advertised).
func (s *State) Partial() bool { return s.partial.Load() }
