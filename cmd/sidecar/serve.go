package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/clusterkey"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/forward"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/textprefix"
	"github.com/kvroute/kvroute/textroute"
	"github.com/kvroute/kvroute/vllmclient"
)

// runServe is `sidecar serve`: it wires the cache-state flow (events →
// index → digest → mesh) and the request flow (front → choice → proxy), and
// drains on SIGTERM.
func runServe(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseServe(args, os.Getenv, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) { // --help or --version, answered
		return nil
	}
	if err != nil {
		return exitError{code: 2, err: err}
	}
	log := newLogger(cfg)
	if n := setProcs(cfg.Procs, os.Getenv("GOMAXPROCS")); n > 0 {
		log.Info().Int("gomaxprocs", n).Msg("scheduler threads")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return serve(ctx, cfg, log)
}

// setProcs applies --procs unless the GOMAXPROCS variable is set, and
// returns the resulting GOMAXPROCS. One is the default because the sidecar
// is a proxy whose per-request work is a few goroutine hand-offs: on one P
// they run back to back on the thread the socket woke, while with more, Go
// wakes idle threads on other CPUs to steal them. Measured on 2 CPUs
// (e2e BenchmarkOverhead): about 90 us less added latency per request, and
// 0.3 ms less for a prompt that needs /tokenize. A sidecar needs well under
// a core: ~0.2 ms of CPU per request.
func setProcs(procs int, env string) int {
	if procs > 0 && env == "" {
		runtime.GOMAXPROCS(procs)
	}
	return runtime.GOMAXPROCS(0)
}

func newLogger(cfg config) zerolog.Logger {
	var w io.Writer = os.Stderr
	if cfg.LogFormat == "console" {
		w = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339}
	}
	lvl, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("node", cfg.NodeName).Logger()
}

func serve(ctx context.Context, cfg config, log zerolog.Logger) error {
	keys, err := clusterkey.Load(cfg.SecretFile)
	if err != nil {
		return err
	}
	if keys.Gossip == nil {
		log.Warn().Msg("NO CLUSTER SECRET: gossip is unencrypted and hop headers are unauthenticated; set --cluster-secret-file outside local testing")
	}
	vllmURL, err := url.Parse(cfg.VLLMURL)
	if err != nil || vllmURL.Host == "" {
		return fmt.Errorf("--vllm-url %q: not an absolute URL", cfg.VLLMURL)
	}
	vc := vllmclient.New(vllmclient.ClientConfig{BaseURL: cfg.VLLMURL, Timeout: 5 * time.Second})
	if cfg.Model == "" {
		if cfg.Model, err = discoverModel(ctx, cfg.VLLMURL, log); err != nil {
			return err
		}
	}
	capacity := cfg.CapacityBlocks
	if capacity == 0 {
		capacity = 100_000
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if l, err := vc.Load(lctx); err == nil && l.NumGPUBlocks > 0 {
			capacity = l.NumGPUBlocks
		}
		cancel()
	}
	scheme := blockkey.Scheme{BlockSize: cfg.BlockSize, Stride: cfg.RoutingStride}
	reg := prometheus.NewRegistry()
	metrics := newSidecarMetrics(reg)

	ix := kvindex.New(kvindex.Config{Model: cfg.Model, Scheme: scheme, CapacityBlocks: capacity,
		Epoch: uint64(time.Now().UnixNano()), TierStride: cfg.TierStride})
	subCfg := vllmclient.DefaultConfig()
	subCfg.Endpoint, subCfg.Bind, subCfg.Topic = cfg.EventsEndpoint, cfg.EventsBind, cfg.EventsTopic
	subCfg.ReplayEndpoint, subCfg.DPRanks = cfg.EventsReplayEndpoint, cfg.DPRanks
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	sub, err := vllmclient.Subscribe(runCtx, subCfg)
	if err != nil {
		return fmt.Errorf("subscribe to kv events: %w", err)
	}

	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", cfg.Listen, err)
	}
	advertise := cfg.AdvertiseAddr
	if advertise == "" && host != "" && host != "0.0.0.0" && host != "::" {
		advertise = host
	}
	if advertise == "" {
		return errors.New("--advertise-addr is required when --listen has no specific host (set POD_IP)")
	}
	port, _ := strconv.Atoi(portStr)
	gcfg := gossip.DefaultConfig()
	gcfg.NodeName, gcfg.BindPort, gcfg.AdvertiseAddr = cfg.NodeName, cfg.GossipPort, advertise
	gcfg.BindAddr = "0.0.0.0"
	if host != "" && host != "0.0.0.0" && host != "::" {
		gcfg.BindAddr = host // a pod of the local cluster binds its own loopback address
	}
	gcfg.Join, gcfg.SecretKey, gcfg.Label = cfg.Join, keys.Gossip, cfg.ClusterLabel
	gcfg.APIAddr = net.JoinHostPort(advertise, strconv.Itoa(port))
	gcfg.EngineAddr = engineAdvertise(cfg.EngineAdvertiseAddr, vllmURL, advertise)
	gcfg.Models = []string{cfg.Model}
	gcfg.RoutingStride = cfg.RoutingStride // peers of another stride probe our digest at its positions
	gcfg.Engine = route.EngineStarting     // serving once /health says so
	gcfg.Log = log.With().Str("component", "gossip").Logger()
	gcfg.LoadPushDelay = cfg.LoadPushDelay
	gcfg.LoadPushInterval = cfg.LoadPushInterval
	gcfg.ClaimPushInterval = cfg.ClaimPushInterval
	if cfg.ClaimPushInterval == 0 {
		gcfg.ClaimPushInterval = -1 // the flag's 0 is "at once", the config's is "as loads"
	}
	if cfg.LoadPushDelay == 0 {
		gcfg.LoadPushDelay = -1 // the flag's 0 is "at once", the config's is "default"
	}
	// The meta keeps gossip's default interval (1 s): load, engine state
	// and digest epoch reach peers by the direct push, and a meta update
	// every scrape (250 ms) outran memberlist's broadcast of the last one
	// ("timeout waiting for update broadcast", 2.4 a second per pod).
	mesh, err := gossip.Join(runCtx, gcfg)
	if err != nil {
		return fmt.Errorf("join mesh: %w", err)
	}
	defer mesh.Shutdown()
	// The exact count: peers pin requests to this pod's ranks only within
	// it (a digest's rank markers can be false positives).
	mesh.SetRanks(cfg.DPRanks)
	// The KV events the engine publishes as it computes tell a busy engine
	// whose /health answers late from a hung one.
	watcher := engine.NewWatcher(engine.Config{ProbeInterval: cfg.HealthInterval, ProbeTimeout: cfg.HealthTimeout,
		HungAfter: cfg.HungAfter, QuietFor: cfg.HungQuiet, Progress: func() uint64 { return sub.Stats().Received }}, vc, nil)

	models := newModelWatcher(vc, mesh, cfg.Model, cfg.ModelsInterval, reg, log.With().Str("component", "models").Logger())
	go models.run(runCtx) // exits when runCtx ends
	fcfg := forward.DefaultConfig()
	fcfg.IsAdapter = models.IsAdapter
	fcfg.Self, fcfg.VLLM, fcfg.Model, fcfg.Scheme = cfg.NodeName, vllmURL, cfg.Model, scheme
	fcfg.MaxBodyBytes, fcfg.HopKey = cfg.MaxBodyBytes, keys.Hop
	fcfg.LocalFailed, fcfg.ModelsChanged = watcher.Report, models.Kick
	fcfg.Route.PrefillTokensPerSecond = cfg.PrefillRate
	fcfg.Route.Slack, fcfg.Route.MinHeadroom, fcfg.Route.KVWeight = cfg.Slack, cfg.MinHeadroom, cfg.KVWeight
	fcfg.Route.IdleSlack, fcfg.Route.IdleHeadroom = cfg.IdleSlack, cfg.IdleHeadroom
	fcfg.Route.IdleLoadTokens = cfg.IdleLoadTokens
	fcfg.Route.CPULoadTokensPerSecond, fcfg.Route.DiskLoadTokensPerSecond = cfg.CPULoadRate, cfg.DiskLoadRate
	fcfg.MaxQueue, fcfg.MaxQueueWait, fcfg.MaxPrefillShare = cfg.MaxQueue, cfg.MaxQueueWait, cfg.MaxPrefillShare
	fcfg.StepTokens = cfg.StepTokens
	fcfg.ServeRetry = cfg.ServeRetry
	fcfg.BodyTimeout, fcfg.WriteTimeout = cfg.BodyTimeout, cfg.WriteTimeout
	fcfg.Ranks, fcfg.PlaceRanks = cfg.DPRanks, cfg.PlaceRanks
	fcfg.NoShortlist = !cfg.Shortlist
	switch cfg.RouteLoad {
	case "requests":
		fcfg.Route.QueuedWeight = 0
	case "lmetric":
		fcfg.Route.ProductCost = true
	}
	tok := adapterFallback{tokenizer{vc}}
	front := forward.New(fcfg, mesh, tok, forward.NewMetrics(reg), log.With().Str("component", "forward").Logger())
	front.SetLocalReady(false) // until the engine is seen healthy
	front.SetRenderer(renderer{vc})
	front.SetStored(mesh)
	if cfg.TextPrefixKeys > 0 {
		text := textroute.New(textroute.Config{Model: cfg.Model, Scheme: scheme, MaxKeys: cfg.TextPrefixKeys,
			WholeOnly: !cfg.TextPrefixCompose, VerifyEvery: cfg.TextPrefixVerify}, tok, reg)
		front.SetTextPrefixes(text, cfg.TextPrefixIDs)
		// Learned prefixes go to every peer, and theirs come here: a
		// conversation's next turn enters a random sidecar.
		mesh.OnTextPrefix(func(p gossip.TextPrefix) {
			text.Accept(textprefix.Hash(p.Hash), textprefix.Entry{Keys: p.Keys, Tokens: p.Tokens, Bytes: p.Bytes,
				Chained: p.Chained, Composed: p.Composed, Last: p.Last, Tail: p.Tail})
		})
		text.SetShare(func(h textprefix.Hash, e textprefix.Entry) {
			if err := mesh.ShareTextPrefix(gossip.TextPrefix{Hash: uint64(h), Tokens: e.Tokens, Bytes: e.Bytes, Keys: e.Keys,
				Chained: e.Chained, Composed: e.Composed, Last: e.Last, Tail: e.Tail}); err != nil {
				log.Debug().Err(err).Msg("text prefix not shared")
			}
		})
		go text.Run(runCtx) // exits when runCtx ends
	}

	ccfg := cachestate.DefaultConfig()
	ccfg.Node, ccfg.PublishInterval, ccfg.Replay = cfg.NodeName, cfg.DigestInterval, cfg.EventsReplayEndpoint != ""
	ccfg.Params = bloom.ParamsFor(capacity/max(cfg.RoutingStride, 1)+1, cfg.FPRate)
	ccfg.SilenceWindow, ccfg.SilenceTokens, ccfg.OnServing = cfg.SilenceWindow, cfg.BlockSize, models.Kick
	cs := cachestate.New(ccfg, ix, mesh, front, cachestate.NewMetrics(reg), log.With().Str("component", "index").Logger())
	registerViews(reg, ix, sub, mesh, cs)
	scrapes := make(chan vllmclient.Load, 1)
	go watcher.Run(runCtx)                                         // exits when runCtx ends
	go cs.Run(runCtx, sub.Items(), watcher.Transitions(), scrapes) // exits when runCtx ends
	rc := &rankCheck{flag: cfg.DPRanks, set: func(n int) { mesh.SetRanks(n); front.SetRanks(n) }, log: log}
	go watchLoad(runCtx, vc, mesh, scrapes, metrics, cfg.LoadInterval, rc, log) // exits when runCtx ends
	go front.WatchEngines(runCtx, 2*time.Second)                                // exits when runCtx ends

	gin.SetMode(gin.ReleaseMode)
	engine := gin.New()
	engine.Use(recovery(log))
	front.Register(engine)
	engine.NoRoute(models.watch(front.Passthrough))
	api := &http.Server{Addr: cfg.Listen, Handler: engine, ReadHeaderTimeout: 10 * time.Second}

	ad := newAdmin(cfg, reg, mesh, front, cs, log)
	adminSrv := &http.Server{Addr: cfg.AdminListen, Handler: ad.mux(), ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 2)
	for _, s := range []*http.Server{api, adminSrv} {
		ln, err := net.Listen("tcp", s.Addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", s.Addr, err)
		}
		go func() { errc <- s.Serve(ln) }() // exits when the server is shut down
	}
	log.Info().Str("listen", cfg.Listen).Str("admin", cfg.AdminListen).Str("model", cfg.Model).
		Int("capacity_blocks", capacity).Uint64("digest_bits", ccfg.Params.M).Strs("join", cfg.Join).Msg("kvroute sidecar serving")

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("server stopped: %w", err)
	}
	ad.drain(context.Background())
	// In a pod being deleted, vLLM has exited before its native sidecar
	// is stopped: say that its stored responses went with it, so peers
	// answer their follow-ups with the final 404 at once. A sidecar
	// restarting beside a live vLLM says nothing.
	gctx, gcancel := context.WithTimeout(context.Background(), time.Second)
	if front.LocalEngineGone(gctx) {
		log.Info().Msg("local vLLM not listening: telling peers its stored responses are gone")
		mesh.SetStoreGone()
	}
	gcancel()
	if err := mesh.Leave(5 * time.Second); err != nil {
		log.Warn().Err(err).Msg("leave mesh")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	api.Shutdown(sctx)
	adminSrv.Shutdown(sctx)
	log.Info().Msg("sidecar stopped")
	return nil
}

// renderer adapts the vLLM client's render endpoints to the front's.
type renderer struct{ c *vllmclient.Client }

func (r renderer) Render(ctx context.Context, path string, body []byte) ([]forward.Rendered, bool, error) {
	rs, err := r.c.Render(ctx, path, body)
	if errors.Is(err, vllmclient.ErrNoRender) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	out := make([]forward.Rendered, len(rs))
	for i, x := range rs {
		out[i].Tokens = x.Tokens
		for _, m := range x.MM {
			out[i].MM = append(out[i].MM, blockkey.MM{ID: m.ID, Offset: m.Offset, Length: m.Length})
		}
	}
	return out, true, nil
}

// tokenizer adapts the vLLM client to the front's Tokenizer.
type tokenizer struct{ c *vllmclient.Client }

func (t tokenizer) Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error) {
	return t.c.Tokenize(ctx, vllmclient.TokenizeRequestFor(p))
}

// watchLoad scrapes the local vLLM's /metrics every interval, advertises
// its load and hands the scrape to the cache state (restart and silence
// signals); it exits when ctx is done. Health is the engine watcher's job.
func watchLoad(ctx context.Context, vc *vllmclient.Client, mesh *gossip.Mesh, scrapes chan vllmclient.Load, m *sidecarMetrics, every time.Duration, rc *rankCheck, log zerolog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// Not the interval: a busy vLLM (or machine) answers /metrics slower
		// than that, and a scrape that always times out blinds the silence
		// and restart checks along with the load.
		cctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		l, err := vc.Load(cctx)
		cancel()
		if err != nil {
			m.loadErrors.Inc()
			log.Debug().Err(err).Msg("local vLLM load scrape failed")
		} else {
			mesh.SetLoad(route.Load{Running: int(l.Running), Waiting: int(l.Waiting), KVUsage: l.KVUsage})
			rc.observe(l.Engines)
			select { // the newest scrape replaces one not yet taken
			case <-scrapes:
			default:
			}
			scrapes <- l
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recovery answers a panicking handler with an OpenAI-style 500 and keeps
// the process alive; http.ErrAbortHandler (a client gone mid-stream) is
// expected and not logged.
func recovery(log zerolog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				log.Error().Interface("panic", r).Str("path", c.Request.URL.Path).Msg("handler panicked")
				if !c.Writer.Written() {
					c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": gin.H{
						"message": "internal error", "type": "InternalServerError", "param": nil, "code": 500}})
				}
			}
		}()
		c.Next()
	}
}

// engineAdvertise is the address peers are told to reach the local vLLM
// at (gossip.Config.EngineAddr): the flag's, none for "none", else
// --vllm-url's, with a loopback host replaced by the advertised IP (vLLM
// then has to listen on the pod IP too, as the manifests' does; peers
// check that they can reach it before they rely on it).
func engineAdvertise(flagVal string, vllm *url.URL, advertise string) string {
	switch flagVal {
	case "none":
		return ""
	case "":
	default:
		return flagVal
	}
	if vllm.Scheme != "http" {
		return "" // peers ask over plain HTTP
	}
	host, port := vllm.Hostname(), vllm.Port()
	if port == "" {
		port = "80"
	}
	if host == "localhost" || net.ParseIP(host).IsLoopback() {
		if advertise == "" {
			return ""
		}
		host = advertise
	}
	return net.JoinHostPort(host, port)
}
