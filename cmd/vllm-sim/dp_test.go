package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/simhttp"
	"github.com/kvroute/kvroute/vllmsim"
)

func TestPickIsVLLMsRule(t *testing.T) {
	tests := []struct {
		name  string
		stats []vllmsim.Stats
		want  int
	}{
		{"idle: rank 0", []vllmsim.Stats{{}, {}}, 0},
		{"one running", []vllmsim.Stats{{Running: 1}, {}}, 1},
		{"waiting weighs 4", []vllmsim.Stats{{Waiting: 1}, {Running: 3}}, 1},
		{"waiting weighs 4, tie to lower", []vllmsim.Stats{{Waiting: 1}, {Running: 4}}, 0},
		{"three ranks", []vllmsim.Stats{{Running: 2}, {Running: 1}, {Running: 1}}, 1},
	}
	for _, tt := range tests {
		if got := pick(tt.stats); got != tt.want {
			t.Errorf("%s: pick(%+v) = %d; want %d", tt.name, tt.stats, got, tt.want)
		}
	}
}

func TestForRankOffsetsEndpoints(t *testing.T) {
	c := defaultPubConfig()
	c.Endpoint, c.ReplayEndpoint = "tcp://*:5557", "ipc:///run/kv-replay"
	got, err := c.forRank(2)
	if err != nil || got.Endpoint != "tcp://*:5559" || got.ReplayEndpoint != "ipc:///run/kv-replay_dp2" || got.Rank != 2 {
		t.Errorf("forRank(2) = %q %q rank %d, %v; want tcp://*:5559 ipc:///run/kv-replay_dp2 rank 2", got.Endpoint, got.ReplayEndpoint, got.Rank, err)
	}
	c.Endpoint = "tcp://127.0.0.1:*"
	if _, err := c.forRank(1); err == nil {
		t.Error("forRank(1) of a wildcard port: no error; vLLM's offset needs a port")
	}
}

// logLines hands the simulator's log lines to the test.
type logLines struct{ ch chan string }

func (l logLines) Write(b []byte) (int, error) {
	select {
	case l.ch <- string(b):
	default:
	}
	return len(b), nil
}

// A simulator run with --data-parallel-size 2 publishes each rank's events
// on its own endpoint (the ipc name gets _dp1) with data_parallel_rank set,
// and a request arriving while rank 0 is busy goes to rank 1.
func TestDataParallelRanksPublishApart(t *testing.T) {
	dir := t.TempDir()
	events := "ipc://" + filepath.Join(dir, "kv")
	replay := "ipc://" + filepath.Join(dir, "replay")
	o, err := parseFlags([]string{"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m",
		"--data-parallel-size", "2", "--sim-time-scale", "5",
		"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":%q,"replay_endpoint":%q,"topic":"kv"}`, events, replay),
	}, func(string) (string, bool) { return "", false }, io.Discard, io.Discard)
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
	base := "http://" + addr
	// Rank 0 takes the first request (both idle); while it streams, the
	// second one goes to rank 1.
	prompt := func(word string) string { return strings.Repeat(word+" ", 200) }
	long, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":400,"stream":true}`, prompt("first"))))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()
	if _, err := bufio.NewReader(long.Body).ReadString('\n'); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt("second"))))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("second request: %v %v", err, resp)
	}
	resp.Body.Close()

	for rank, ep := range []string{replay, replay + "_dp1"} {
		d := newDealer(t, ep)
		if _, err := d.s.SendMessage("", seqBytes(0)); err != nil {
			t.Fatal(err)
		}
		var stored int
		for {
			msg, err := d.s.RecvMessageBytes(0)
			if err != nil {
				t.Fatalf("rank %d replay: %v", rank, err)
			}
			if len(msg) == 4 && len(msg[3]) == 0 {
				break
			}
			b, err := kvevent.DecodeFrames(msg[1:])
			if err != nil {
				t.Fatal(err)
			}
			if b.DPRank == nil || *b.DPRank != int64(rank) {
				t.Errorf("rank %d endpoint: batch data_parallel_rank %v; want %d", rank, b.DPRank, rank)
			}
			for _, e := range b.Events {
				stored += len(e.BlockHashes)
			}
		}
		if stored == 0 {
			t.Errorf("rank %d published no BlockStored", rank)
		}
	}
	m, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(m.Body)
	m.Body.Close()
	for _, series := range []string{`vllm:num_requests_running{engine="0",model_name="m"}`, `vllm:num_requests_running{engine="1",model_name="m"}`} {
		if !strings.Contains(string(text), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}

// A request carrying vLLM's X-data-parallel-rank header runs on that rank,
// even when rank 0 is idle; a rank out of range or not a number is a 400.
func TestDataParallelRankHeader(t *testing.T) {
	dp := &ranks{}
	ctx, cancel := context.WithCancel(context.Background())
	var done []chan struct{}
	for range 2 {
		cfg := vllmsim.DefaultConfig()
		cfg.Model, cfg.NumGPUBlocks, cfg.MaxModelLen, cfg.TimeScale = "sim-model", 512, 2048, 1000
		eng, err := vllmsim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		dp.engs = append(dp.engs, eng)
		d := make(chan struct{})
		done = append(done, d)
		go func() { eng.Run(ctx); close(d) }()
	}
	defer func() {
		cancel()
		for _, d := range done {
			<-d
		}
	}()
	srv := simhttp.New(simhttp.Config{Models: []string{"sim-model"}, MaxModelLen: 2048}, dp, dp.engs[0].Tokenizer(), nil, nil)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	post := func(rank string) int {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/completions", strings.NewReader(`{"prompt":"hello there","max_tokens":1}`))
		req.Header.Set("Content-Type", "application/json")
		if rank != "" {
			req.Header.Set("x-data-parallel-rank", rank)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("1"); code != 200 {
		t.Fatalf("rank 1: status %d", code)
	}
	if p0, p1 := dp.engs[0].Stats().PromptTokensTotal, dp.engs[1].Stats().PromptTokensTotal; p0 != 0 || p1 == 0 {
		t.Errorf("prompt tokens by rank = %d, %d; want 0 on rank 0, some on rank 1", p0, p1)
	}
	for _, bad := range []string{"2", "-1", "one"} {
		if code := post(bad); code != 400 {
			t.Errorf("X-data-parallel-rank %q: status %d; want 400", bad, code)
		}
	}
}
