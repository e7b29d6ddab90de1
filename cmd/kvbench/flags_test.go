package main

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "defaults", check: func(t *testing.T, o options) {
			if o.Pods != 4 || o.Workload != "shared-prefix" || !slices.Equal(o.Policies, []string{"service", "kvroute"}) ||
				o.Rate != 8 || o.Duration != 30*time.Second || o.JSON != "out/results.json" || o.BlocksPerPod != 2048 || o.RequestIDs {
				t.Errorf("defaults %+v", o)
			}
			if l := o.loads(); !slices.Equal(l, []float64{8}) {
				t.Errorf("loads %v; want [8]", l)
			}
		}},
		{name: "slow motion", args: []string{"--slow", "2", "--sidecar-args", "--prefill-rate 5000"}, check: func(t *testing.T, o options) {
			if o.simTimeScale() != 0.5 || o.slowed(30*time.Second) != time.Minute {
				t.Errorf("time scale %v, 30s slowed to %v", o.simTimeScale(), o.slowed(30*time.Second))
			}
			args := slices.Concat(o.slowArgs(), o.SidecarArgs)
			// The sidecar's flags parse the last of a repeated flag: the user's
			// own --prefill-rate comes after --slow's and wins.
			last := map[string]string{}
			for i := 0; i+1 < len(args); i += 2 {
				last[args[i]] = args[i+1]
			}
			want := map[string]string{"--prefill-rate": "5000", "--load-push-interval": "50ms", "--claim-push-interval": "0s",
				"--load-push-delay": "4ms", "--max-queue-wait": "16s", "--cpu-load-rate": "190735"}
			for k, v := range want {
				if last[k] != v {
					t.Errorf("%s %q; want %q (args %q)", k, last[k], v, args)
				}
			}
		}},
		{name: "real time", check: func(t *testing.T, o options) {
			if o.slowArgs() != nil || o.simTimeScale() != 1 || o.slowed(time.Second) != time.Second {
				t.Errorf("--slow 1 changes the run: %q %v", o.slowArgs(), o.simTimeScale())
			}
		}},
		{name: "request ids", args: []string{"--request-ids"}, check: func(t *testing.T, o options) {
			if !o.RequestIDs {
				t.Error("--request-ids not set")
			}
		}},
		{name: "trace implies mooncake", args: []string{"--trace", "x.jsonl", "--time-scale", "3"}, check: func(t *testing.T, o options) {
			if o.Workload != "mooncake" || !slices.Equal(o.loads(), []float64{3}) {
				t.Errorf("workload %q loads %v", o.Workload, o.loads())
			}
		}},
		{name: "sweep and policies", args: []string{"--sweep", "2, 4,8", "--policies", "kvroute,central-precise,chwbl", "--json", "r.json"},
			check: func(t *testing.T, o options) {
				if !slices.Equal(o.loads(), []float64{2, 4, 8}) || len(o.Policies) != 3 || o.JSON != "r.json" {
					t.Errorf("%+v", o)
				}
			}},
		{name: "grid", args: []string{"--grid", "out/a, out/b,"}, check: func(t *testing.T, o options) {
			if !slices.Equal(o.Grid, []string{"out/a", "out/b"}) {
				t.Errorf("grid %q; want out/a and out/b", o.Grid)
			}
		}},
		{name: "unknown policy", args: []string{"--policies", "service,magic"}, wantErr: "unknown policy"},
		{name: "policy twice", args: []string{"--policies", "kvroute,kvroute"}, wantErr: "twice"},
		{name: "no policies", args: []string{"--policies", ""}, wantErr: "none"},
		{name: "unknown workload", args: []string{"--workload", "nope"}, wantErr: "--workload"},
		{name: "slow under 1", args: []string{"--slow", "0.5"}, wantErr: "--slow"},
		{name: "mooncake without trace", args: []string{"--workload", "mooncake"}, wantErr: "--trace"},
		{name: "bad sweep", args: []string{"--sweep", "1,x"}, wantErr: "--sweep"},
		{name: "negative sweep", args: []string{"--sweep", "-1"}, wantErr: "--sweep"},
		{name: "zero pods", args: []string{"--pods", "0"}, wantErr: "--pods"},
		{name: "tiny cache", args: []string{"--blocks-per-pod", "8"}, wantErr: "--blocks-per-pod"},
		{name: "zero rate", args: []string{"--rate", "0"}, wantErr: "--rate"},
		{name: "extra args", args: []string{"x"}, wantErr: "unexpected"},
		{name: "cpu tier", args: []string{"--cpu-tier-gib", "16", "--policies", "kvroute,kvroute-gpu-only,central-precise-gpu-only"},
			check: func(t *testing.T, o options) {
				want := []string{"--kv-offloading-backend", "native", "--kv-offloading-size", "16"}
				if got := o.tierArgs(); !slices.Equal(got, want) {
					t.Errorf("tierArgs %q; want %q", got, want)
				}
				if n := o.tierBlocks(); n != 8192 {
					t.Errorf("tierBlocks %d; want 8192 (16 GiB of 2 MiB blocks)", n)
				}
				if got := kvrouteArgs[policyKVRouteGPUOnly]; !slices.Contains(got, "--cpu-load-rate") {
					t.Errorf("kvroute-gpu-only sidecar args %q", got)
				}
			}},
		{name: "no tier", check: func(t *testing.T, o options) {
			if o.tierArgs() != nil || o.tierBlocks() != 0 {
				t.Errorf("tierArgs %q tierBlocks %d without --cpu-tier-gib", o.tierArgs(), o.tierBlocks())
			}
		}},
		{name: "lmcache tier", args: []string{"--cpu-tier-gib", "1", "--offload-backend", "lmcache", "--kv-bytes-per-block", "1048576"},
			check: func(t *testing.T, o options) {
				want := []string{"--kv-offloading-backend", "lmcache", "--kv-offloading-size", "1", "--sim-kv-bytes-per-block", "1048576"}
				if got := o.tierArgs(); !slices.Equal(got, want) || o.tierBlocks() != 1024 {
					t.Errorf("tierArgs %q tierBlocks %d", got, o.tierBlocks())
				}
			}},
		{name: "bad offload backend", args: []string{"--offload-backend", "gds"}, wantErr: "--offload-backend"},
		{name: "negative tier", args: []string{"--cpu-tier-gib", "-1"}, wantErr: "--cpu-tier-gib"},
		{name: "data-parallel ranks", args: []string{"--dp-ranks", "2", "--policies", "service,kvroute,kvroute-pin-only"},
			check: func(t *testing.T, o options) {
				sim, sc := o.dpArgs()
				if !slices.Equal(sim, []string{"--data-parallel-size", "2"}) || !slices.Equal(sc, []string{"--kv-events-dp-ranks", "2"}) {
					t.Errorf("dpArgs %q %q", sim, sc)
				}
				if got := kvrouteArgs[policyKVRoutePinOnly]; !slices.Equal(got, []string{"--dp-place-ranks=false"}) {
					t.Errorf("kvroute-pin-only sidecar args %q", got)
				}
			}},
		{name: "no ranks", check: func(t *testing.T, o options) {
			if sim, sc := o.dpArgs(); sim != nil || sc != nil {
				t.Errorf("dpArgs %q %q without --dp-ranks", sim, sc)
			}
		}},
		{name: "ranks with a central baseline", args: []string{"--dp-ranks", "2", "--policies", "kvroute,central-precise"}, wantErr: "indexes one rank"},
		{name: "too many ranks", args: []string{"--dp-ranks", "9"}, wantErr: "--dp-ranks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, io.Discard, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseFlags(%q) error %v; want one containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tt.args, err)
			}
			tt.check(t, o)
		})
	}
}

// TestWorkloadSizing checks the sizing rule: the shared prefixes fill
// most of the cluster's KV cache and no single pod holds them all, and
// every workload's prompts fit one pod.
func TestWorkloadSizing(t *testing.T) {
	for _, pods := range []int{3, 4, 8} {
		for _, w := range loadgen.Workloads {
			o, err := parseFlags([]string{"--pods", strconv.Itoa(pods), "--workload", w}, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			c := o.workloadConfig(8)
			podTokens := o.BlocksPerPod * blockSize
			if c.CacheTokens != pods*podTokens {
				t.Errorf("%d pods: cache %d tokens; want %d", pods, c.CacheTokens, pods*podTokens)
			}
			s, err := schedule(o, 8, nil, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			firsts := map[uint32]bool{}
			for _, x := range s.Sessions {
				tu := x.Turns[0]
				if len(tu.Prompt)+tu.MaxTokens > podTokens*3/4 {
					t.Fatalf("%s, %d pods: prompt of %d tokens over 3/4 of one pod (%d)", w, pods, len(tu.Prompt), podTokens)
				}
				if len(tu.Prompt) > 0 {
					firsts[tu.Prompt[0]] = true
				}
			}
			if w != "shared-prefix" {
				continue
			}
			distinct := len(firsts) * c.SharedPrefix.SystemTokens
			if distinct <= podTokens || distinct > c.CacheTokens {
				t.Errorf("%d pods: distinct prefixes %d tokens; want in (%d, %d]", pods, distinct, podTokens, c.CacheTokens)
			}
		}
	}
}

func TestMaxPromptTokens(t *testing.T) {
	for _, tt := range []struct{ blocks, want int }{
		{2048, 2048*16*3/4 - 256}, // the cache binds
		{32768, 131072 - 256},     // the simulator's context length binds
	} {
		if got := (options{BlocksPerPod: tt.blocks}).maxPromptTokens(256); got != tt.want {
			t.Errorf("maxPromptTokens with %d blocks per pod = %d; want %d", tt.blocks, got, tt.want)
		}
	}
}

// multi-lora's simulators serve its adapters; other workloads add nothing.
func TestSimArgs(t *testing.T) {
	if got, want := simArgs("multi-lora"), []string{"--lora-modules", "lora-a=/loras/lora-a", "lora-b=/loras/lora-b"}; !slices.Equal(got, want) {
		t.Errorf("simArgs(multi-lora) = %v; want %v", got, want)
	}
	if got := simArgs("shared-prefix"); got != nil {
		t.Errorf("simArgs(shared-prefix) = %v; want none", got)
	}
}
