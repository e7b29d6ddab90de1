package main

import (
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/simhttp"
	"github.com/kvroute/kvroute/vllmsim"
)

func noEnv(string) (string, bool) { return "", false }

func TestExpandMulti(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"--served-model-name a b --port 1", "--served-model-name a --served-model-name b --port 1"},
		{"--served-model-name=a --port 1", "--served-model-name=a --port 1"},
		{"--lora-modules x=/p y=/q", "--lora-modules x=/p --lora-modules y=/q"},
		{"--served-model-name", "--served-model-name"},
		{"--port 1 model", "--port 1 model"},
	}
	for _, tt := range tests {
		if got := strings.Join(expandMulti(strings.Fields(tt.in)), " "); got != tt.want {
			t.Errorf("expandMulti(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	def := vllmsim.DefaultConfig().Model
	tests := []struct {
		name  string
		args  string
		env   map[string]string
		check func(t *testing.T, o options)
	}{
		{"defaults", "", nil, func(t *testing.T, o options) {
			if o.Port != 8000 || o.BlockSize != 16 || o.HashAlgo != "sha256_cbor" || o.Encoding != kvevent.MapEncoding {
				t.Errorf("port %d block %d algo %q enc %v", o.Port, o.BlockSize, o.HashAlgo, o.Encoding)
			}
			if !cmp.Equal(o.Models, []string{def}) || o.Events.publishing() || o.HashSeedSet {
				t.Errorf("models %v publishing %v seedSet %v", o.Models, o.Events.publishing(), o.HashSeedSet)
			}
			pc := o.pubConfig()
			if pc.Endpoint != "tcp://*:5557" || pc.BufferSteps != 10000 || pc.HWM != 100000 || pc.ReplayEndpoint != "" {
				t.Errorf("pubConfig = %+v", pc)
			}
		}},
		{"vllm style", "--port=9000 --served-model-name a b --lora-modules x=/lx {\"name\":\"y\",\"path\":\"/ly\",\"base_model_name\":\"b\"} --block-size 32 --prefix-caching-hash-algo fast --max-model-len 4096",
			map[string]string{"PYTHONHASHSEED": "42"}, func(t *testing.T, o options) {
				want := []simhttp.LoRA{{Name: "x", Path: "/lx"}, {Name: "y", Path: "/ly", Base: "b"}}
				if diff := cmp.Diff(want, o.LoRAs); diff != "" {
					t.Errorf("LoRAs (-want +got):\n%s", diff)
				}
				if o.Port != 9000 || !cmp.Equal(o.Models, []string{"a", "b"}) || o.BlockSize != 32 || o.HashAlgo != "fast" || o.MaxModelLen != 4096 {
					t.Errorf("got %+v", o)
				}
				if o.HashSeed != "42" || !o.HashSeedSet {
					t.Errorf("seed %q set %v; want 42 true", o.HashSeed, o.HashSeedSet)
				}
			}},
		{"kv events", `--kv-events-config {"enable_kv_cache_events":true,"endpoint":"tcp://10.0.0.1:5557","replay_endpoint":"tcp://*:5558","topic":"kv@x","buffer_steps":5,"hwm":7} --kv-events-encoding array --sim-drop-rate 0.25`,
			nil, func(t *testing.T, o options) {
				pc := o.pubConfig()
				if !o.Events.publishing() || pc.Endpoint != "tcp://10.0.0.1:5557" || pc.ReplayEndpoint != "tcp://*:5558" ||
					pc.Topic != "kv@x" || pc.BufferSteps != 5 || pc.HWM != 7 || pc.MaxQueueSize != 100000 ||
					pc.Encoding != kvevent.ArrayEncoding || pc.DropRate != 0.25 {
					t.Errorf("pubConfig = %+v", pc)
				}
			}},
		{"publisher null", `--kv-events-config {"enable_kv_cache_events":true,"publisher":"null"}`, nil, func(t *testing.T, o options) {
			if o.Events.publishing() {
				t.Error("publishing with publisher null")
			}
		}},
		{"random seed", "", map[string]string{"PYTHONHASHSEED": "random"}, func(t *testing.T, o options) {
			if o.HashSeedSet {
				t.Error("PYTHONHASHSEED=random counts as set")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			o, err := parseFlags(splitArgs(tt.args), env, io.Discard, io.Discard)
			if err != nil {
				t.Fatalf("parseFlags(%q) = %v", tt.args, err)
			}
			tt.check(t, o)
		})
	}
}

// splitArgs splits on spaces outside JSON braces.
func splitArgs(s string) []string {
	var out []string
	var cur strings.Builder
	depth := 0
	for _, r := range s {
		switch {
		case r == '{':
			depth++
		case r == '}':
			depth--
		case r == ' ' && depth == 0:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
			continue
		}
		cur.WriteRune(r)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func TestParseFlagsErrors(t *testing.T) {
	for _, args := range []string{
		"--prefix-caching-hash-algo md5",
		"--kv-events-encoding yaml",
		"--sim-drop-rate 2",
		"--sim-time-scale 0",
		"--sim-tokenize-memo-mib -1",
		"--block-size 0",
		"--kv-offloading-backend disk --kv-offloading-size 1",
		"--kv-offloading-size -1",
		"--kv-offloading-size 0.001",
		"--sim-kv-bytes-per-block -1",
		"--lora-modules noequals",
		`--kv-events-config {"enable_kv_cache_events":true,"bogus":1}`,
		`--kv-events-config {"publisher":"kafka"}`,
		`--kv-events-config {"buffer_steps":0}`,
		"--kv-events-config {",
		"--no-such-flag",
		"a b",
	} {
		if _, err := parseFlags(splitArgs(args), noEnv, io.Discard, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) = nil error; want error", args)
		}
	}
}

func TestParseFlagsPositionalModel(t *testing.T) {
	o, err := parseFlags([]string{"--port", "1", "org/m"}, noEnv, io.Discard, io.Discard)
	if err != nil || o.Model != "org/m" || !cmp.Equal(o.Models, []string{"org/m"}) {
		t.Errorf("parseFlags = %+v, %v; want model org/m", o, err)
	}
}

func TestEngineConfig(t *testing.T) {
	o, err := parseFlags(splitArgs("--served-model-name m --num-gpu-blocks-override 64 --max-num-seqs 4 --max-num-batched-tokens 512 --max-model-len 1024 --sim-time-scale 10 --sim-tokenize-memo-mib 3"),
		func(string) (string, bool) { return "7", true }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	base := vllmsim.DefaultConfig()
	c := engineConfig(o, base)
	if c.Model != "m" || c.NumGPUBlocks != 64 || c.MaxNumSeqs != 4 || c.MaxNumBatchedTokens != 512 ||
		c.MaxModelLen != 1024 || c.TimeScale != 10 || c.HashSeed != "7" || !c.HashSeedSet || c.Timing != base.Timing ||
		c.TokenizerMemoBytes != 3<<20 {
		t.Errorf("engineConfig = %+v", c)
	}
	o.NumGPUBlocks, o.MaxModelLen = 0, 0
	if c := engineConfig(o, base); c.NumGPUBlocks != base.NumGPUBlocks || c.MaxModelLen != base.MaxModelLen {
		t.Errorf("zero overrides changed defaults: %+v", c)
	}
}

func TestOffloadFlags(t *testing.T) {
	base := vllmsim.DefaultConfig()
	o, err := parseFlags(nil, noEnv, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := engineConfig(o, base); c.Offload != (vllmsim.Offload{}) || c.Timing != base.Timing {
		t.Errorf("default offload %+v timing %+v; want no tier, timing unchanged", c.Offload, c.Timing)
	}
	// 2 GiB of the model's 2 MiB blocks (128 KiB per token × 16).
	o, err = parseFlags(splitArgs("--kv-offloading-size 2"), noEnv, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := engineConfig(o, base)
	if want := (vllmsim.Offload{Backend: vllmsim.OffloadNative, Blocks: 1024}); c.Offload != want {
		t.Errorf("offload %+v; want %+v", c.Offload, want)
	}
	if c.Timing.LoadPerToken != vllmsim.LoadPerToken(vllmsim.KVBytesPerToken) {
		t.Errorf("load per token %v", c.Timing.LoadPerToken)
	}
	o, err = parseFlags(splitArgs("--kv-offloading-backend lmcache --kv-offloading-size 1 --sim-kv-bytes-per-block 1048576 --block-size 32"), noEnv, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c = engineConfig(o, base)
	if want := (vllmsim.Offload{Backend: vllmsim.OffloadLMCache, Blocks: 1024}); c.Offload != want {
		t.Errorf("offload %+v; want %+v", c.Offload, want)
	}
	if want := vllmsim.LoadPerToken(1 << 15); c.Timing.LoadPerToken != want {
		t.Errorf("load per token %v; want %v (32 KiB per token)", c.Timing.LoadPerToken, want)
	}
}
