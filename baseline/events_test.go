package baseline

import (
	"testing"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/vllmclient"
)

// TestRestartFirstBatchByReplay: a restarted vLLM's first batch (seq 0)
// lost on the live socket and fetched by replay must enter the central
// index. The baselines once relied on the next lower seq to clear the
// index, and dropped exactly this batch as stale.
func TestRestartFirstBatchByReplay(t *testing.T) {
	block := func(hash uint64, first uint32) kvevent.Batch {
		toks := make([]uint32, 16)
		for i := range toks {
			toks[i] = first + uint32(i)
		}
		return kvevent.Batch{Topic: "kv", Events: []kvevent.Event{{Kind: kvevent.BlockStored,
			BlockHashes: []uint64{hash}, TokenIDs: toks, BlockSize: 16}}}
	}
	old, fresh := block(1, 100), block(2, 500)
	old.Seq, fresh.Seq = 7, 0
	items := make(chan vllmclient.Item, 3)
	items <- vllmclient.Item{Kind: vllmclient.KindBatch, Batch: old}
	items <- vllmclient.Item{Kind: vllmclient.KindRestart, Seq: 0}
	items <- vllmclient.Item{Kind: vllmclient.KindBatch, Batch: fresh, Replayed: true}
	close(items)
	scheme := blockkey.Scheme{BlockSize: 16, Stride: 1}
	ix := kvindex.New(kvindex.Config{Model: "m", Scheme: scheme})
	applyEvents(items, ix)
	key := func(b kvevent.Batch) blockkey.Key {
		return blockkey.Chain(blockkey.ModelRoot("m", ""), b.Events[0].TokenIDs, 16)[0]
	}
	if !ix.Contains(key(fresh)) {
		t.Errorf("the restarted engine's replayed first block is missing from the index")
	}
	if ix.Contains(key(old)) {
		t.Errorf("the old engine's block survived its restart")
	}
}
