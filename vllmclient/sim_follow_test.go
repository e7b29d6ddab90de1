//go:build integration

package vllmclient_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/vllmclient"
)

// tally counts what a follower saw: subscriber items by kind and the
// Changes the index returned.
type tally struct {
	Batches, Replayed, Gaps, Restarts, DecodeErrors int
	Restarted, Cleared, Orphaned, Expired           int
}

// follower is the sidecar's cache-state loop reduced to the index: it
// feeds a Subscriber's Items into a kvindex.Index through ApplyItem.
type follower struct {
	sub    *vllmclient.Subscriber
	ix     *kvindex.Index
	scheme blockkey.Scheme
	mu     sync.Mutex
	n      tally
	seq    atomic.Uint64 // sentinel prompts sent, to keep them unique
}

// follow subscribes to s's events (with replay when replay is set) and
// applies them to a fresh index until the test ends.
func follow(t *testing.T, s *sim, replay bool, scheme blockkey.Scheme) *follower {
	t.Helper()
	cfg := vllmclient.LocalConfig()
	cfg.Endpoint = s.events
	cfg.Topic = s.topic
	if replay {
		cfg.ReplayEndpoint = s.replay
		// Generous: a replay abandoned on a busy 2-core machine becomes a
		// Gap and the index is no longer exact; 500 ms is too tight there.
		cfg.ReplayTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := vllmclient.Subscribe(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	f := &follower{
		sub:    sub,
		scheme: scheme,
		ix:     kvindex.New(kvindex.Config{Model: simModel, Scheme: scheme, CapacityBlocks: s.blocks}),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for it := range sub.Items() {
			f.apply(it)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("subscriber did not close Items within 10s of cancel")
			return
		}
		if err := sub.Err(); err != nil {
			t.Errorf("subscriber stopped with %v", err)
		}
	})
	return f
}

func (f *follower) apply(it vllmclient.Item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := vllmclient.ApplyItem(f.ix, it)
	switch it.Kind {
	case vllmclient.KindGap:
		f.n.Gaps++
	case vllmclient.KindRestart:
		f.n.Restarts++
	case vllmclient.KindDecodeError:
		f.n.DecodeErrors++
	case vllmclient.KindBatch:
		f.n.Batches++
		if it.Replayed {
			f.n.Replayed++
		}
	}
	if ch.Restarted {
		f.n.Restarted++
	}
	if ch.Cleared {
		f.n.Cleared++
	}
	f.n.Orphaned += ch.Orphaned
	f.n.Expired += ch.Expired
}

func (f *follower) tally() tally {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// sentinel sends a request with tokens no workload uses and waits until
// its last block is in the index. Batches arrive in seq order, so every
// batch published before it has been applied (or reported lost) by then,
// and with nothing else running the simulator's cache is quiet.
func (f *follower) sentinel(t *testing.T, ctx context.Context, s *sim) {
	t.Helper()
	n := uint32(f.seq.Add(1))
	prompt := make([]uint32, 2*16+1) // two full blocks, stored at prefill
	for i := range prompt {
		prompt[i] = 1_000_000 + n*64 + uint32(i)
	}
	if err := s.complete(ctx, prompt, 1); err != nil {
		t.Fatalf("sentinel: %v", err)
	}
	keys := blockkey.Chain(blockkey.Root(simModel, "", ""), prompt, 16)
	last, pos := keys[len(keys)-1], len(keys)-1
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		for _, r := range f.ix.Resident() {
			if r.Key == last && r.Pos == pos {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sentinel block never reached the index; subscriber %+v, follower %+v", f.sub.Stats(), f.tally())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// requireExact waits (under a deadline) until the index holds exactly the
// simulator's cache, then returns the cache it matched.
func (f *follower) requireExact(t *testing.T, ctx context.Context, s *sim) chaos.SimCache {
	t.Helper()
	f.sentinel(t, ctx, s)
	deadline := time.Now().Add(5 * time.Second)
	for {
		sc := s.cache(ctx)
		diff := compare(f.ix, sc, f.scheme)
		if len(diff) == 0 {
			return sc
		}
		if time.Now().After(deadline) {
			t.Fatalf("index != sim cache (%d sim blocks, %d index blocks; subscriber %+v; follower %+v):\n%s",
				len(sc.Blocks), f.ix.Blocks(), f.sub.Stats(), f.tally(), joinCapped(diff, 15))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func joinCapped(lines []string, n int) string {
	var out string
	for i, l := range lines {
		if i == n {
			out += fmt.Sprintf("... and %d more\n", len(lines)-n)
			break
		}
		out += l + "\n"
	}
	return out
}

// simKey is where a cached block sits in our key chain, recomputed from
// the simulator's tokens by following parents to the root.
type simKey struct {
	key blockkey.Key
	pos int
}

// simKeys keys every block of sc. A block whose parent is not cached has
// no key (the simulator's cache is prefix-closed, so that is a bug there).
func simKeys(sc chaos.SimCache) (map[uint64]simKey, []string) {
	byHash := make(map[uint64]chaos.CachedBlock, len(sc.Blocks))
	for _, b := range sc.Blocks {
		byHash[b.Hash] = b
	}
	keyed := make(map[uint64]simKey, len(sc.Blocks))
	var problems []string
	var chain []chaos.CachedBlock
	for _, b := range sc.Blocks {
		chain = chain[:0]
		cur, ok := b, true
		for ok {
			if _, done := keyed[cur.Hash]; done {
				break
			}
			chain = append(chain, cur)
			if cur.Parent == nil {
				break
			}
			cur, ok = byHash[*cur.Parent]
			if len(chain) > len(sc.Blocks) {
				ok = false // a cycle: cannot happen with real hashes
			}
		}
		if len(chain) == 0 {
			continue // keyed as an ancestor of an earlier block
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("sim block %d: parent chain leaves the cache", b.Hash))
			continue
		}
		// chain runs from b up to the first keyed block or the root.
		last := chain[len(chain)-1]
		k, pos := blockkey.Root(simModel, last.LoRA, ""), 0
		if last.Parent != nil {
			p := keyed[*last.Parent]
			k, pos = p.key, p.pos+1
		}
		for i := len(chain) - 1; i >= 0; i-- {
			k = blockkey.Next(k, chain[i].Tokens)
			keyed[chain[i].Hash] = simKey{k, pos}
			pos++
		}
	}
	return keyed, problems
}

// compare returns every way the index differs from the simulator's cache:
// the multiset {hash → copies} against {Hash → Refs}, each hash's key and
// position against the chain recomputed from the simulator's tokens, and
// the routing key set against the recomputed keys at routed positions.
func compare(ix *kvindex.Index, sc chaos.SimCache, scheme blockkey.Scheme) []string {
	want, diff := simKeys(sc)
	copies := make(map[uint64]int, len(sc.Blocks))
	for _, b := range sc.Blocks {
		copies[b.Hash] = b.Copies
	}
	seen := make(map[uint64]bool)
	for _, r := range ix.Resident() {
		seen[r.Hash] = true
		c, ok := copies[r.Hash]
		switch {
		case !ok:
			diff = append(diff, fmt.Sprintf("index holds %d (pos %d, %d refs); sim does not", r.Hash, r.Pos, r.Refs))
			continue
		case c != r.Refs:
			diff = append(diff, fmt.Sprintf("hash %d: index refs %d, sim copies %d", r.Hash, r.Refs, c))
		}
		if w, ok := want[r.Hash]; ok && (w.key != r.Key || w.pos != r.Pos) {
			diff = append(diff, fmt.Sprintf("hash %d: index key %x pos %d, sim chain gives %x pos %d", r.Hash, r.Key, r.Pos, w.key, w.pos))
		}
	}
	for _, b := range sc.Blocks {
		if !seen[b.Hash] {
			diff = append(diff, fmt.Sprintf("sim holds %d (%d copies); index does not", b.Hash, b.Copies))
		}
	}
	routed := make(map[blockkey.Key]bool)
	for _, w := range want {
		if scheme.Routed(w.pos) {
			routed[w.key] = true
		}
	}
	got := ix.Keys()
	if wantKeys := slices.Sorted(maps.Keys(routed)); !slices.Equal(got, wantKeys) {
		diff = append(diff, fmt.Sprintf("routing keys: index has %d, sim chains give %d (%d in common)",
			len(got), len(wantKeys), common(got, routed)))
	}
	return diff
}

func common(keys []blockkey.Key, set map[blockkey.Key]bool) int {
	n := 0
	for _, k := range keys {
		if set[k] {
			n++
		}
	}
	return n
}

// hashSets returns the distinct hashes of the index and of the cache.
func hashSets(ix *kvindex.Index, sc chaos.SimCache) (index, sim map[uint64]bool) {
	index, sim = make(map[uint64]bool), make(map[uint64]bool)
	for _, r := range ix.Resident() {
		index[r.Hash] = true
	}
	for _, b := range sc.Blocks {
		sim[b.Hash] = true
	}
	return index, sim
}

// symDiff returns |a Δ b|, and how many of a are missing from b and of b
// from a.
func symDiff(a, b map[uint64]bool) (total, onlyA, onlyB int) {
	for h := range a {
		if !b[h] {
			onlyA++
		}
	}
	for h := range b {
		if !a[h] {
			onlyB++
		}
	}
	return onlyA + onlyB, onlyA, onlyB
}

// await makes sure the subscription is live before a test's workload: a
// SUB socket receives nothing until its subscription reaches the PUB (the
// slow joiner), and without replay whatever was published before is never
// known. It sends small unique requests until a batch arrives, then empties
// the simulator's cache (AllBlocksCleared) so the index starts exact.
func (f *follower) await(t *testing.T, ctx context.Context, s *sim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for f.tally().Batches == 0 {
		n := uint32(f.seq.Add(1))
		prompt := make([]uint32, 17)
		for i := range prompt {
			prompt[i] = 1_000_000 + n*64 + uint32(i)
		}
		if err := s.complete(ctx, prompt, 1); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no event batch within 10s of subscribing; subscriber %+v", f.sub.Stats())
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.resetCache(ctx)
}

// TestCompare checks the checker: compare must see every kind of
// difference the integration tests rely on it to find.
func TestCompare(t *testing.T) {
	toks := func(base uint32) []uint32 {
		b := make([]uint32, 16)
		for i := range b {
			b[i] = base + uint32(i)
		}
		return b
	}
	u := func(v uint64) *uint64 { return &v }
	stored := func(parent *uint64, hashes ...uint64) kvevent.Event {
		var ts []uint32
		for _, h := range hashes {
			ts = append(ts, toks(uint32(h))...)
		}
		return kvevent.Event{Kind: kvevent.BlockStored, BlockHashes: hashes, Parent: parent, TokenIDs: ts, BlockSize: 16}
	}
	cache := func(copiesOf3 int, tokensOf2 uint32) chaos.SimCache {
		return chaos.SimCache{BlockSize: 16, Blocks: []chaos.CachedBlock{
			{Hash: 1, Tokens: toks(1), Copies: 1},
			{Hash: 2, Parent: u(1), Tokens: toks(tokensOf2), Copies: 1},
			{Hash: 3, Parent: u(2), Tokens: toks(3), Copies: copiesOf3},
		}}
	}
	for _, tc := range []struct {
		name   string
		events []kvevent.Event
		sim    chaos.SimCache
		want   int // differences found
	}{
		{"equal", []kvevent.Event{stored(nil, 1, 2), stored(u(2), 3)}, cache(1, 2), 0},
		{"duplicate copy", []kvevent.Event{stored(nil, 1, 2), stored(u(2), 3), stored(u(2), 3)}, cache(2, 2), 0},
		{"missing block", []kvevent.Event{stored(nil, 1, 2)}, cache(1, 2), 2}, // hash 3, routing keys
		{"extra block", []kvevent.Event{stored(nil, 1, 2), stored(u(2), 3), stored(u(3), 4)}, cache(1, 2), 2},
		{"copies differ", []kvevent.Event{stored(nil, 1, 2), stored(u(2), 3)}, cache(2, 2), 1},
		{"tokens differ", []kvevent.Event{stored(nil, 1, 2), stored(u(2), 3)}, cache(1, 9), 3}, // keys of 2 and 3, routing keys
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := kvindex.New(kvindex.Config{Model: simModel, Scheme: perBlock})
			ix.Apply(kvevent.Batch{Events: tc.events})
			if got := compare(ix, tc.sim, perBlock); len(got) != tc.want {
				t.Errorf("compare found %d differences %q; want %d", len(got), got, tc.want)
			}
		})
	}
}

// perBlock keys every vLLM block, so a comparison sees every block's key.
var perBlock = blockkey.Scheme{BlockSize: 16, Stride: 1}
