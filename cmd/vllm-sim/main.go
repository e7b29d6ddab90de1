// Command vllm-sim stands in for `vllm serve` where no GPU is available: it
// serves vLLM's OpenAI API, /tokenize, /metrics and /health over HTTP and
// publishes KV-cache events over ZMQ with vLLM's framing and replay socket,
// driven by the simulated engine in package vllmsim.
//
// Flags use vLLM's names (--port, --served-model-name, --block-size,
// --kv-events-config '<json>', ...); simulator-only flags start with --sim-.
// Admin endpoints under /sim/ expose ground truth and inject faults.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/vllmsim"
)

func main() {
	log := zerolog.New(os.Stderr).With().Timestamp().Str("component", "vllm-sim").Logger()
	o, err := parseFlags(os.Args[1:], os.LookupEnv, os.Stderr)
	if err != nil {
		log.Error().Err(err).Msg("bad flags")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error().Err(err).Msg("exit")
		os.Exit(1)
	}
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
	return c
}

// run serves until ctx is done, then drains: /health turns 503, open
// requests get ShutdownWait to finish, the engine stops, the sockets close.
func run(ctx context.Context, o options, log zerolog.Logger) error {
	engCtx, cancelEng := context.WithCancel(context.Background())
	defer cancelEng()

	cfg := engineConfig(o, vllmsim.DefaultConfig())
	var pub *publisher
	var events eventControl
	var pubStatsFn func() pubStats
	if o.Events.publishing() {
		var err error
		if pub, err = startPublisher(engCtx, o.pubConfig()); err != nil {
			return err
		}
		cfg.EventSink = pub.Sink
		events, pubStatsFn = pub, pub.Stats
		addr, replay := pub.Endpoints()
		log.Info().Str("pub", addr).Str("replay", replay).Str("topic", o.Events.Topic).Msg("kv events")
	}
	eng, err := vllmsim.New(cfg)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()

	met := newMetrics(o.Models[0], eng.Stats, cacheInfo{BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks, HashAlgo: cfg.HashAlgo}, pubStatsFn)
	srv := newServer(serverConfig{
		Models: o.Models, Root: o.Model, LoRAs: o.LoRAs, MaxModelLen: cfg.MaxModelLen, Echo: o.Echo,
		RestartDowntime: o.RestartDown, BodyLimitBytes: o.BodyLimitBytes,
		TokenizeCost: vllmsim.NewTokenizeCost(time.Duration(o.TokenizeUS*1e3), o.TokenizeWorkers),
	}, eng, eng.Tokenizer(), events, met)

	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: srv.handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
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
	if err := <-engDone; err != nil && !errors.Is(err, context.Canceled) {
		log.Warn().Err(err).Msg("engine")
	}
	if pub != nil {
		if err := pub.Wait(); err != nil {
			log.Warn().Err(err).Msg("publisher")
		}
	}
	if shutErr != nil {
		return fmt.Errorf("http shutdown: %w", shutErr)
	}
	return nil
}
