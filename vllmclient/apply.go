package vllmclient

import "github.com/kvroute/kvroute/kvindex"

// ApplyItem applies one subscriber item to an index: the one reading of
// the subscriber's sequence verdicts, shared by the sidecar and the
// baselines. A batch is applied as it comes (the subscriber ordered it); a
// restart clears the index into a new epoch before the new engine's first
// batch, which may arrive by replay; lost or undecodable batches make the
// index uncertain.
func ApplyItem(ix *kvindex.Index, it Item) kvindex.Change {
	switch it.Kind {
	case KindBatch:
		return ix.Apply(it.Batch)
	case KindRestart:
		return ix.Restart()
	case KindGap, KindDecodeError:
		ix.SetUncertain(true)
	}
	return kvindex.Change{}
}
