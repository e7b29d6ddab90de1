package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/simhttp"
	"github.com/kvroute/kvroute/vllmclient"
	"github.com/kvroute/kvroute/vllmsim"
)

// options are the parsed command line: vLLM's flag names plus --sim-*.
// Zero engine sizes mean "the engine's default".
type options struct {
	Host         string
	Port         int
	Models       []string // --served-model-name
	Model        string   // --model
	BlockSize    int
	NumGPUBlocks int
	MaxNumSeqs   int
	MaxBatched   int
	MaxModelLen  int
	HashAlgo     string // normalised: "sha256_cbor" or "fast"
	HashSeed     string
	HashSeedSet  bool
	Events       kvEventsConfig
	LoRAs        []simhttp.LoRA
	RuntimeLoRA  bool // VLLM_ALLOW_RUNTIME_LORA_UPDATING: serve /v1/load_lora_adapter and /v1/unload_lora_adapter
	// ScaleOut is --enable-scale-out or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1:
	// serve the render endpoints, as vLLM v0.30 does only then.
	ScaleOut bool
	// ResponsesStore is VLLM_ENABLE_RESPONSES_API_STORE=1: keep Responses.
	ResponsesStore bool
	StoreLimit     int // --sim-responses-store-limit
	DataParallel   int // --data-parallel-size: engine cores, each with its own cache and publisher
	// CPU tier: --kv-offloading-backend (native or lmcache) and
	// --kv-offloading-size in GiB (0: no tier); --sim-kv-bytes-per-block
	// (0: the model's, vllmsim.KVBytesPerToken × block size).
	OffloadBackend  string
	OffloadGiB      float64
	KVBytesPerBlock int
	TimeScale       float64
	Encoding        kvevent.Encoding
	DropRate        float64
	Seed            int64
	Echo            bool
	RestartDown     time.Duration
	ShutdownWait    time.Duration
	BodyLimitBytes  int64
	// Tokenization charge (vllmsim.TokenizeCost): us per token, workers.
	TokenizeUS      float64
	TokenizeWorkers int
	TokenizeMemoMiB int // the simulator's remembered encodings (its own CPU, no simulated time)
	ChatTemplate    vllmsim.ChatTemplate
}

// kvEventsConfig is vLLM's --kv-events-config JSON (KVEventsConfig in vLLM's
// vllm/config/kv_events.py).
type kvEventsConfig struct {
	Enable         bool    `json:"enable_kv_cache_events"`
	Publisher      *string `json:"publisher"`
	Endpoint       string  `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	BufferSteps    int     `json:"buffer_steps"`
	HWM            int     `json:"hwm"`
	MaxQueueSize   int     `json:"max_queue_size"`
	Topic          string  `json:"topic"`
}

// publishing reports whether events go out over ZMQ: publisher "zmq", or
// unset (None) with events enabled, as current vLLM resolves it.
func (k kvEventsConfig) publishing() bool {
	if k.Publisher == nil {
		return k.Enable
	}
	return k.Enable && *k.Publisher == "zmq"
}

func parseKVEventsConfig(s string) (kvEventsConfig, error) {
	d := defaultPubConfig()
	k := kvEventsConfig{Endpoint: d.Endpoint, BufferSteps: d.BufferSteps, HWM: d.HWM, MaxQueueSize: d.MaxQueueSize}
	if s == "" {
		return k, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		return k, fmt.Errorf("--kv-events-config: %w", err)
	}
	if k.Publisher != nil && *k.Publisher != "zmq" && *k.Publisher != "null" {
		return k, fmt.Errorf("--kv-events-config: publisher %q is not zmq or null", *k.Publisher)
	}
	if k.BufferSteps <= 0 || k.MaxQueueSize <= 0 || k.HWM < 0 {
		return k, errors.New("--kv-events-config: buffer_steps and max_queue_size must be positive, hwm non-negative")
	}
	return k, nil
}

// hashAlgos maps --prefix-caching-hash-algo values to the engine's two
// modes. vLLM's "sha256" hashes pickled tuples, which only Python can
// reproduce; the simulator treats it as sha256_cbor (it is vLLM's default,
// so it must be accepted). xxhash variants map to the cheap mode.
var hashAlgos = map[string]string{
	"sha256": "sha256_cbor", "sha256_cbor": "sha256_cbor", "sha256_cbor_64bit": "sha256_cbor",
	"fast": "fast", "xxhash": "fast", "xxhash_cbor": "fast", "builtin": "fast",
}

// multiValue are the flags vLLM takes as nargs="+".
var multiValue = map[string]bool{"served-model-name": true, "lora-modules": true}

// expandMulti rewrites `--name a b c` into `--name a --name b --name c` for
// the multi-value flags, since package flag takes one value per flag.
func expandMulti(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") || strings.Contains(name, "=") || !multiValue[name] {
			out = append(out, a)
			continue
		}
		j := i + 1
		for ; j < len(args) && !strings.HasPrefix(args[j], "-"); j++ {
			out = append(out, "--"+name, args[j])
		}
		if j == i+1 {
			out = append(out, a) // let flag report the missing value
		}
		i = j - 1
	}
	return out
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseLoRA accepts vLLM's two forms: name=path and a JSON object.
func parseLoRA(s string) (simhttp.LoRA, error) {
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		var j struct {
			Name string `json:"name"`
			Path string `json:"path"`
			Base string `json:"base_model_name"`
		}
		if err := json.Unmarshal([]byte(s), &j); err != nil || j.Name == "" || j.Path == "" {
			return simhttp.LoRA{}, fmt.Errorf("--lora-modules %q: want name=path or {\"name\":..,\"path\":..}", s)
		}
		return simhttp.LoRA{Name: j.Name, Path: j.Path, Base: j.Base}, nil
	}
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return simhttp.LoRA{}, fmt.Errorf("--lora-modules %q: want name=path", s)
	}
	return simhttp.LoRA{Name: name, Path: path}, nil
}

// parseFlags parses args (without the program name); getenv supplies
// PYTHONHASHSEED and vLLM's VLLM_* switches. --help and --version print to stdout and return
// cli.ErrDone; a flag error is printed to stderr with the usage. It never
// exits the process.
func parseFlags(args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) (options, error) {
	// The engine's modelled model, so --model can be omitted.
	defaultModel := vllmsim.DefaultConfig().Model
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	cli.Usage(fs, "vllm-sim [flags] [MODEL]",
		"A stand-in for `vllm serve` where no GPU is available: vLLM's OpenAI API (streaming too),\n"+
			"/tokenize, /metrics and /health, and KV-cache events over ZMQ with vLLM's framing and replay\n"+
			"socket, from a simulated engine whose KV cache, scheduler and timing behave like vLLM's.\n"+
			"Flags use vLLM's names; simulator-only flags start with --sim-. /sim/* injects faults.")
	var o options
	var names, loras listFlag
	var kvCfg, algo, enc, tmpl string
	fs.StringVar(&o.Host, "host", "", "bind address (vLLM: all interfaces)")
	fs.IntVar(&o.Port, "port", 8000, "HTTP port (0: OS-chosen, logged)")
	fs.Var(&names, "served-model-name", "model name(s) served (default: --model)")
	fs.StringVar(&o.Model, "model", defaultModel, "model path, reported as the ModelCard root")
	fs.IntVar(&o.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&o.NumGPUBlocks, "num-gpu-blocks-override", 0, "KV cache capacity in blocks (0: engine default)")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", 0, "max running sequences (0: engine default)")
	fs.IntVar(&o.MaxBatched, "max-num-batched-tokens", 0, "token budget per step (0: engine default)")
	fs.IntVar(&o.MaxModelLen, "max-model-len", 0, "context length (0: engine default)")
	fs.StringVar(&algo, "prefix-caching-hash-algo", "sha256", "sha256 | sha256_cbor | fast (xxhash, xxhash_cbor map to fast)")
	fs.StringVar(&kvCfg, "kv-events-config", "", `vLLM KVEventsConfig JSON, e.g. {"enable_kv_cache_events":true,"endpoint":"tcp://*:5557"}; as vLLM, the PUB socket binds a tcp://* or ipc:// endpoint and connects to tcp://HOST:PORT`)
	fs.Bool("enable-prompt-tokens-details", false, "accepted; cached_tokens is always reported")
	fs.Var(&loras, "lora-modules", "LoRA adapters: name=path or JSON, one or more")
	fs.BoolVar(&o.ScaleOut, "enable-scale-out", false, "serve the render endpoints (/v1/{chat/completions,completions,messages,responses}/render), as vLLM >= 0.30 does only with this flag or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1")
	fs.IntVar(&o.StoreLimit, "sim-responses-store-limit", simhttp.DefaultConfig().StoreLimit, "responses kept with VLLM_ENABLE_RESPONSES_API_STORE=1, the oldest dropped past it (vLLM keeps every one)")
	fs.IntVar(&o.DataParallel, "data-parallel-size", 1, "data-parallel ranks: one engine core, KV cache and event publisher each (rank r publishes on the endpoint's port + r)")
	fs.StringVar(&o.OffloadBackend, "kv-offloading-backend", vllmsim.OffloadNative, "CPU tier behind the GPU cache when --kv-offloading-size is set: native (CPU stores and removals, hash-only) or lmcache (stores only)")
	fs.Float64Var(&o.OffloadGiB, "kv-offloading-size", 0, "CPU tier size in GiB (0: no offloading)")
	fs.IntVar(&o.KVBytesPerBlock, "sim-kv-bytes-per-block", 0, "KV bytes per block, sizing the CPU tier and its load time (0: the simulated model's, 128 KiB per token × --block-size)")
	fs.Float64Var(&o.TimeScale, "sim-time-scale", 1, "simulated seconds per wall second")
	fs.StringVar(&enc, "kv-events-encoding", "map", "event wire encoding: map (vLLM >= 0.26) or array")
	fs.Float64Var(&o.DropRate, "sim-drop-rate", 0, "fraction of event batches not sent live (still replayable)")
	fs.Int64Var(&o.Seed, "sim-seed", 1, "seed for drop injection")
	fs.BoolVar(&o.Echo, "sim-echo", false, "output text repeats the prompt")
	fs.DurationVar(&o.RestartDown, "sim-restart-downtime", 2*time.Second, "how long /health is 503 after /sim/restart")
	fs.DurationVar(&o.ShutdownWait, "sim-shutdown-timeout", 10*time.Second, "grace period for open requests on SIGTERM")
	fs.Int64Var(&o.BodyLimitBytes, "sim-body-limit-bytes", 32<<20, "max request body size")
	fs.Float64Var(&o.TokenizeUS, "sim-tokenize-us-per-token", float64(vllmsim.DefaultTokenizeCost)/1e3, "wall time charged per prompt token tokenized (/tokenize, render, text prompts); 0: free")
	fs.StringVar(&tmpl, "sim-chat-template", "chatml", "the model's chat template: chatml (Qwen's) or llama3 (Llama 3.1's: a system block always first)")
	fs.IntVar(&o.TokenizeWorkers, "sim-tokenize-workers", vllmsim.DefaultTokenizeWorkers, "tokenizations that run at once (vLLM: one thread per API server)")
	fs.IntVar(&o.TokenizeMemoMiB, "sim-tokenize-memo-mib", 64, "MiB of remembered encodings of long texts: spares this machine's CPU, charges the same time; 0: encode every time")
	if err := cli.Parse(fs, expandMulti(args), stdout, stderr); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		// vLLM accepts `vllm serve MODEL`; so do we.
		if fs.NArg() > 1 || o.Model != defaultModel {
			return o, fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		o.Model = fs.Arg(0)
	}
	o.Models = names
	if len(o.Models) == 0 {
		o.Models = []string{o.Model}
	}
	for _, l := range loras {
		lr, err := parseLoRA(l)
		if err != nil {
			return o, err
		}
		o.LoRAs = append(o.LoRAs, lr)
	}
	var ok bool
	if o.HashAlgo, ok = hashAlgos[algo]; !ok {
		return o, fmt.Errorf("--prefix-caching-hash-algo %q: want sha256, sha256_cbor or fast", algo)
	}
	switch enc {
	case "map":
		o.Encoding = kvevent.MapEncoding
	case "array":
		o.Encoding = kvevent.ArrayEncoding
	default:
		return o, fmt.Errorf("--kv-events-encoding %q: want map or array", enc)
	}
	ct, err := vllmsim.ParseChatTemplate(tmpl)
	if err != nil {
		return o, fmt.Errorf("--sim-chat-template: %w", err)
	}
	o.ChatTemplate = ct
	if o.DropRate < 0 || o.DropRate > 1 {
		return o, fmt.Errorf("--sim-drop-rate %v outside [0, 1]", o.DropRate)
	}
	if o.TimeScale <= 0 {
		return o, fmt.Errorf("--sim-time-scale %v must be positive", o.TimeScale)
	}
	if o.TokenizeUS < 0 || o.TokenizeUS != o.TokenizeUS || o.TokenizeWorkers <= 0 {
		return o, fmt.Errorf("--sim-tokenize-us-per-token %v must be >= 0 and --sim-tokenize-workers %d positive", o.TokenizeUS, o.TokenizeWorkers)
	}
	if o.TokenizeMemoMiB < 0 || o.TokenizeMemoMiB > 1<<20 {
		return o, fmt.Errorf("--sim-tokenize-memo-mib %d: want 0..%d", o.TokenizeMemoMiB, 1<<20)
	}
	if o.DataParallel < 1 || o.DataParallel > 64 {
		return o, fmt.Errorf("--data-parallel-size %d: want 1..64", o.DataParallel)
	}
	if o.BlockSize <= 0 {
		return o, fmt.Errorf("--block-size %d must be positive", o.BlockSize)
	}
	if o.OffloadBackend != vllmsim.OffloadNative && o.OffloadBackend != vllmsim.OffloadLMCache {
		return o, fmt.Errorf("--kv-offloading-backend %q: want native or lmcache", o.OffloadBackend)
	}
	if o.OffloadGiB < 0 || o.OffloadGiB != o.OffloadGiB || o.OffloadGiB > 1<<20 {
		return o, fmt.Errorf("--kv-offloading-size %v: want 0..%d GiB", o.OffloadGiB, 1<<20)
	}
	if o.KVBytesPerBlock < 0 {
		return o, fmt.Errorf("--sim-kv-bytes-per-block %d must be >= 0", o.KVBytesPerBlock)
	}
	if o.KVBytesPerBlock == 0 {
		o.KVBytesPerBlock = vllmsim.KVBytesPerToken * o.BlockSize
	}
	if o.OffloadGiB > 0 && o.offloadBlocks() < 1 {
		return o, fmt.Errorf("--kv-offloading-size %v GiB holds no block of %d bytes", o.OffloadGiB, o.KVBytesPerBlock)
	}
	if o.Events, err = parseKVEventsConfig(kvCfg); err != nil {
		return o, err
	}
	if o.StoreLimit <= 0 {
		return o, fmt.Errorf("--sim-responses-store-limit %d must be positive", o.StoreLimit)
	}
	for _, e := range []struct {
		name string
		v    *bool
	}{{"VLLM_ENABLE_SCALE_OUT_ENDPOINTS", &o.ScaleOut}, {"VLLM_ENABLE_RESPONSES_API_STORE", &o.ResponsesStore}} {
		on, set, err := envInt(getenv, e.name)
		if err != nil {
			return o, err
		}
		// Either the flag or the variable turns the endpoints on.
		*e.v = *e.v || (set && on)
	}
	if v, ok := getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"); ok {
		// vLLM's envs.py: "1" or "true", case-insensitive.
		v = strings.ToLower(strings.TrimSpace(v))
		o.RuntimeLoRA = v == "1" || v == "true"
	}
	o.HashSeed, o.HashSeedSet = getenv("PYTHONHASHSEED")
	if o.HashSeed == "random" {
		o.HashSeed, o.HashSeedSet = "", false
	}
	return o, nil
}

// offloadBlocks is the CPU tier's capacity in blocks.
func (o options) offloadBlocks() int {
	return int(o.OffloadGiB * (1 << 30) / float64(o.KVBytesPerBlock))
}

// pubConfig derives the publisher configuration.
func (o options) pubConfig() pubConfig {
	c := defaultPubConfig()
	c.Endpoint = o.Events.Endpoint
	if o.Events.ReplayEndpoint != nil {
		c.ReplayEndpoint = *o.Events.ReplayEndpoint
	}
	c.Topic = o.Events.Topic
	c.BufferSteps = o.Events.BufferSteps
	c.HWM = o.Events.HWM
	c.MaxQueueSize = o.Events.MaxQueueSize
	c.Encoding = o.Encoding
	c.DropRate = o.DropRate
	c.Seed = o.Seed
	return c
}

// forRank returns c for data-parallel rank r: both endpoints offset as
// vLLM's offset_endpoint_port does (port + r, or an _dp<r> suffix for ipc
// and inproc), and r in every batch's data_parallel_rank.
func (c pubConfig) forRank(r int) (pubConfig, error) {
	c.Rank = int64(r)
	var err error
	if c.Endpoint, err = vllmclient.RankEndpoint(c.Endpoint, r); err != nil {
		return c, fmt.Errorf("--data-parallel-size: %w", err)
	}
	if c.ReplayEndpoint != "" {
		if c.ReplayEndpoint, err = vllmclient.RankEndpoint(c.ReplayEndpoint, r); err != nil {
			return c, fmt.Errorf("--data-parallel-size: %w", err)
		}
	}
	return c, nil
}

// envInt reads a vLLM boolean switch set as an integer, as vLLM's envs.py
// reads these (bool(int(value))): set reports whether it is present, and
// anything but an integer is an error, as vLLM fails to start on it.
func envInt(getenv func(string) (string, bool), name string) (on, set bool, err error) {
	v, ok := getenv(name)
	if !ok {
		return false, false, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return false, true, fmt.Errorf("%s=%q: want an integer (0 or 1)", name, v)
	}
	return n != 0, true, nil
}
