// Command vllm-sim stands in for `vllm serve` where no GPU is available: it
// serves vLLM's OpenAI API, /tokenize, /metrics and /health over HTTP and
// publishes KV-cache events over ZMQ with vLLM's framing and replay socket,
// driven by the simulated engine in package vllmsim.
//
// Flags use vLLM's names (--port, --served-model-name, --block-size,
// --kv-events-config '<json>', ...); simulator-only flags start with --sim-.
// Admin endpoints under /sim/ expose ground truth and inject faults.
//
// LoRA: --lora-modules name=path ... serves adapters as extra models
// (/v1/models lists them with their parent), and with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING set, /v1/load_lora_adapter and
// /v1/unload_lora_adapter change them at run time. An adapter's name enters
// every block hash and its BlockStored events, as in vLLM.
//
// --data-parallel-size N runs N engine cores behind the one API server,
// each with its own cache and publisher at the event endpoint's port + rank
// (data_parallel_rank in every batch); a request goes to the rank with the
// lowest 4*waiting + running, vLLM's rule.
//
// The HTTP layer is package simhttp (its doc lists the endpoints); this
// command is flags and wiring: --enable-scale-out (or
// VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1) serves the render endpoints, and
// VLLM_ENABLE_RESPONSES_API_STORE=1 keeps Responses, as in vLLM.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/simhttp"
	"github.com/kvroute/kvroute/vllmsim"
)

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Stdout, os.Stderr))
}

// cmdMain is the program with its streams; it returns the exit status.
func cmdMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, os.LookupEnv, stdout, stderr)
	if err != nil {
		return cli.Fail("vllm-sim", err, stderr)
	}
	log := zerolog.New(stderr).With().Timestamp().Str("component", "vllm-sim").Logger()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error().Err(err).Msg("exit")
		return 1
	}
	return 0
}

// engineConfig applies the flags to the engine's defaults.
func engineConfig(o options, base vllmsim.Config) vllmsim.Config {
	c := base
	c.Model = o.Models[0]
	c.BlockSize = o.BlockSize
	if o.NumGPUBlocks > 0 {
		c.NumGPUBlocks = o.NumGPUBlocks
	}
	if o.MaxNumSeqs > 0 {
		c.MaxNumSeqs = o.MaxNumSeqs
	}
	if o.MaxBatched > 0 {
		c.MaxNumBatchedTokens = o.MaxBatched
	}
	if o.MaxModelLen > 0 {
		c.MaxModelLen = o.MaxModelLen
	}
	c.HashAlgo = o.HashAlgo
	c.HashSeed, c.HashSeedSet = o.HashSeed, o.HashSeedSet
	c.TimeScale = o.TimeScale
	c.TokenizerMemoBytes = o.TokenizeMemoMiB << 20
	if o.OffloadGiB > 0 {
		c.Offload = vllmsim.Offload{Backend: o.OffloadBackend, Blocks: o.offloadBlocks()}
		// The copy time follows the block's bytes, so an overridden model
		// size loads at the same link rate.
		c.Timing.LoadPerToken = vllmsim.LoadPerToken(o.KVBytesPerBlock / o.BlockSize)
	}
	return c
}

// serverConfig applies the flags to the HTTP layer's defaults.
func serverConfig(o options, maxModelLen int, cost *vllmsim.TokenizeCost) simhttp.Config {
	c := simhttp.DefaultConfig()
	c.Models, c.Root, c.LoRAs, c.RuntimeLoRA = o.Models, o.Model, o.LoRAs, o.RuntimeLoRA
	c.MaxModelLen, c.Echo, c.RestartDowntime, c.BodyLimitBytes = maxModelLen, o.Echo, o.RestartDown, o.BodyLimitBytes
	c.TokenizeCost, c.ChatTemplate = cost, o.ChatTemplate
	c.ScaleOut, c.ResponsesStore, c.StoreLimit = o.ScaleOut, o.ResponsesStore, o.StoreLimit
	return c
}

// run serves until ctx is done, then drains: /health turns 503, open
// requests get ShutdownWait to finish, the engine stops, the sockets close.
func run(ctx context.Context, o options, log zerolog.Logger) error {
	engCtx, cancelEng := context.WithCancel(context.Background())
	defer cancelEng()

	cfg := engineConfig(o, vllmsim.DefaultConfig())
	dp := &ranks{}
	var pubs publishers
	for rank := range o.DataParallel {
		rc := cfg
		if o.Events.publishing() {
			pc, err := o.pubConfig().forRank(rank)
			if err != nil {
				return err
			}
			pub, err := startPublisher(engCtx, pc)
			if err != nil {
				return err
			}
			pubs = append(pubs, pub)
			rc.EventSink = pub.Sink
			addr, replay := pub.Endpoints()
			// Exactly one side of a ZMQ pair binds; say which this one is, so a
			// subscriber that also connects (or also binds) is easy to spot.
			msg := "kv events: PUB connects to " + addr + " (the subscriber must bind it)"
			if bindsPub(pc.Endpoint) {
				msg = "kv events: PUB binds " + addr + " (subscribers connect)"
			}
			log.Info().Int("rank", rank).Str("pub", addr).Bool("pub_bound", bindsPub(pc.Endpoint)).Str("replay", replay).
				Str("topic", o.Events.Topic).Msg(msg)
		}
		eng, err := vllmsim.New(rc)
		if err != nil {
			return fmt.Errorf("engine rank %d: %w", rank, err)
		}
		dp.engs = append(dp.engs, eng)
	}
	var events simhttp.Events
	if len(pubs) > 0 {
		events = pubs
	}
	engDone := make(chan error, len(dp.engs))
	for _, eng := range dp.engs {
		go func() { engDone <- eng.Run(engCtx) }() // exits when engCtx ends
	}
	stats := make([]func() vllmsim.Stats, len(dp.engs))
	for i, eng := range dp.engs {
		stats[i] = eng.Stats
	}
	met := simhttp.NewMetrics(o.Models[0], stats, simhttp.CacheInfo{BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks, HashAlgo: cfg.HashAlgo})
	if len(pubs) > 0 {
		registerPublisherMetrics(met, pubs.Stats)
	}
	cost := vllmsim.NewTokenizeCost(time.Duration(o.TokenizeUS*1e3), o.TokenizeWorkers)
	met.RegisterTokenizer(cost.Stats)
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		// vLLM's API server tokenizes on worker threads beside the event
		// loop that reads requests. With one P (a simulator pinned to one
		// CPU), a tokenization would keep the HTTP server from reading
		// the next request until the scheduler preempts it, which no
		// vLLM does: requests waited up to ~15 ms before their handler ran.
		runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 1+o.TokenizeWorkers))
	}
	srv := simhttp.New(serverConfig(o, cfg.MaxModelLen, cost), dp, dp.engs[0].Tokenizer(), events, met)

	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Strs("models", o.Models).Msg("listening")

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case err := <-engDone:
		return fmt.Errorf("engine stopped: %w", err)
	}
	log.Info().Msg("shutting down")
	srv.SetDraining()
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownWait)
	defer cancel()
	shutErr := hs.Shutdown(sctx)
	cancelEng()
	for range dp.engs {
		if err := <-engDone; err != nil && !errors.Is(err, context.Canceled) {
			log.Warn().Err(err).Msg("engine")
		}
	}
	for _, pub := range pubs {
		if err := pub.Wait(); err != nil {
			log.Warn().Err(err).Msg("publisher")
		}
	}
	if shutErr != nil {
		return fmt.Errorf("http shutdown: %w", shutErr)
	}
	return nil
}
