package kvevent

// Kind says which vLLM event class an Event is.
type Kind uint8

const (
	// Unknown is an event whose tag this decoder does not know; it is
	// skipped by consumers and counted.
	Unknown Kind = iota
	// BlockStored: new full blocks entered a cache tier.
	BlockStored
	// BlockRemoved: blocks were evicted from a cache tier.
	BlockRemoved
	// AllBlocksCleared: the whole prefix cache was reset.
	AllBlocksCleared
)

// String returns vLLM's class name for k (the wire tag).
func (k Kind) String() string {
	if s := k.spec(); s != nil {
		return s.tag
	}
	return "Unknown"
}

// Event is one vLLM KV-cache event. Fields that a wire generation does not
// carry are left at their zero value; the pointer fields distinguish an
// absent or nil value from an empty one where consumers care.
type Event struct {
	Kind Kind
	// Tag is the raw tag string as received (equal to Kind.String() for
	// known kinds; the original text for Unknown).
	Tag string

	// BlockHashes are vLLM's block hashes folded to 64 bits: ints as sent,
	// byte strings as their last 8 bytes read big-endian (docs/reference/vllm-interface.md §2.5).
	BlockHashes []uint64
	// Parent is the hash of the block before BlockHashes[0]; nil when the
	// chain starts at token 0 (absent, nil or 0 on the wire).
	Parent *uint64
	// TokenIDs are the tokens of the stored blocks (BlockStored only). Empty
	// for offload-connector events that are not GPU-resident.
	TokenIDs []uint32
	// BlockSize is tokens per block (BlockStored only).
	BlockSize int
	// LoRAID is the deprecated integer adapter id.
	LoRAID *int64
	// Medium is "GPU", "CPU", ... or nil when not sent.
	Medium *string
	// LoRAName is the adapter name that enters vLLM's hash, or nil.
	LoRAName *string
	// GroupIdx is the KV-cache group (hybrid models), or nil.
	GroupIdx *int64
	// ExtraKeys are vLLM's per-block extra hash inputs (BlockStored only;
	// docs/reference/vllm-interface.md §4.2): one entry per stored block, each the tuple
	// of keys for that block (LoRA name, multimodal ids, cache salt on the
	// block at token 0, ...) or nil when the block has none. The outer
	// slice is nil when the event does not carry the field. Entries hold
	// string, []byte, bool, int64 (uint64 only above MaxInt64), float64,
	// []any and map[string]any values.
	ExtraKeys [][]any
	// KVCacheSpecKind is the group's attention kind, e.g.
	// "full_attention" (BlockStored only), or nil.
	KVCacheSpecKind *string
	// KVCacheSpecSlidingWindow is the group's window in tokens for
	// sliding-window kinds (BlockStored only), or nil.
	KVCacheSpecSlidingWindow *int64
	// Locality is sent by the newest vLLM; its meaning is not documented
	// yet, so it is kept as sent, or nil.
	Locality *string
}

// Batch is one published message: the events of one engine step.
type Batch struct {
	// Topic is frame 0 of the ZMQ message (may be empty).
	Topic string
	// Seq is frame 1: the publisher's sequence number, starting at 0 for
	// each publisher process.
	Seq uint64
	// TS is the batch timestamp in wall-clock seconds (time.time()).
	TS float64
	// Events in the order vLLM emitted them; apply sequentially.
	Events []Event
	// DPRank is the data-parallel rank, or nil when the batch omits it.
	DPRank *int64
}

// Encoding selects a wire generation for the encoder.
type Encoding uint8

const (
	// ArrayEncoding is vLLM before PR #42892: events are positional arrays
	// with the tag first.
	ArrayEncoding Encoding = iota
	// MapEncoding is vLLM since PR #42892 (v0.26+): events are maps with a
	// "type" key; the outer batch stays a positional array.
	MapEncoding
)
