//go:build integration

package vllmclient_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
	zmq "github.com/pebbe/zmq4"
)

// simModel is the served model name; it seeds every index key.
const simModel = "sim-model"

// simOptions are the vllm-sim settings a test varies.
type simOptions struct {
	// Encoding is the KV-event wire encoding, "map" or "array".
	Encoding string
	// Blocks is --num-gpu-blocks-override; small, so a workload evicts.
	Blocks int
	// DropRate is --sim-drop-rate: batches not sent live (still replayable).
	DropRate float64
	// TimeScale is --sim-time-scale (0: 500, so a 600-token prefill costs
	// ~0.1 ms of wall time and thousands of requests take seconds). Slower
	// scales make requests overlap, which is what creates duplicate copies.
	TimeScale float64
	// BatchedTokens is --max-num-batched-tokens (0: the engine's 8192). A
	// small budget chunks long prefills over several steps; a request
	// that arrives between them reuses the stored part and computes the
	// rest alongside, which is how vLLM ends up with duplicate copies.
	BatchedTokens int
}

// sim is one vllm-sim process on 127.0.0.1 with ipc:// event sockets.
type sim struct {
	t      *testing.T
	url    string // http://127.0.0.1:port
	events string // PUB endpoint
	replay string // ROUTER endpoint (always bound; subscribers choose)
	topic  string
	blocks int
	client *http.Client
	logs   *lockedBuffer
}

// lockedBuffer is the simulator's stderr, shown when a test fails.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSim starts vllm-sim with a small cache and fast simulated time,
// waits for /health, and registers its shutdown with t.Cleanup.
// PYTHONHASHSEED is removed from its environment so that, like vLLM, it
// picks a random hash seed per start and per engine restart.
func startSim(t *testing.T, o simOptions) *sim {
	t.Helper()
	bin := binary(t, chaos.SimBinary)
	// ipc:// paths must fit in sun_path (107 bytes): t.TempDir() embeds the
	// test name, so take a short directory of our own.
	dir, err := os.MkdirTemp("", "kvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &sim{
		t:      t,
		events: "ipc://" + filepath.Join(dir, "ev"),
		replay: "ipc://" + filepath.Join(dir, "rp"),
		topic:  "kv@sim@" + simModel,
		blocks: o.Blocks,
		logs:   &lockedBuffer{},
		client: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 32},
		},
	}
	kv := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":%q,"replay_endpoint":%q,"topic":%q}`,
		s.events, s.replay, s.topic)
	args := []string{
		"--host", "127.0.0.1", "--port", "0",
		"--served-model-name", simModel,
		"--block-size", "16",
		"--num-gpu-blocks-override", strconv.Itoa(o.Blocks),
		"--prefix-caching-hash-algo", "fast",
		"--kv-events-config", kv,
		"--kv-events-encoding", o.Encoding,
		"--sim-time-scale", strconv.FormatFloat(cmp.Or(o.TimeScale, 500), 'g', -1, 64),
		"--sim-drop-rate", strconv.FormatFloat(o.DropRate, 'g', -1, 64),
		"--sim-restart-downtime", "200ms",
		"--sim-shutdown-timeout", "1s",
	}
	if o.BatchedTokens > 0 {
		args = append(args, "--max-num-batched-tokens", strconv.Itoa(o.BatchedTokens))
	}
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PYTHONHASHSEED=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = sysProcAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			s.logs.Write(append(line, '\n'))
			var m struct{ Message, Addr string }
			if json.Unmarshal(line, &m) == nil && m.Message == "listening" && m.Addr != "" {
				select {
				case addrc <- m.Addr:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("vllm-sim log (tail):\n%s", tail(s.logs.String(), 20))
		}
	})
	select {
	case addr := <-addrc:
		s.url = "http://" + addr
	case <-exited:
		t.Fatalf("vllm-sim exited before listening:\n%s", s.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("vllm-sim not listening within 30s:\n%s", s.logs.String())
	}
	s.waitHealthy(context.Background())
	return s
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHealthy polls /health until 200 (10 s at most).
func (s *sim) waitHealthy(ctx context.Context) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var last string
	for {
		st, _, err := s.do(ctx, http.MethodGet, "/health", nil)
		if err == nil && st == http.StatusOK {
			return
		}
		last = fmt.Sprintf("status %d, err %v", st, err)
		select {
		case <-ctx.Done():
			s.t.Fatalf("vllm-sim /health never 200 (last: %s)", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// do sends one request and returns the status and body.
func (s *sim) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// must sends one admin request that has to succeed.
func (s *sim) must(ctx context.Context, method, path string, body any) []byte {
	s.t.Helper()
	st, b, err := s.do(ctx, method, path, body)
	if err != nil || st != http.StatusOK {
		s.t.Fatalf("%s %s = %d %s, %v", method, path, st, b, err)
	}
	return b
}

// complete sends a token-id completion and fails on anything but 200.
func (s *sim) complete(ctx context.Context, prompt []uint32, maxTokens int) error {
	st, b, err := s.do(ctx, http.MethodPost, "/v1/completions",
		map[string]any{"model": simModel, "prompt": prompt, "max_tokens": maxTokens})
	if err != nil {
		return fmt.Errorf("completion: %w", err)
	}
	if st != http.StatusOK {
		return fmt.Errorf("completion: status %d: %s", st, b)
	}
	return nil
}

// cache reads the ground truth, GET /sim/cache.
func (s *sim) cache(ctx context.Context) chaos.SimCache {
	s.t.Helper()
	var sc chaos.SimCache
	if err := json.Unmarshal(s.must(ctx, http.MethodGet, "/sim/cache", nil), &sc); err != nil {
		s.t.Fatalf("sim cache: %v", err)
	}
	return sc
}

func (s *sim) setDropRate(ctx context.Context, r float64) {
	s.t.Helper()
	s.must(ctx, http.MethodPost, "/sim/drop-rate", map[string]float64{"drop_rate": r})
}

// resetCache empties the simulator's cache with AllBlocksCleared, as
// vLLM's /reset_prefix_cache does.
func (s *sim) resetCache(ctx context.Context) {
	s.t.Helper()
	s.must(ctx, http.MethodPost, "/reset_prefix_cache", nil)
}

// restart is an engine restart: cache gone, seq back to 0, no
// AllBlocksCleared, new hash seed. It returns once /health is 200 again.
func (s *sim) restart(ctx context.Context) {
	s.t.Helper()
	s.must(ctx, http.MethodPost, "/sim/restart", nil)
	s.waitHealthy(ctx)
}

// counter reads one counter of the simulator's /metrics.
func (s *sim) counter(ctx context.Context, name string) uint64 {
	s.t.Helper()
	b := s.must(ctx, http.MethodGet, "/metrics", nil)
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			s.t.Fatalf("metric %s: %v", name, err)
		}
		return uint64(f)
	}
	s.t.Fatalf("metric %s not in /metrics", name)
	return 0
}

// replayedPayloads asks the simulator's replay socket for every buffered
// batch and returns up to n payloads (frame 3 of each reply), oldest first.
// The tests read the wire bytes this way to check the encoding the
// simulator really sent.
func (s *sim) replayedPayloads(n int) [][]byte {
	s.t.Helper()
	d, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		s.t.Fatal(err)
	}
	defer d.Close()
	d.SetLinger(0)
	d.SetRcvtimeo(10 * time.Second)
	if err := d.Connect(s.replay); err != nil {
		s.t.Fatal(err)
	}
	if _, err := d.SendMessage("", make([]byte, 8)); err != nil { // from seq 0
		s.t.Fatal(err)
	}
	var out [][]byte
	for len(out) < n {
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			s.t.Fatalf("replay: %v", err)
		}
		// ["", topic, seq, payload]; an empty payload ends the replay.
		if len(frames) != 4 || len(frames[3]) == 0 {
			break
		}
		out = append(out, frames[3])
	}
	return out
}
