package vllmsim

// This file is the contract between the engine (this package) and its HTTP
// and ZMQ edge (cmd/vllm-sim): its types, plus Engine (engine.go), Tokenizer
// (tokenizer.go) and DefaultConfig (timing.go). Signatures change only
// together with the edge.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// Errors returned by Submit. The HTTP edge maps them to vLLM's status codes.
var (
	// ErrTooLong: prompt plus max_tokens exceeds MaxModelLen (vLLM: 400).
	ErrTooLong = errors.New("prompt exceeds max model length")
	// ErrStopped: the engine is not running (restarting or shut down; 503).
	ErrStopped = errors.New("engine stopped")
	// ErrInvalid: empty prompt or MaxTokens < 1 (vLLM: 400).
	ErrInvalid = errors.New("invalid request")
)

// Request is one generation request as the engine sees it: token ids in.
type Request struct {
	ID           string
	PromptTokens []uint32
	MaxTokens    int
	// LoRA is the adapter name ("" for the base model); it enters the
	// block hash as vLLM's extra key.
	LoRA string
	// LoRAID is the adapter's integer id (vLLM's lora_int_id, 1-based in
	// load order); BlockStored carries it as the deprecated lora_id. 0 sends
	// none.
	LoRAID int64
	// CacheSalt enters the hash of the first block only (vLLM semantics).
	CacheSalt string
	// MM are the prompt's image placements (from ChatMM). Blocks
	// overlapping an image carry its ID in their hash extras and in
	// BlockStored's extra_keys.
	MM []MMPlacement
}

// Usage is what vLLM reports in the response's usage object.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is the prefix-cache hit actually used
	// (usage.prompt_tokens_details.cached_tokens).
	CachedTokens int
}

// Output is one step's output for one request, delivered in order on
// Stream.C. The last Output has Done set; the channel is then closed.
type Output struct {
	Tokens []uint32 // tokens generated in this step (may be empty)
	Done   bool
	// FinishReason is "length" or "stop" when Done, "abort" on cancel/restart.
	FinishReason string
	Usage        Usage // final figures when Done; PromptTokens/CachedTokens set from the first output on
	// Sim timestamps: seconds of simulated time since engine start.
	ArrivalSim    float64
	FirstTokenSim float64 // 0 until the first token
	NowSim        float64
}

// Stream delivers a request's outputs. C is closed after the Done output.
type Stream struct {
	C <-chan Output
}

// Stats are the engine's current load and counters (for /metrics).
type Stats struct {
	Running, Waiting      int
	KVUsage               float64 // used blocks / total blocks, 0..1
	NumGPUBlocks          int
	BlockSize             int
	PrefixQueriesTokens   uint64 // vllm:prefix_cache_queries
	PrefixHitsTokens      uint64 // vllm:prefix_cache_hits
	PromptTokensTotal     uint64
	GenerationTokensTotal uint64
	RequestsFinishedTotal uint64
	Preemptions           uint64
	// ExternalQueriesTokens and ExternalHitsTokens are the CPU tier's
	// lookups past the GPU hit and its loads, in tokens
	// (vllm:external_prefix_cache_queries and _hits); 0 without a tier.
	ExternalQueriesTokens uint64
	ExternalHitsTokens    uint64
	CPUBlocks             int // blocks held by the CPU tier
}

// CachedBlock is one physical cached block (ground truth for tests).
type CachedBlock struct {
	Hash   uint64 // wire form (last 8 bytes of the digest, big-endian)
	Parent *uint64
	Tokens []uint32
	LoRA   string
	// Extra are the block's extra hash keys in vLLM's order (LoRA name,
	// image IDs, salt), nil when none.
	Extra  []string
	Copies int // physical copies holding this hash
}

// Timing is the simulated cost model; all durations are simulated time.
type Timing struct {
	StepOverhead    time.Duration // fixed cost of one scheduler step
	PrefillPerToken time.Duration // per uncached prompt token computed in a step
	DecodePerSeq    time.Duration // per running sequence decoding one token in a step
	// LoadPerToken is the host-to-device copy of one token's KV from the
	// CPU tier, charged to the step that admits the request.
	LoadPerToken time.Duration
}

// Config of the engine. DefaultConfig documents the defaults.
type Config struct {
	Model               string
	BlockSize           int
	NumGPUBlocks        int
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	// HashAlgo is "sha256_cbor" (vLLM-exact) or "fast" (cheap, same chaining).
	HashAlgo string
	// HashSeed is PYTHONHASHSEED; when HashSeedSet is false the seed is
	// random per engine (per restart), as in vLLM.
	HashSeed    string
	HashSeedSet bool
	Timing      Timing
	// TimeScale > 1 runs the simulated clock faster than real time.
	TimeScale float64
	// TokenizerMemoBytes bounds the tokenizer's remembered encodings of
	// long texts (0: none): the simulator's own CPU, no simulated time.
	TokenizerMemoBytes int
	// ImageTokens is how many placeholder tokens the engine's tokenizer
	// renders per image (0: DefaultImageTokens).
	ImageTokens int
	// EventSink receives each step's KV events, in order, from the step
	// loop. It must not block for long (the publisher queues).
	EventSink func(ts float64, events []kvevent.Event)
	// Offload is the CPU tier (none by default).
	Offload Offload
}

// Message is one chat message as /v1/chat/completions and /tokenize take it.
// Content is the text; when Parts is non-nil the content is Parts instead
// and Content is ignored.
type Message struct {
	Role    string
	Content string
	Parts   []Part
}

// Part is one piece of a message's content, in order.
type Part struct {
	Text  string
	Image *Image // set for an image part (Text ignored)
}

// Image is one image of a prompt. The simulator never decodes it.
type Image struct {
	// ID is the identifier vLLM hashes it by: the request's uuid when the
	// caller gave one, else a hash of its content (the simulator's:
	// ContentID(url)).
	ID string
}

// ContentID is the simulator's content hash of an image given by URL or
// data URL: hex sha256 of the string. vLLM hashes the decoded pixels; any
// stable content hash routes the same.
func ContentID(url string) string {
	h := sha256.Sum256([]byte(url))
	return hex.EncodeToString(h[:])
}

// MMPlacement is where one image's placeholder tokens sit in a prompt
// (vLLM's mm_placeholders: offset and length in tokens) and its identifier
// (vLLM's mm_hashes entry).
type MMPlacement struct {
	ID     string `json:"id"`
	Offset int    `json:"offset"`
	Length int    `json:"length"`
}

// ChatTemplate is the chat template a simulated model renders with.
type ChatTemplate int

const (
	// ChatML is Qwen's: "<|im_start|>role\ncontent<|im_end|>\n" per message.
	ChatML ChatTemplate = iota
	// Llama3 is Llama 3.1's: a system block always first, then headed
	// turns closed by <|eot_id|>.
	Llama3
)

// ParseChatTemplate reads a template's name: chatml or llama3.
func ParseChatTemplate(name string) (ChatTemplate, error) {
	switch name {
	case "chatml":
		return ChatML, nil
	case "llama3":
		return Llama3, nil
	}
	return 0, fmt.Errorf("chat template %q: want chatml or llama3", name)
}

// ChatOptions mirror vLLM's chat rendering fields.
type ChatOptions struct {
	// Template is the model's chat template (the server's, not a request's).
	Template             ChatTemplate
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// Tools is the raw JSON of the tools array (rendered into the system
	// turn), or nil.
	Tools []byte
}
