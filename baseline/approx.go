package baseline

import (
	"container/list"
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"
)

// ApproxConfig holds the knobs of GIE's approximate prefix-cache scorer and
// its default scheduling profile (pkg/epp/config/loader/defaults.go).
type ApproxConfig struct {
	// BlockChars is the characters per hashed block: blockSizeTokens 16
	// times 4 characters per token (default 64).
	BlockChars int
	// MaxBlocks truncates the prompt to this many blocks
	// (maxPrefixBlocksToMatch, default 256).
	MaxBlocks int
	// CapacityBlocks is a pod's LRU capacity until its scraped
	// num_gpu_blocks is known (lruCapacityPerServer, default 31250). With
	// autoTune, as here, the scraped value replaces it.
	CapacityBlocks int
	// Weights of the scorers: queue 2, kv-cache utilisation 2, prefix 3.
	QueueWeight, KVWeight, PrefixWeight float64
}

// DefaultApproxConfig returns GIE's defaults.
func DefaultApproxConfig() ApproxConfig {
	return ApproxConfig{BlockChars: 64, MaxBlocks: 256, CapacityBlocks: 31250,
		QueueWeight: 2, KVWeight: 2, PrefixWeight: 3}
}

// ApproxPrefix is GIE's approximate prefix routing: it assumes a prompt is
// cached where it was last sent. Each pod has an LRU of the block hashes of
// the requests routed to it; a pod's prefix score is its run of leading
// blocks present over the request's blocks. The pick maximises
//
//	QueueWeight*queue + KVWeight*kv + PrefixWeight*prefix
//
// with queue = (maxWaiting - waiting)/(maxWaiting - minWaiting) (1 when all
// are equal) and kv = 1 - KV usage, both from the last /metrics scrape;
// ties break at random (GIE's max-score picker shuffles first).
type ApproxPrefix struct {
	cfg ApproxConfig
	rng *rand.Rand
	lru []*blockLRU
}

// NewApproxPrefix returns the scorer for n pods; rng breaks ties. Zero
// config fields take the defaults.
func NewApproxPrefix(n int, cfg ApproxConfig, rng *rand.Rand) *ApproxPrefix {
	d := DefaultApproxConfig()
	if cfg.BlockChars <= 0 {
		cfg.BlockChars = d.BlockChars
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = d.MaxBlocks
	}
	if cfg.CapacityBlocks <= 0 {
		cfg.CapacityBlocks = d.CapacityBlocks
	}
	if cfg.QueueWeight == 0 && cfg.KVWeight == 0 && cfg.PrefixWeight == 0 {
		cfg.QueueWeight, cfg.KVWeight, cfg.PrefixWeight = d.QueueWeight, d.KVWeight, d.PrefixWeight
	}
	a := &ApproxPrefix{cfg: cfg, rng: rng, lru: make([]*blockLRU, n)}
	for i := range a.lru {
		a.lru[i] = newBlockLRU(cfg.CapacityBlocks)
	}
	return a
}

// Hashes returns the request's block hashes: h0 = xxhash(model ‖ salt),
// h_i = xxhash(block_i ‖ h_{i-1}) over full BlockChars-byte blocks of the
// input, at most MaxBlocks (GIE approximateprefix/hashing.go).
func (a *ApproxPrefix) Hashes(req Request) []uint64 {
	in := req.Input
	n := min(len(in)/a.cfg.BlockChars, a.cfg.MaxBlocks)
	out := make([]uint64, 0, n)
	prev := xxhash.Sum64String(req.Model + req.Salt)
	var d xxhash.Digest
	var buf [8]byte
	for i := range n {
		d.Reset()
		d.WriteString(in[i*a.cfg.BlockChars : (i+1)*a.cfg.BlockChars])
		binary.LittleEndian.PutUint64(buf[:], prev)
		d.Write(buf[:])
		prev = d.Sum64()
		out = append(out, prev)
	}
	return out
}

// Scores returns every pod's weighted score for the request's hashes.
func (a *ApproxPrefix) Scores(hashes []uint64, pods []Pod) []float64 {
	minQ, maxQ := pods[0].Load.Waiting, pods[0].Load.Waiting
	for _, p := range pods {
		minQ, maxQ = min(minQ, p.Load.Waiting), max(maxQ, p.Load.Waiting)
	}
	out := make([]float64, len(pods))
	for i, p := range pods {
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - p.Load.Waiting) / (maxQ - minQ)
		}
		kv := 1 - min(max(p.Load.KVUsage, 0), 1)
		prefix := 0.0
		if len(hashes) > 0 && i < len(a.lru) {
			prefix = float64(a.lru[i].prefixLen(hashes)) / float64(len(hashes))
		}
		out[i] = a.cfg.QueueWeight*queue + a.cfg.KVWeight*kv + a.cfg.PrefixWeight*prefix
	}
	return out
}

// Pick implements Policy: the max score, ties at random; the request's
// hashes are then recorded for the chosen pod (GIE's PreRequest).
func (a *ApproxPrefix) Pick(req Request, pods []Pod, _ time.Time) int {
	for i, p := range pods {
		if i < len(a.lru) && p.Load.NumGPUBlocks > 0 {
			a.lru[i].setCapacity(p.Load.NumGPUBlocks)
		}
	}
	hashes := a.Hashes(req)
	scores := a.Scores(hashes, pods)
	best, ties := 0, 0
	for i, s := range scores {
		switch {
		case s > scores[best]:
			best, ties = i, 1
		case s == scores[best]:
			ties++
			// Reservoir sampling: each tied pod wins with probability 1/ties.
			if ties > 1 && a.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < len(a.lru) {
		a.lru[best].add(hashes)
	}
	return best
}

// blockLRU is one pod's routing history: a set of block hashes with LRU
// eviction, as GIE keeps with golang-lru.
type blockLRU struct {
	capacity int
	order    *list.List // front: most recent; values are uint64
	at       map[uint64]*list.Element
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: capacity, order: list.New(), at: make(map[uint64]*list.Element)}
}

// prefixLen counts the leading hashes present; it does not touch recency.
func (l *blockLRU) prefixLen(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := l.at[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// add inserts or refreshes hashes, evicting the least recent past capacity.
func (l *blockLRU) add(hashes []uint64) {
	for _, h := range hashes {
		if e, ok := l.at[h]; ok {
			l.order.MoveToFront(e)
			continue
		}
		l.at[h] = l.order.PushFront(h)
	}
	l.evict()
}

func (l *blockLRU) setCapacity(c int) {
	if c != l.capacity {
		l.capacity = c
		l.evict()
	}
}

func (l *blockLRU) evict() {
	for l.order.Len() > l.capacity {
		e := l.order.Back()
		delete(l.at, e.Value.(uint64))
		l.order.Remove(e)
	}
}

func (l *blockLRU) len() int { return l.order.Len() }
