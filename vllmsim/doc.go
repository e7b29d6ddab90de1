// Package vllmsim is a simulated vLLM engine: the scheduler, the prefix
// cache and the clock of one vLLM process, without a GPU. cmd/vllm-sim puts
// vLLM's HTTP API and ZMQ KV events in front of it.
//
// What is faithful to vLLM (v1 engine; docs/reference/vllm-interface.md §3, §4, §7):
//   - The KV cache: NumGPUBlocks blocks of BlockSize tokens; only full blocks
//     are hashed and cached, prompt and generated tokens alike; a request
//     reuses the longest cached prefix of its block hashes, at most
//     (n-1)//BlockSize blocks; blocks of running requests are pinned; free
//     blocks form one queue, allocation pops its head (evicting a cached
//     block there, one BlockRemoved each), finished requests append their
//     blocks tail first, freed uncached blocks go to the head. Cached chains
//     therefore stay prefix-closed. Two requests that compute the same
//     prefix at once hold two copies (two BlockStored, later two
//     BlockRemoved).
//   - Block hashes: sha256 over canonical CBOR of (parent, tokens, extra)
//     with NONE_HASH from PYTHONHASHSEED or random per process; extra is
//     the LoRA name on every block, then the ID of each image whose
//     placeholder tokens overlap the block, then cache_salt on the first
//     block. Events carry the last 8 bytes and, per block, those extra keys
//     (None for a block without any), as vLLM does since #33304.
//   - Images (ChatMM, Request.MM): rendered as Qwen2-VL's
//     <|vision_start|><|image_pad|>*N<|vision_end|>; the simulator never
//     looks at the pixels, an image is its ID.
//   - The scheduler: continuous batching under MaxNumSeqs and a per-step
//     token budget with chunked prefill, FCFS admission that waits for free
//     blocks, and recompute preemption of the most recently scheduled
//     request when a running one cannot grow. One difference: decoding
//     sequences take their token from the budget before running prefills
//     continue.
//
// Time is simulated: a step costs Timing.StepOverhead plus PrefillPerToken
// per uncached token computed plus DecodePerSeq per decoding sequence
// (defaults and sources in timing.go), and the loop sleeps that long divided
// by TimeScale. So a request alone with u uncached prompt tokens gets its
// first token after ceil(u/MaxNumBatchedTokens) steps, and a prefix hit
// shows up as a shorter time to first token. Output carries sim timestamps.
//
// Use:
//
//	e, err := vllmsim.New(cfg)          // cfg from DefaultConfig, EventSink set
//	go e.Run(ctx)                       // the step loop; exits when ctx ends
//	st, err := e.Submit(reqCtx, vllmsim.Request{ID: id, PromptTokens: ids, MaxTokens: 64})
//	for o := range st.C { ... }         // one Output per step that produced a token; the last has Done
//
// EventSink is called from the step loop with one step's events, in
// vLLM's order (removals from allocation before the stores of the same
// request); it must not block for long.
package vllmsim
