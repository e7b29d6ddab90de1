package vllmsim

import (
	"container/list"
	"fmt"

	"github.com/kvroute/kvroute/kvevent"
)

// Offload backends (vLLM's --kv-offloading-backend).
const (
	// OffloadNative is vLLM's OffloadingConnector: BlockStored and
	// BlockRemoved with medium "CPU", no tokens, no parent, block_size 0,
	// naming the GPU block hashes (vllm/v1/kv_offload).
	OffloadNative = "native"
	// OffloadLMCache is LMCache's MP connector: BlockStored with medium
	// "CPU" (canonical since LMCache#5076) and never a BlockRemoved.
	OffloadLMCache = "lmcache"
)

// Offload configures the CPU tier behind the GPU cache. The zero value has
// no tier, as vLLM without --kv-offloading-backend.
type Offload struct {
	Backend string // "", OffloadNative or OffloadLMCache
	Blocks  int    // tier capacity in blocks (--kv-offloading-size / bytes per block)
}

func (o Offload) validate() error {
	switch o.Backend {
	case "":
		return nil
	case OffloadNative, OffloadLMCache:
		if o.Blocks < 1 {
			return fmt.Errorf("config: offload blocks %d < 1", o.Blocks)
		}
		return nil
	}
	return fmt.Errorf("config: offload backend %q: want native or lmcache", o.Backend)
}

var cpu = "CPU"

// tier is the host-memory copy of evicted GPU blocks: an LRU of hashes.
// The simulator keeps no KV, only which hashes a load would find.
type tier struct {
	backend string
	cap     int
	lru     *list.List // front is most recent; values are digest
	at      map[digest]*list.Element
}

func newTier(o Offload) *tier {
	if o.Backend == "" {
		return nil
	}
	return &tier{backend: o.Backend, cap: o.Blocks, lru: list.New(), at: make(map[digest]*list.Element)}
}

// has reports whether h is in the tier and, if so, makes it most recent
// (a load reads it).
func (t *tier) has(h digest) bool {
	e, ok := t.at[h]
	if ok {
		t.lru.MoveToFront(e)
	}
	return ok
}

// put stores h as the GPU evicts it, appending the events the backend
// sends: BlockStored (CPU) for a new copy and, natively, BlockRemoved (CPU)
// for each least recently used hash it pushes out. A hash already held is
// only refreshed: the offload manager skips blocks it has stored.
func (t *tier) put(h digest, events []kvevent.Event) []kvevent.Event {
	if e, ok := t.at[h]; ok {
		t.lru.MoveToFront(e)
		return events
	}
	for t.lru.Len() >= t.cap {
		old := t.lru.Remove(t.lru.Back()).(digest)
		delete(t.at, old)
		if t.backend == OffloadNative {
			events = append(events, kvevent.Event{
				Kind:        kvevent.BlockRemoved,
				Tag:         kvevent.BlockRemoved.String(),
				BlockHashes: []uint64{old.wire()},
				Medium:      &cpu,
			})
		}
	}
	t.at[h] = t.lru.PushFront(h)
	return append(events, kvevent.Event{
		Kind:        kvevent.BlockStored,
		Tag:         kvevent.BlockStored.String(),
		BlockHashes: []uint64{h.wire()},
		TokenIDs:    []uint32{},
		Medium:      &cpu,
	})
}

// clear empties the tier without events (reset_prefix_cache drops the GPU
// cache; the simulator drops the tier with it so a reset leaves no hit).
func (t *tier) clear() {
	t.lru.Init()
	clear(t.at)
}

func (t *tier) len() int { return t.lru.Len() }
