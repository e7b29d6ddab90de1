package main

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/vllmclient"
)

// publisher is where digests go; *gossip.Mesh satisfies it.
type publisher interface {
	PublishDigest(d *bloom.Digest) error
	PublishDelta(x bloom.Delta) error
}

// cacheState turns the local vLLM's event stream into the exact index and
// the digest that peers test (DESIGN.md §3, cache-state flow). Its run loop
// is the only writer of the index; readers use the index's own lock.
type cacheState struct {
	node    string
	ix      *kvindex.Index
	params  bloom.Params
	pub     publisher
	log     zerolog.Logger
	metrics *sidecarMetrics

	// rebuildEvery bounds how long removed keys stay in peers' views: a
	// Bloom filter cannot delete, so removals need a full rebuild.
	rebuildEvery time.Duration

	version   uint64 // digest version last published
	epoch     uint64 // digest epoch last published
	pending   []blockkey.Key
	removed   int
	needFull  bool
	lastFull  time.Time
	published bool
}

func newCacheState(node string, ix *kvindex.Index, params bloom.Params, pub publisher, m *sidecarMetrics, log zerolog.Logger) *cacheState {
	return &cacheState{node: node, ix: ix, params: params, pub: pub, metrics: m, log: log,
		rebuildEvery: 2 * time.Second, needFull: true}
}

// run applies items until they end or ctx is done, and publishes digest
// changes every tick. It exits when ctx is done or items is closed.
func (s *cacheState) run(ctx context.Context, items <-chan vllmclient.Item, tick time.Duration) {
	t := time.NewTicker(tick)
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
		case now := <-t.C:
			s.publish(now)
		}
	}
}

func (s *cacheState) apply(it vllmclient.Item) {
	switch it.Kind {
	case vllmclient.KindGap:
		s.metrics.eventGaps.Inc()
		s.ix.SetUncertain(true)
		s.log.Warn().Str("topic", it.Stream.Topic).Uint64("expected", it.Expected).Uint64("got", it.Got).Msg("kv events lost; index uncertain until rebuilt")
		return
	case vllmclient.KindRestart:
		s.metrics.eventRestarts.Inc()
		s.log.Warn().Str("topic", it.Stream.Topic).Uint64("seq", it.Seq).Msg("vLLM restarted: its cache is gone")
		// Clear now: the new publisher's first batches may come by replay.
		s.ix.Restart()
		s.needFull = true
		s.pending = s.pending[:0]
		return
	case vllmclient.KindDecodeError:
		s.metrics.eventErrors.Inc()
		s.ix.SetUncertain(true)
		s.log.Warn().Err(it.Err).Uint64("seq", it.Seq).Msg("undecodable kv event batch dropped")
		return
	}
	var ch kvindex.Change
	if it.Replayed {
		ch = s.ix.ApplyReplayed(it.Batch)
	} else {
		ch = s.ix.Apply(it.Batch)
	}
	for _, ev := range it.Batch.Events {
		s.metrics.events.WithLabelValues(ev.Kind.String()).Inc()
	}
	if ch.Restarted || ch.Cleared {
		s.needFull = true
		s.pending = s.pending[:0]
		return
	}
	s.pending = append(s.pending, ch.Added...)
	s.removed += len(ch.Removed)
}

// publish sends what changed since the last tick: a delta of added keys, or
// a full digest after an epoch change, a failed delta, or removals older
// than rebuildEvery.
func (s *cacheState) publish(now time.Time) {
	epoch := s.ix.Epoch()
	full := s.needFull || epoch != s.epoch || (s.removed > 0 && now.Sub(s.lastFull) >= s.rebuildEvery)
	if !full && len(s.pending) == 0 {
		return
	}
	if !full {
		x := bloom.Delta{Node: s.node, Epoch: epoch, From: s.version, To: s.version + 1, Keys: s.pending}
		if err := s.pub.PublishDelta(x); err == nil {
			s.version++
			s.pending = s.pending[:0]
			s.metrics.digestPublished.WithLabelValues("delta").Inc()
			return
		} else {
			s.log.Debug().Err(err).Msg("delta refused; publishing a full digest")
		}
	}
	keys := s.ix.Keys()
	d := bloom.Build(bloom.Header{Node: s.node, Epoch: epoch, Version: s.version + 1, Params: s.params}, keys)
	if err := s.pub.PublishDigest(d); err != nil {
		s.log.Error().Err(err).Msg("publish digest")
		return
	}
	s.version++
	s.epoch = epoch
	s.pending, s.removed, s.needFull, s.lastFull = s.pending[:0], 0, false, now
	s.metrics.digestPublished.WithLabelValues("full").Inc()
	s.metrics.digestBytes.Set(float64(d.Size()))
}
