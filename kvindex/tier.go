package kvindex

import (
	"strings"

	"github.com/kvroute/kvroute/blockkey"
)

// Tier is where vLLM holds a copy of a block: its GPU prefix cache or a
// lower tier a KV connector offloads to. The values are bloom's tier
// numbers (bloom.TierGPU, ...), which cachestate relies on.
type Tier uint8

const (
	GPU  Tier = iota // vLLM's GPU prefix cache
	CPU              // host memory: native offloading, LMCache's CPU backend
	Disk             // local or shared storage, and any medium not known
	numTiers
)

// String returns the tier's name as metrics and /debug pages show it.
func (t Tier) String() string {
	switch t {
	case GPU:
		return "GPU"
	case CPU:
		return "CPU"
	case Disk:
		return "Disk"
	}
	return "unknown"
}

// TierOf names the tier of an event's medium, case-insensitively (api-
// and-tiers §3.1): absent, empty or "GPU" is the GPU (vLLM before #19737
// sends none; llm-d defaults an empty one to gpu); "CPU" and Dynamo's
// "CPU_TIER1" are host memory; "Disk", "SHARED_STORAGE" (llm-d's file
// system backend), "STORAGE", "CPU_TIER2" and anything else are a tier
// below: an unknown medium is never taken for the GPU, and is credited
// least.
func TierOf(medium *string) Tier {
	if medium == nil {
		return GPU
	}
	switch m := *medium; {
	case m == "", strings.EqualFold(m, "GPU"):
		return GPU
	case strings.EqualFold(m, "CPU"), strings.EqualFold(m, "CPU_TIER1"):
		return CPU
	}
	return Disk
}

// Entry is one digest entry: a routing key and where it is held. A key
// held on a rank's GPU is a GPU entry whatever else holds it; a lower-tier
// entry exists only at Config.TierStride positions (bloom's tier.go says
// why).
type Entry struct {
	Key  blockkey.Key
	Tier Tier
	Rank int
}

// recall remembers the keys of the last hashes no tier holds any more, so
// that a hash-only store naming one still resolves: vLLM publishes the GPU
// cache's events of a step before its connector's, so a block evicted from
// the GPU and offloaded in the same step arrives as a GPU removal followed
// by the CPU store.
type recall struct {
	at   map[uint64]recalled
	ring []uint64
	next int
}

type recalled struct {
	key  blockkey.Key
	pos  int32
	slot int32 // position in ring, so an overwritten slot forgets only its own hash
}

func newRecall(limit int) recall {
	if limit <= 0 {
		return recall{}
	}
	return recall{at: make(map[uint64]recalled), ring: make([]uint64, 0, limit)}
}

func (r *recall) put(h uint64, k blockkey.Key, pos int32) {
	if cap(r.ring) == 0 {
		return
	}
	if len(r.ring) < cap(r.ring) {
		r.at[h] = recalled{k, pos, int32(len(r.ring))}
		r.ring = append(r.ring, h)
		return
	}
	old := r.ring[r.next]
	if x, ok := r.at[old]; ok && int(x.slot) == r.next {
		delete(r.at, old)
	}
	r.ring[r.next] = h
	r.at[h] = recalled{k, pos, int32(r.next)}
	r.next = (r.next + 1) % len(r.ring)
}

func (r *recall) get(h uint64) (recalled, bool) {
	x, ok := r.at[h]
	return x, ok
}

func (r *recall) reset() {
	clear(r.at)
	r.ring, r.next = r.ring[:0], 0
}
