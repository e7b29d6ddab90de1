package kvindex

import "github.com/kvroute/kvroute/blockkey"

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
	// CapacityBlocks is vLLM's num_gpu_blocks (0 = unknown: no bound).
	// More than 2*CapacityBlocks resident hashes means removals were lost:
	// the index marks itself uncertain and says so in Change.OverCapacity.
	CapacityBlocks int
	// OrphanLimit is the most blocks held aside waiting for a parent that
	// the index has not seen (lost events, or a replay still to come); the
	// oldest are expired first. Default 4096 (a few MiB at most); 0 →
	// default, negative → hold none (an orphan is expired at once).
	OrphanLimit int
	// Epoch is the first epoch. A sidecar passes a value that is new per
	// process start (e.g. its start time in ns) so that its own restart
	// also changes the epoch peers see (D2). Default 0.
	Epoch uint64
}

// DefaultOrphanLimit is the default Config.OrphanLimit.
const DefaultOrphanLimit = 4096

// DefaultConfig returns a Config with vLLM's default block size, a key per
// block, unknown capacity and the default orphan limit. Model is empty.
func DefaultConfig() Config {
	return Config{Scheme: blockkey.DefaultScheme(), OrphanLimit: DefaultOrphanLimit}
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
	return c
}
