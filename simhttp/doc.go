// Package simhttp is the vLLM simulator's HTTP layer: vLLM's API in front
// of a simulated engine core (package vllmsim), so that kvroute's sidecar,
// benchmarks and tests talk to it as to `vllm serve`. cmd/vllm-sim wires
// it to flags, engines and KV-event publishers.
//
// Use:
//
//	cfg := simhttp.DefaultConfig()
//	cfg.Models, cfg.MaxModelLen = []string{"m"}, 4096
//	srv := simhttp.New(cfg, engine, engine.Tokenizer(), publisher, simhttp.NewMetrics("m", stats, info))
//	http.Serve(ln, srv.Handler())
//	srv.SetDraining() // on SIGTERM: /health turns 503
//
// Endpoints, each following the vLLM source named in its file (revisions
// in the comments):
//
//	POST /v1/chat/completions   chat.go: OpenAI chat, streaming too; text and
//	                            image parts (image_url, Responses' input_image;
//	                            an image is named by its uuid or the content hash
//	                            of its URL and placed on the engine request)
//	POST /v1/completions        completions.go: a string, token ids, or a batch
//	                            (a list of strings or of token-id lists): one engine
//	                            request per prompt, choices indexed by prompt, usage
//	                            summed
//	POST /v1/messages           messages.go: Anthropic Messages as vLLM serves it,
//	                            converted to chat by prompt.ParseAPI (the sidecar's
//	                            rule too); vLLM's answer and event stream
//	POST /v1/responses          responses.go: OpenAI Responses (simple path);
//	GET  /v1/responses/{id}     store.go: the store, off unless
//	POST /v1/responses/{id}/cancel   VLLM_ENABLE_RESPONSES_API_STORE=1 (Config.ResponsesStore),
//	                            in this process's memory, bounded; background mode
//	POST /v1/{chat/completions,completions,messages,responses}/render
//	                            render.go: vLLM's GenerateRequest (token ids, image
//	                            features), only with Config.ScaleOut (vLLM v0.30's
//	                            --enable-scale-out)
//	POST /tokenize, /detokenize tokenize.go: both /tokenize variants; a chat's ids
//	                            are generation's, images included
//	GET  /v1/models, /health, /metrics; POST /reset_prefix_cache;
//	POST /v1/{load,unload}_lora_adapter (Config.RuntimeLoRA)   server.go, lora.go, metrics.go
//	GET  /sim/cache, POST /sim/restart, GET|POST /sim/drop-rate
//	                            the simulator's own: the engine's cached blocks (ground
//	                            truth), a vLLM restart (cache, adapters loaded at run
//	                            time and stored responses gone, /health 503 a while),
//	                            the KV-event drop rate
//
// Every generation answer carries the simulator's timing: a "sim" member
// (simulated seconds of arrival, first token, finish) where the answer or
// its final event has usage, and the X-Sim-* headers (ServiceHeader,
// ReadHeader, StartHeader). Every API's usage reports the engine's prefix
// cache hit (chat and completions: prompt_tokens_details.cached_tokens;
// Messages: cache_read_input_tokens; Responses:
// input_tokens_details.cached_tokens), which vLLM reports only with
// --enable-prompt-tokens-details.
//
// Errors take each API's shape: OpenAI's {"error":{...}} everywhere but
// /v1/messages, whose route answers Anthropic's {"type":"error",...}; a
// body that fails validation gets vLLM's app-wide pydantic-style 400.
package simhttp
