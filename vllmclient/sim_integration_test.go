//go:build integration

package vllmclient_test

// These tests run the index against the simulator as separate processes
// over real sockets (issue 3): vllm-sim on 127.0.0.1:<free port> publishing
// KV events on ipc://, vllmclient.Subscribe receiving them, kvindex
// applying them, and /sim/cache as ground truth.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// simBlocks is the simulator's KV capacity in the tests: 8192 tokens, a
// small fraction of a workload's distinct prefixes, so it evicts all along.
const simBlocks = 512

func TestWorkloadShape(t *testing.T) {
	w := workload{DocSeed: 1, ReqSeed: 2, Docs: 300, Requests: 3000, Workers: 8}
	a, b := w.jobs(), w.jobs()
	shared := 0
	seen := make(map[[2]uint32]bool)
	for i, j := range a {
		if n := len(j.prompt); n < 20 || n > 600 {
			t.Fatalf("job %d: prompt of %d tokens; want 20..600", i, n)
		}
		if j.maxTokens < 1 || j.maxTokens > 20 {
			t.Fatalf("job %d: max_tokens %d; want 1..20", i, j.maxTokens)
		}
		if fmt.Sprint(j) != fmt.Sprint(b[i]) {
			t.Fatalf("job %d differs between two calls with the same seeds", i)
		}
		first := [2]uint32{j.prompt[0], j.prompt[1]}
		if seen[first] {
			shared++
		}
		seen[first] = true
	}
	// Requests must share prefixes, or the cache would never hit.
	if shared < len(a)/2 {
		t.Errorf("%d of %d requests share a first block with an earlier one; want at least half", shared, len(a))
	}
}

// TestSimIndexEqualsCache: after thousands of requests with evictions,
// decoded from either wire encoding, the index holds exactly the
// simulator's cache: the same hashes with the same copy counts, each keyed
// at the position and chain the simulator's tokens give.
func TestSimIndexEqualsCache(t *testing.T) {
	for _, tc := range []struct {
		encoding  string
		scheme    blockkey.Scheme
		timeScale float64
	}{
		{"array", blockkey.Scheme{BlockSize: 16, Stride: 1}, 200},
		{"map", blockkey.Scheme{BlockSize: 16, Stride: 4}, 200},
	} {
		t.Run(tc.encoding, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			s := startSim(t, simOptions{Encoding: tc.encoding, Blocks: simBlocks, TimeScale: tc.timeScale, BatchedTokens: 128})
			f := follow(t, s, false, tc.scheme)
			f.await(t, ctx, s)
			begin := time.Now()
			w := workload{DocSeed: 1, ReqSeed: 2, Docs: 300, Requests: 3000, Workers: 8}
			sent := w.run(t, ctx, s)
			sc := f.requireExact(t, ctx, s)

			st, n, is := f.sub.Stats(), f.tally(), f.ix.Stats()
			t.Logf("%s: %d requests (%d prompt tokens) in %v; %d batches, %d stored, %d duplicate copies, %d removed; final %d blocks, %d routing keys",
				tc.encoding, w.Requests, sent, time.Since(begin).Round(time.Millisecond), n.Batches, is.Stored, is.Duplicates, is.Removed, len(sc.Blocks), f.ix.Len())
			if st.Gaps != 0 || st.DecodeErrors != 0 || st.Dropped != 0 || n.Gaps != 0 {
				t.Errorf("lossless run reported loss: subscriber %+v, follower %+v", st, n)
			}
			if f.ix.Uncertain() {
				t.Error("index uncertain after a lossless run")
			}
			// The subscriber decodes both generations alike, so check that the
			// simulator really sent this one: its payloads are what kvevent's
			// encoder writes for it, byte for byte, and not the other.
			enc, other := kvevent.MapEncoding, kvevent.ArrayEncoding
			if tc.encoding == "array" {
				enc, other = other, enc
			}
			for i, p := range s.replayedPayloads(50) {
				b, err := kvevent.Decode(p)
				if err != nil {
					t.Fatalf("replayed payload %d: %v", i, err)
				}
				same, _ := kvevent.Encode(b, enc)
				diff, _ := kvevent.Encode(b, other)
				if !bytes.Equal(p, same) || bytes.Equal(p, diff) {
					t.Fatalf("replayed payload %d is not %s-encoded: % x", i, tc.encoding, p[:min(len(p), 32)])
				}
			}
			// The workload must churn the cache and make copies, or equality
			// proves little.
			if is.Removed < 10*simBlocks {
				t.Errorf("%d blocks removed; want at least %d (10x capacity) so evictions are exercised", is.Removed, 10*simBlocks)
			}
			if is.Duplicates == 0 {
				t.Error("no duplicate copy stored; the workload should make the engine compute some blocks twice")
			}
		})
	}
}

// TestSimReplayRepairsDrops: with a fifth of the batches not sent live and
// replay configured, every hole is repaired and the index is still exact.
//
// Fails as of this writing with 29–38 gaps per run (see the comment at the
// gap check): the fix belongs in vllmclient's sequencer, which should
// replay again when a replay that made progress leaves a hole among the
// held batches.
func TestSimReplayRepairsDrops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	s := startSim(t, simOptions{Encoding: "map", Blocks: simBlocks, DropRate: 0.2})
	f := follow(t, s, true, perBlock)
	w := workload{DocSeed: 3, ReqSeed: 4, Docs: 300, Requests: 2000, Workers: 8}
	w.run(t, ctx, s)
	// A dropped batch is noticed only when a later one arrives: stop
	// dropping so the sentinel's batch arrives and exposes the last holes.
	s.setDropRate(ctx, 0)
	f.sentinel(t, ctx, s)
	st, n := f.sub.Stats(), f.tally()
	dropped := s.counter(ctx, "vllm_sim_kv_batches_dropped_total")
	t.Logf("drop 0.2 + replay: sim dropped %d of %d batches; %d replay requests (1 at start-up), %d batches replayed, %d failures, %d duplicates; %d gaps left",
		dropped, n.Batches, st.Replays, st.Replayed, st.ReplayFailures, st.Duplicates, st.Gaps)
	if st.Gaps != 0 {
		// A batch dropped while a replay is in flight sits among the held
		// live batches; when the replay ends, the sequencer releases them
		// without replaying again (finish → onLive(..., mayReplay=false)),
		// so that hole becomes a Gap although replay could fill it.
		t.Errorf("%d gaps reported although the simulator's replay buffer holds every batch", st.Gaps)
	}
	if dropped == 0 || st.Replays < 2 {
		t.Errorf("sim dropped %d batches, subscriber sent %d replay requests; want drops and gap replays beyond the start-up one", dropped, st.Replays)
	}
	if n.Replayed == 0 {
		t.Error("no replayed batch reached the index")
	}
	f.requireExact(t, ctx, s)
}

// TestSimDropsWithoutReplay: without replay, lost batches surface as Gap
// items and the index drifts from the cache. The drift is measured after
// one workload per drop rate, each from an emptied cache, as |index Δ sim|
// over distinct hashes, relative to the cache (what routing sees) and to
// the block events applied during the run (what was at risk).
//
// The bound asserted is per event: a lost batch costs the index its own
// stores (missing) and removals (stale), plus the stores of later batches
// that chain from a lost block (held as orphans, so missing too), so the
// expected error per applied event is about the batch drop rate. Measured
// at 0.3x–0.6x (a block stored again later heals a lost store); asserted
// at 3x, since at 1% only ~15 batches drop and one big batch weighs a lot. Relative to the cache the
// error has no bound: a lost removal stays stale until a clear or restart,
// so it grows with the length of the run (the 2000-request row).
func TestSimDropsWithoutReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := startSim(t, simOptions{Encoding: "map", Blocks: simBlocks})
	f := follow(t, s, false, perBlock)
	f.await(t, ctx, s)
	type row struct {
		rate                      float64
		requests                  int
		batches, dropped, gaps    int
		events, orphaned          int
		simBlocks, missing, stale int
		perSim, perEvent          float64
		uncertain                 bool
	}
	var rows []row
	for i, c := range []struct {
		rate     float64
		requests int
	}{{0.01, 1000}, {0.05, 1000}, {0.1, 1000}, {0.05, 2000}} {
		// Start each run from an empty cache and an exact index.
		s.resetCache(ctx)
		f.requireExact(t, ctx, s)
		before, stats := f.tally(), f.ix.Stats()
		dropBefore := s.counter(ctx, "vllm_sim_kv_batches_dropped_total")
		s.setDropRate(ctx, c.rate)
		w := workload{DocSeed: 5, ReqSeed: 6 + uint64(i), Docs: 300, Requests: c.requests, Workers: 8}
		w.run(t, ctx, s)
		s.setDropRate(ctx, 0) // so the sentinel's batch arrives and exposes the last holes
		f.sentinel(t, ctx, s)
		sc := s.cache(ctx)
		ixSet, simSet := hashSets(f.ix, sc)
		d, stale, missing := symDiff(ixSet, simSet)
		after, statsAfter := f.tally(), f.ix.Stats()
		events := int(statsAfter.Stored + statsAfter.Removed - stats.Stored - stats.Removed)
		rows = append(rows, row{
			rate: c.rate, requests: c.requests,
			batches: after.Batches - before.Batches,
			dropped: int(s.counter(ctx, "vllm_sim_kv_batches_dropped_total") - dropBefore),
			gaps:    after.Gaps - before.Gaps,
			events:  events, orphaned: after.Orphaned - before.Orphaned,
			simBlocks: len(simSet), missing: missing, stale: stale,
			perSim: float64(d) / float64(len(simSet)), perEvent: float64(d) / float64(events),
			uncertain: f.ix.Uncertain(),
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "drop | reqs | batches | dropped | gaps | block events | orphaned | sim blocks | missing | stale | Δ/sim | Δ/events\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "%4.2f | %4d | %7d | %7d | %4d | %12d | %8d | %10d | %7d | %5d | %5.3f | %.4f\n",
			r.rate, r.requests, r.batches, r.dropped, r.gaps, r.events, r.orphaned, r.simBlocks, r.missing, r.stale, r.perSim, r.perEvent)
	}
	t.Logf("without replay (Δ = |index Δ sim| over distinct hashes):\n%s", b.String())
	for _, r := range rows {
		if r.dropped == 0 || r.gaps == 0 {
			t.Errorf("rate %.2f: %d batches dropped, %d Gap items; want both > 0", r.rate, r.dropped, r.gaps)
		}
		if r.gaps > r.dropped {
			t.Errorf("rate %.2f: %d Gap items for %d dropped batches", r.rate, r.gaps, r.dropped)
		}
		if !r.uncertain {
			t.Errorf("rate %.2f: index not marked uncertain after gaps", r.rate)
		}
		if r.perEvent > 3*r.rate {
			t.Errorf("rate %.2f: error %.4f per applied block event; want <= %.2f (3x the drop rate)", r.rate, r.perEvent, 3*r.rate)
		}
	}
}

// TestSimRestart: after an engine restart (seq back to 0, no
// AllBlocksCleared, a new hash seed) the index changes epoch, keeps no
// block from before, and converges to the new cache exactly.
func TestSimRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	s := startSim(t, simOptions{Encoding: "array", Blocks: simBlocks})
	f := follow(t, s, true, perBlock)
	w := workload{DocSeed: 7, ReqSeed: 8, Docs: 200, Requests: 1000, Workers: 8}
	w.run(t, ctx, s)
	old := f.requireExact(t, ctx, s)
	epoch := f.ix.Epoch()
	oldHashes := make(map[uint64]bool, len(old.Blocks))
	for _, b := range old.Blocks {
		oldHashes[b.Hash] = true
	}

	s.restart(ctx)
	// The first batch after the restart must clear every old block.
	cur := f.requireExact(t, ctx, s)
	if len(cur.Blocks) != 2 {
		t.Errorf("sim holds %d blocks after restart and one 2-block request; want 2", len(cur.Blocks))
	}
	if f.ix.Epoch() == epoch {
		t.Fatalf("epoch still %d after the restart", epoch)
	}
	// Same documents again: the same tokens, hashed with the new seed.
	w.ReqSeed = 9
	w.run(t, ctx, s)
	cur = f.requireExact(t, ctx, s)
	survived, reused := 0, 0
	for _, r := range f.ix.Resident() {
		if oldHashes[r.Hash] {
			survived++
		}
	}
	for _, b := range cur.Blocks {
		if oldHashes[b.Hash] {
			reused++
		}
	}
	n, st := f.tally(), f.sub.Stats()
	t.Logf("restart: epoch %d -> %d; %d blocks before, %d after; %d restart items, %d restarted changes; old hashes: %d in index, %d in sim",
		epoch, f.ix.Epoch(), len(old.Blocks), len(cur.Blocks), st.Restarts, n.Restarted, survived, reused)
	if st.Restarts != 1 || n.Restarted != 1 {
		t.Errorf("saw %d restart items and %d restarted changes; want 1 each", st.Restarts, n.Restarted)
	}
	if reused != 0 {
		t.Errorf("%d pre-restart hashes are back in the sim: its hash seed did not change", reused)
	}
	if st.Gaps != 0 || f.ix.Uncertain() {
		t.Errorf("restart reported as %d gaps (uncertain %v); a restart is not a loss", st.Gaps, f.ix.Uncertain())
	}
	if survived > reused {
		t.Errorf("%d pre-restart hashes survive in the index; the sim holds %d of them", survived, reused)
	}
}

// TestSimRestartFirstBatchLost: the restarted engine's first batch (seq 0)
// is lost live, so the subscriber learns of the restart from seq 1 and
// replays seq 0. The index must take that replayed batch into the new
// epoch rather than drop it as stale against the old numbering: the
// follower, like cmd/sidecar's cacheState, passes the Restart item to the
// index (kvindex.Index.Restart) before the replayed batches arrive.
func TestSimRestartFirstBatchLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	s := startSim(t, simOptions{Encoding: "map", Blocks: simBlocks})
	f := follow(t, s, true, perBlock)
	w := workload{DocSeed: 10, ReqSeed: 11, Docs: 100, Requests: 300, Workers: 8}
	w.run(t, ctx, s)
	f.requireExact(t, ctx, s)
	epoch := f.ix.Epoch()

	s.restart(ctx)
	s.setDropRate(ctx, 1) // seq 0 of the new engine: replayable, never live
	prompt := make([]uint32, 3*16+1)
	for i := range prompt {
		prompt[i] = 2_000_000 + uint32(i)
	}
	if err := s.complete(ctx, prompt, 1); err != nil {
		t.Fatal(err)
	}
	s.setDropRate(ctx, 0)
	f.requireExact(t, ctx, s) // its sentinel is seq 1, live
	st, n := f.sub.Stats(), f.tally()
	t.Logf("restart, first batch lost: epoch %d -> %d; subscriber %+v; follower %+v", epoch, f.ix.Epoch(), st, n)
	if f.ix.Epoch() == epoch || st.Restarts != 1 {
		t.Errorf("epoch %d -> %d with %d restart items; want a new epoch from one restart", epoch, f.ix.Epoch(), st.Restarts)
	}
}
