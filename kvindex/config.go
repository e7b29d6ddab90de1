package kvindex

import (
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Config configures an Index. Zero fields take the DefaultConfig values
// where noted.
type Config struct {
	// Model is the served model name; it seeds every chain root. It must
	// equal the name the request side passes to blockkey.Root.
	Model string
	// Scheme is the block size and routing stride. BlockSize is used when an
	// event carries no block_size, and must equal vLLM's for keys to match
	// the request side. Zero value → blockkey.DefaultScheme().
	Scheme blockkey.Scheme
	// CapacityBlocks is vLLM's num_gpu_blocks, one data-parallel rank's
	// (0 = unknown: no bound). More than 2*CapacityBlocks hashes resident
	// on one rank's GPU means removals were lost: the index marks itself
	// uncertain and says so in Change.OverCapacity. Lower tiers have no
	// bound (vLLM publishes no CPU block count); StoreOnlyTTL ages them.
	CapacityBlocks int
	// OrphanLimit is the most blocks held aside waiting for a parent that
	// the index has not seen (lost events, or a replay still to come); the
	// oldest are expired first. Default 4096 (a few MiB at most); 0 →
	// default, negative → hold none (an orphan is expired at once).
	OrphanLimit int
	// StoreOnlyTTL ages out lower-tier copies (CPU, disk) of a producer
	// that never removes them: LMCache announces stores only (LMCache#5076),
	// so without an age every block it ever stored would look held. It
	// applies to a rank's tier until that tier sends a removal (vLLM's
	// native offloading does, once its tier is full), and a block's age
	// restarts with every store of it on any tier: a load from the tier
	// stores it on the GPU again, which is also when the tier's LRU renews
	// it. Default 2 min: a 200 GiB CPU tier (llm-d's tiered guide) holds
	// 1.6M tokens of an 8B model at 128 KiB a token, which new prefixes at
	// the simulator's full prefill rate (16,667 tokens/s) replace in about
	// 100 s, so an entry idle for longer may be stale under full churn,
	// while one used every two minutes stays. Set it near the tier's size
	// in tokens over the pods' prefill rate. Negative: never.
	StoreOnlyTTL time.Duration
	// TierStride is how many routing keys one lower-tier digest entry
	// stands for: lower-tier blocks enter the digest only at every
	// TierStride-th routing key (bloom's tier.go). Default 8, 512 tokens at
	// the default scheme (4 costs a CPU tier four times the GPU cache 31%
	// more upkeep than none at the same churn, 8 costs 12%: docs/tiers.md); one of 1, 2, 4, 8, 16 (bloom.TierStrideOK), other
	// values mean the default. A larger stride shrinks what a CPU tier
	// several times the GPU cache adds to the digest, at the cost of
	// matching lower tiers that much more coarsely.
	TierStride int
	// RecallLimit is how many hashes that no tier holds any more a rank
	// still remembers the key of, for a lower-tier store that names one
	// just after its GPU removal (tier.go, recall). Default 4096 (about
	// 200 KiB); negative: none.
	RecallLimit int
	// Epoch is the first epoch. A sidecar passes a value that is new per
	// process start (e.g. its start time in ns) so that its own restart
	// also changes the epoch peers see (D2). Default 0.
	Epoch uint64
}

// Defaults of Config's fields.
const (
	DefaultOrphanLimit  = 4096
	DefaultStoreOnlyTTL = 2 * time.Minute
	DefaultTierStride   = 8
	DefaultRecallLimit  = 4096
)

// MaxRanks bounds the data-parallel ranks an index keeps (a batch naming
// another is ignored and counted): bloom.MaxRanks, what a digest can say.
const MaxRanks = 256

// DefaultConfig returns a Config with vLLM's default routing scheme,
// unknown capacity and the documented defaults. Model is empty.
func DefaultConfig() Config {
	return Config{Scheme: blockkey.DefaultScheme(), OrphanLimit: DefaultOrphanLimit,
		StoreOnlyTTL: DefaultStoreOnlyTTL, TierStride: DefaultTierStride, RecallLimit: DefaultRecallLimit}
}

func (c Config) normalized() Config {
	if c.Scheme == (blockkey.Scheme{}) {
		c.Scheme = blockkey.DefaultScheme()
	}
	if c.OrphanLimit == 0 {
		c.OrphanLimit = DefaultOrphanLimit
	}
	if c.OrphanLimit < 0 {
		c.OrphanLimit = 0
	}
	if c.StoreOnlyTTL == 0 {
		c.StoreOnlyTTL = DefaultStoreOnlyTTL
	}
	switch c.TierStride {
	case 1, 2, 4, 8, 16:
	default:
		c.TierStride = DefaultTierStride
	}
	if c.RecallLimit == 0 {
		c.RecallLimit = DefaultRecallLimit
	}
	return c
}
