//go:build integration

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/clusterkey"
)

const (
	model     = "sim-model"
	blockSize = 16
	// maxBody is the shared cluster's --max-body-bytes: small, so the 413
	// test sends a small body, and far above any prompt the tests send.
	maxBody = 256 << 10
)

var (
	rate       = flag.Float64("e2e.rate", 200, "BenchmarkOverhead: requests per second, all series together")
	duration   = flag.Duration("e2e.duration", 10*time.Second, "BenchmarkOverhead: length of one measured round")
	rounds     = flag.Int("e2e.rounds", 1, "BenchmarkOverhead: rounds; the table reports the median of the rounds' differences")
	sidecarEnv = flag.String("e2e.sidecar-env", "", "BenchmarkOverhead: space-separated NAME=value pairs added to the sidecars' environment (GOMAXPROCS=1 GOGC=400)")
	textToday  = flag.Bool("e2e.text-today", true, "BenchmarkTextPrefix: run today's design (a second cluster) beside the new one")
	textSeries = flag.String("e2e.text-series", "", "BenchmarkTextPrefix: only the series whose names match this regexp (and the direct ones)")
	profile    = flag.String("e2e.profile", "", "BenchmarkTextPrefix: take a profile of every sidecar of the new cluster over 10 s of the first round: cpu, allocs or trace (a runtime trace); sched records the machine's scheduler with perf and prints how long woken processes waited for a CPU")
	profileDir = flag.String("e2e.profile-dir", "e2e-profiles", "BenchmarkTextPrefix: where -e2e.profile writes sidecar-N.cpu, .allocs or .trace")
	textSizes  = flag.String("e2e.text-sizes", "1024,8192,32768", "BenchmarkTextPrefix: prompt sizes in tokens, comma-separated")
	pinCPUs    = flag.String("e2e.sidecar-cpus", "", "BenchmarkOverhead: pin the sidecars to these CPUs (taskset list); run go test under taskset for the rest")
	simArgsF   = flag.String("e2e.sim-args", "", "BenchmarkTextPrefix: space-separated flags added to every simulator's command line (--sim-tokenize-memo-mib 0)")
	arrivals   = flag.String("e2e.arrivals", "poisson", "BenchmarkTextPrefix: poisson (random gaps) or fixed (1/rate apart, as before 2026-12-01's fifth pass)")
	thinkTime  = flag.Duration("e2e.think", 300*time.Millisecond, "BenchmarkTextPrefix: a follow-up's think time after its first turn's answer (plus a random part of a pacing interval)")
	podCPUs    = flag.String("e2e.pod-cpus", "", "BenchmarkTextPrefix: pin pod i's simulator and sidecar to the i-th of these space-separated taskset lists (\"0 1\": a core per pod, as a node per pod would be)")
)

// env is what TestMain prepares once: binaries built into a private
// directory (not the user cache other engineers' runs rebuild), and the
// clusters to stop at the end.
var env struct {
	binDir string

	mu    sync.Mutex
	stops []func() // shared clusters: stop and remove their directories

	sharedOnce sync.Once
	shared     *fixture
	sharedErr  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "e2ebin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env.binDir = dir
	code := m.Run()
	env.mu.Lock()
	for _, stop := range env.stops {
		stop()
	}
	env.mu.Unlock()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is a running cluster and what the tests need to talk to it.
type fixture struct {
	c      *chaos.Cluster
	secret []byte // the cluster secret; nil when the sidecars run without one
	hc     *http.Client
}

// subnet returns this process's k-th 127.173.y subnet (k < 8). The pid
// spreads concurrent runs of this package; chaos's own tests use
// 127.1xx.1x, clear of 127.173.100+.
func subnet(k int) string {
	if k < 0 || k >= 8 {
		panic(fmt.Sprintf("subnet(%d): only 8 per run", k))
	}
	return fmt.Sprintf("127.173.%d", 100+(os.Getpid()%19)*8+k)
}

// clusterSpec is what differs between the clusters of this package.
type clusterSpec struct {
	pods      int
	subnet    int // index for subnet()
	secret    bool
	timeScale float64
	args      []string
	podArgs   [][]string // chaos.ClusterConfig.PodSidecarArgs: pod i's after args
	simArgs   []string   // appended to every simulator's command line
	simEnv    []string   // chaos.ClusterConfig.SimEnv
	cpus      string     // chaos.ClusterConfig.SidecarCPUs
	podCPUs   []string   // chaos.ClusterConfig.PodCPUs
	env       []string   // chaos.ClusterConfig.SidecarEnv
	progress  io.Writer
	// failed, when set, is the test a cleanup-stopped cluster belongs to:
	// if it failed, the tail of every process's log goes to its output
	// (CI's only account of a flake) and the logs stay on disk.
	failed testing.TB
}

// startCluster starts a cluster with sidecars. Its processes are stopped
// by TestMain (shared clusters) or by cleanup when that is not nil.
func startCluster(ctx context.Context, s clusterSpec, cleanup func(func())) (*fixture, error) {
	dir, err := os.MkdirTemp("", "e2e")
	if err != nil {
		return nil, err
	}
	cfg := chaos.LocalConfig()
	cfg.Pods = s.pods
	cfg.Dir = dir
	cfg.BinDir = env.binDir
	cfg.Model = model
	cfg.Subnet = subnet(s.subnet)
	cfg.Sidecars = true
	// A sidecar whose vLLM has exited waits up to 3 s for the meta that
	// says so to go out before it leaves (gossip storeGoneWait): a grace
	// shorter than that kills it before its leave under a loaded -race
	// run. Kubernetes gives 30 s.
	cfg.StopGrace = 5 * time.Second
	// A large cache keeps KV usage, which counts as load, near zero.
	cfg.Sim.NumGPUBlocks = 16384
	cfg.Sim.BlockSize = blockSize
	cfg.Sim.TimeScale = s.timeScale
	cfg.Sim.ExtraArgs = s.simArgs
	cfg.Progress = s.progress
	cfg.SidecarCPUs = s.cpus
	cfg.PodCPUs = s.podCPUs
	cfg.SidecarEnv = s.env
	cfg.SimEnv = s.simEnv
	// The sidecar's short timing that has a flag: digest changes go out
	// every 50 ms instead of 100 ms.
	// A key per block: the tests count matches in vLLM blocks.
	cfg.SidecarArgs = append([]string{"--digest-interval", "50ms", "--routing-stride", "1"}, s.args...)
	cfg.PodSidecarArgs = s.podArgs
	f := &fixture{hc: &http.Client{
		Timeout:   20 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}}
	if s.secret {
		raw := make([]byte, 32)
		rand.Read(raw)
		// The sidecar uses the file's bytes, trimmed, as the secret.
		f.secret = []byte(base64.StdEncoding.EncodeToString(raw))
		path := filepath.Join(dir, "secret")
		if err := os.WriteFile(path, append(f.secret, '\n'), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		cfg.SidecarArgs = append(cfg.SidecarArgs, "--cluster-secret-file", path)
	}
	c, err := chaos.Start(ctx, cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	f.c = c
	stop := func() {
		c.Stop()
		if t := s.failed; t != nil && t.Failed() {
			logTails(t, filepath.Join(dir, "logs"), 40)
			return
		}
		os.RemoveAll(dir)
	}
	if cleanup != nil {
		cleanup(stop)
	} else {
		env.mu.Lock()
		env.stops = append(env.stops, stop)
		env.mu.Unlock()
	}
	return f, nil
}

// shared returns the 3-pod cluster the functional tests share, starting it
// on first use. Tests on it must be independent of order: each draws its
// own prompts (seeded by its name) and leaves every pod running.
func shared(t *testing.T) *fixture {
	t.Helper()
	env.sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var progress io.Writer = io.Discard
		if testing.Verbose() {
			progress = os.Stderr
		}
		env.shared, env.sharedErr = startCluster(ctx, clusterSpec{
			pods: 3, subnet: 0, secret: true, timeScale: 20, progress: progress,
			args: []string{"--max-body-bytes", fmt.Sprint(maxBody)},
		}, nil)
	})
	if env.sharedErr != nil {
		t.Fatalf("start shared cluster: %v", env.sharedErr)
	}
	return env.shared
}

// testProgress writes the harness's lines to the test log.
type testProgress struct{ t testing.TB }

func (p testProgress) Write(b []byte) (int, error) {
	p.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// hopKey derives the hop-header key from the cluster secret as the sidecar
// does (clusterkey). It lets a test sign a header a peer would send, as a
// positive control.
func (f *fixture) hopKey(t *testing.T) []byte {
	t.Helper()
	derive := clusterkey.Derive
	if len(f.secret) == 0 { // the key of a sidecar without a secret
		derive = func([]byte) (clusterkey.Keys, error) { return clusterkey.Load("") }
	}
	k, err := derive(f.secret)
	if err != nil {
		t.Fatal(err)
	}
	return k.Hop
}

// index returns the pod index of a sidecar node name, -1 if unknown.
func (f *fixture) index(name string) int {
	for _, p := range f.c.Pods() {
		if p.Name == name {
			return p.Index
		}
	}
	return -1
}

// completion is an OpenAI completions request with a token-id prompt.
type completion struct {
	Model     string   `json:"model"`
	Prompt    []uint32 `json:"prompt"`
	MaxTokens int      `json:"max_tokens"`
	Stream    bool     `json:"stream,omitempty"`
}

func body(prompt []uint32, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(completion{Model: model, Prompt: prompt, MaxTokens: maxTokens, Stream: stream})
	return b
}

// reply is what a test reads from an answer.
type reply struct {
	Status   int
	ServedBy string // X-Kvroute-Served-By
	Decision string // X-Kvroute-Decision
	Type     string // Content-Type
	Body     []byte
	Service  time.Duration // X-Sim-Service-Us; -1 when absent
	// Inside is the entry sidecar's Server-Timing "kvroute": from the
	// last request byte read to the answer's headers; -1 when absent.
	Inside time.Duration
	// Route and Hop are Server-Timing's kvroute-route (the entry sidecar
	// choosing) and kvroute-hop (the serving sidecar's own part, from the
	// request's headers, its body streaming through); -1.
	Route, Hop time.Duration
	// Send is kvroute-send: the entry sidecar writing the request out;
	// HopSend kvroute-hop-send: the serving sidecar streaming it on.
	Send, HopSend time.Duration
	// Read is X-Sim-Read-Us: the engine's handler reading the body; -1.
	Read time.Duration
	// ToEngine is from the request leaving the client to the engine's
	// handler starting (X-Sim-Start-Unix-Us), FromEngine from the
	// engine's first output to the client's first byte; -1 when absent.
	ToEngine, FromEngine time.Duration
}

// cached returns usage.prompt_tokens_details.cached_tokens, -1 if absent.
func (r reply) cached() int {
	var v struct {
		Usage struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(r.Body, &v) != nil || v.Usage.Details == nil {
		return -1
	}
	return v.Usage.Details.Cached
}

// apiError decodes an OpenAI error body.
func (r reply) apiError() (typ string, code int, msg string, ok bool) {
	var v struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(r.Body, &v) != nil || v.Error == nil {
		return "", 0, "", false
	}
	return v.Error.Type, v.Error.Code, v.Error.Message, true
}

// do sends one request to addr (host:port) and reads the whole answer.
func (f *fixture) do(ctx context.Context, method, addr, path string, b []byte, hdr http.Header) (reply, error) {
	var rd io.Reader
	if b != nil {
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		return reply{}, err
	}
	if b != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := f.hc.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, ServedBy: resp.Header.Get("X-Kvroute-Served-By"),
		Decision: resp.Header.Get("X-Kvroute-Decision"), Type: resp.Header.Get("Content-Type"), Body: out}
	return r, err
}

// complete posts a completions body to pod i's sidecar and fails the test
// on a transport error.
func (f *fixture) complete(t *testing.T, i int, b []byte, hdr http.Header) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).API, "/v1/completions", b, hdr)
	if err != nil {
		t.Fatalf("POST /v1/completions to %s: %v", f.c.Pod(i).Name, err)
	}
	return r
}

// decision is the part of route.Decision that /debug/route reports and the
// tests read, by the snake_case names the endpoint prints.
type decision struct {
	Target     string `json:"target"`
	Local      bool   `json:"local"`
	Reason     string `json:"reason"`
	Candidates []struct {
		ID          string `json:"id"`
		MatchedKeys int    `json:"matched_keys"`
		Eligible    bool   `json:"eligible"`
		Excluded    string `json:"excluded"`
	} `json:"candidates"`
}

func (d decision) matched(id string) int {
	for _, c := range d.Candidates {
		if c.ID == id {
			return c.MatchedKeys
		}
	}
	return 0
}

// explain asks pod i's admin port how it would route b.
func (f *fixture) explain(ctx context.Context, i int, b []byte) (decision, error) {
	r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).Admin, "/debug/route", b, nil)
	if err != nil {
		return decision{}, err
	}
	if r.Status != http.StatusOK {
		return decision{}, fmt.Errorf("debug/route status %d: %s", r.Status, r.Body)
	}
	var v struct {
		Decision decision `json:"decision"`
	}
	if err := json.Unmarshal(r.Body, &v); err != nil {
		return decision{}, fmt.Errorf("debug/route: %w", err)
	}
	return v.Decision, nil
}

// peer is one /debug/peers entry.
type peer struct {
	ID        string  `json:"id"`
	Local     bool    `json:"local"`
	HasDigest bool    `json:"has_digest"`
	LoadAgeS  float64 `json:"load_age_s"`
	// EngineReached: this sidecar reached the peer's vLLM itself.
	EngineReached bool `json:"engine_reached"`
}

func (f *fixture) peers(ctx context.Context, admin string) ([]peer, error) {
	r, err := f.do(ctx, http.MethodGet, admin, "/debug/peers", nil, nil)
	if err != nil {
		return nil, err
	}
	var ps []peer
	if err := json.Unmarshal(r.Body, &ps); err != nil {
		return nil, fmt.Errorf("debug/peers status %d: %w", r.Status, err)
	}
	return ps, nil
}

// metrics returns pod i's /metrics text.
func (f *fixture) metrics(t *testing.T, i int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := f.do(ctx, http.MethodGet, f.c.Pod(i).Admin, "/metrics", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("GET /metrics of %s: %v (status %d)", f.c.Pod(i).Name, err, r.Status)
	}
	return string(r.Body)
}

// waitFor polls cond every 20 ms until it holds or timeout passes; the
// test fails with the last reason cond gave.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond(ctx)
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v (last: %s)", what, timeout, why)
		case <-tick.C:
		}
	}
}

// waitRoute waits until pod i's sidecar would send b to target, matching
// at least minKeys routing keys there: the target's digest has reached i.
func (f *fixture) waitRoute(t testing.TB, i int, b []byte, target string, minKeys int) {
	t.Helper()
	what := fmt.Sprintf("%s routes to %s on %d keys", f.c.Pod(i).Name, target, minKeys)
	waitFor(t, 15*time.Second, what, func(ctx context.Context) (bool, string) {
		d, err := f.explain(ctx, i, b)
		if err != nil {
			return false, err.Error()
		}
		return d.Target == target && d.matched(target) >= minKeys,
			fmt.Sprintf("target %q (%s), %d keys matched at %s", d.Target, d.Reason, d.matched(target), target)
	})
}

// warm caches a fresh prefix of n blocks on whichever pod routing picks,
// waits until every other sidecar's view shows that pod holding it, and
// returns the pod's index and the prefix.
func (f *fixture) warm(t *testing.T, r *mrand.Rand, n int) (int, []uint32) {
	t.Helper()
	prefix := tokens(r, n*blockSize)
	first := f.complete(t, 0, body(join(prefix, tokens(r, 8)), 4, false), nil)
	if first.Status != http.StatusOK {
		t.Fatalf("warm-up request: status %d: %s", first.Status, first.Body)
	}
	x := f.index(first.ServedBy)
	if x < 0 {
		t.Fatalf("warm-up request served by %q; want a pod name", first.ServedBy)
	}
	probe := body(join(prefix, tokens(r, 8)), 4, false)
	for i := range f.c.Len() {
		f.waitRoute(t, i, probe, first.ServedBy, n)
	}
	return x, prefix
}

// logTails logs the last n lines of every log in dir, and where they are.
func logTails(t testing.TB, dir string, n int) {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("%s, its last %d lines:\n%s", p, min(n, len(lines)), strings.Join(lines[max(0, len(lines)-n):], "\n"))
	}
}
