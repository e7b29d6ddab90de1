package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/kvevent"
)

// A simulator with a native CPU tier and two ranks publishes, over its
// real ZMQ replay socket, rank 1's offload as vLLM's OffloadingConnector
// does: a hash-only BlockStored with medium CPU naming a hash the rank
// stored on its GPU before, in a batch with data_parallel_rank 1; the
// evicted prompt comes back as cached_tokens.
func TestOffloadPublished(t *testing.T) {
	dir := t.TempDir()
	replay := "ipc://" + filepath.Join(dir, "replay")
	// 1 GiB of 16 MiB blocks: a 64-block tier behind 8 GPU blocks.
	o, err := parseFlags([]string{"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m",
		"--data-parallel-size", "2", "--sim-time-scale", "50", "--num-gpu-blocks-override", "8",
		"--kv-offloading-backend", "native", "--kv-offloading-size", "1", "--sim-kv-bytes-per-block", "16777216",
		"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":%q,"replay_endpoint":%q,"topic":"kv"}`, "ipc://"+filepath.Join(dir, "kv"), replay),
	}, noEnv, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lines := logLines{ch: make(chan string, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, zerolog.New(lines)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	var addr string
	for deadline := time.After(10 * time.Second); addr == ""; {
		select {
		case l := <-lines.ch:
			var m struct{ Message, Addr string }
			if json.Unmarshal([]byte(l), &m) == nil && m.Message == "listening" {
				addr = m.Addr
			}
		case <-deadline:
			t.Fatal("no listening line within 10s")
		}
	}
	ids := func(from, n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(from + i)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	var cached int
	for _, p := range []string{ids(1000, 100), ids(5000, 120), ids(1000, 100)} {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/completions", strings.NewReader(`{"prompt":`+p+`,"max_tokens":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-data-parallel-rank", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		cached = r.Usage.Details.Cached
	}
	if cached != 96 {
		t.Errorf("evicted prompt: cached_tokens %d; want 96, loaded from the CPU tier", cached)
	}

	// Rank 1's replay holds every batch; rank 0's none of the tier's.
	d := newDealer(t, replay+"_dp1")
	if _, err := d.s.SendMessage("", seqBytes(0)); err != nil {
		t.Fatal(err)
	}
	gpuSeen := map[uint64]bool{}
	var cpuStored, cpuOK int
	for {
		msg, err := d.s.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if len(msg) == 4 && len(msg[3]) == 0 {
			break
		}
		b, err := kvevent.DecodeFrames(msg[1:])
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range b.Events {
			if e.Kind != kvevent.BlockStored || e.Medium == nil {
				continue
			}
			switch *e.Medium {
			case "GPU":
				for _, h := range e.BlockHashes {
					gpuSeen[h] = true
				}
			case "CPU":
				cpuStored++
				if b.DPRank != nil && *b.DPRank == 1 && e.Parent == nil && len(e.TokenIDs) == 0 && e.BlockSize == 0 &&
					len(e.BlockHashes) == 1 && gpuSeen[e.BlockHashes[0]] {
					cpuOK++
				} else {
					t.Errorf("CPU BlockStored %+v in batch of rank %v; want hash-only, a GPU-seen hash, rank 1", e, b.DPRank)
				}
			}
		}
	}
	if cpuStored == 0 || cpuOK != cpuStored {
		t.Errorf("rank 1 published %d CPU stores, %d well-formed; want some, all", cpuStored, cpuOK)
	}
}
