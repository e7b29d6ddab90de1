// Command kvproxy is the central proxy of the baseline routers kvroute is
// compared with (package baseline): round-robin, least-loaded, chwbl,
// approx-prefix and central-precise, in front of vLLM pods (the simulators
// of a chaos cluster).
//
//	kvproxy --listen 127.0.0.1:8000 --policy chwbl --model sim-model \
//	  --backends http://127.0.0.2:8001,http://127.0.0.3:8001
//
// central-precise also needs every pod's KV-event endpoints (--events, and
// --replay and --topics to start complete). Every answer carries
// x-kvroute-served-by with the pod's name (--names, default pod1..podN).
// It routes completions (a batch of prompts too), chat, Anthropic Messages
// (/v1/messages) and OpenAI Responses (/v1/responses); a Responses
// follow-up naming previous_response_id, GET /v1/responses/{id} and its
// cancel go to the pod that created the response, whatever the policy.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/baseline"
	"github.com/kvroute/kvroute/cmd/internal/cli"
)

type options struct {
	Listen   string
	Shutdown time.Duration
	Proxy    baseline.Config
}

// splitList splits a comma-separated flag value; "" is no items.
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// parseFlags turns the command line into options; it never exits. --help
// and --version print to stdout and return cli.ErrDone; a flag error is
// printed to stderr with the usage.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	d := baseline.DefaultConfig()
	o := options{Proxy: d}
	fs := flag.NewFlagSet("kvproxy", flag.ContinueOnError)
	cli.Usage(fs, "kvproxy --policy NAME --backends URL,URL... [flags]",
		"A central proxy in front of vLLM pods running one of the baseline routers kvroute is\n"+
			"measured against ("+strings.Join(baseline.Names, ", ")+").\n"+
			"Every answer carries x-kvroute-served-by with the serving pod's name.")
	var backends, names, events, replay, topics string
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8000", "address to serve the OpenAI API on")
	fs.StringVar(&o.Proxy.Policy, "policy", "", "one of "+strings.Join(baseline.Names, ", "))
	fs.StringVar(&backends, "backends", "", "comma-separated vLLM base URLs")
	fs.StringVar(&names, "names", "", "comma-separated pod names, one per backend (default pod1..podN)")
	fs.StringVar(&events, "events", "", "comma-separated KV-event endpoints, one per backend (central-precise)")
	fs.StringVar(&replay, "replay", "", "comma-separated KV-event replay endpoints, one per backend (optional)")
	fs.StringVar(&topics, "topics", "", "comma-separated KV-event topics, one per backend (optional)")
	fs.StringVar(&o.Proxy.Model, "model", "", "served base model name (central-precise seeds block keys with it)")
	fs.IntVar(&o.Proxy.BlockSize, "block-size", d.BlockSize, "vLLM block size in tokens")
	fs.Uint64Var(&o.Proxy.Seed, "seed", 1, "seed for approx-prefix's random tie-breaking")
	fs.DurationVar(&o.Proxy.ScrapeInterval, "scrape-interval", d.ScrapeInterval, "how often pods' /metrics are scraped (approx-prefix, central-precise)")
	fs.DurationVar(&o.Shutdown, "shutdown-timeout", 10*time.Second, "grace period for open requests on SIGTERM")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	urls := splitList(backends)
	if len(urls) == 0 {
		return o, errors.New("--backends is required")
	}
	lists := map[string][]string{"--names": splitList(names), "--events": splitList(events),
		"--replay": splitList(replay), "--topics": splitList(topics)}
	for flagName, l := range lists {
		if l != nil && len(l) != len(urls) {
			return o, fmt.Errorf("%s has %d items for %d backends", flagName, len(l), len(urls))
		}
	}
	at := func(l []string, i int) string {
		if l == nil {
			return ""
		}
		return l[i]
	}
	for i, u := range urls {
		b := baseline.Backend{URL: u, Name: at(lists["--names"], i), Events: at(lists["--events"], i),
			Replay: at(lists["--replay"], i), Topic: at(lists["--topics"], i)}
		if b.Name == "" {
			b.Name = fmt.Sprintf("pod%d", i+1)
		}
		o.Proxy.Backends = append(o.Proxy.Backends, b)
	}
	return o, nil
}

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Stdout, os.Stderr))
}

// cmdMain is the program with its streams; it returns the exit status.
func cmdMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return cli.Fail("kvproxy", err, stderr)
	}
	log := zerolog.New(stderr).With().Timestamp().Str("component", "kvproxy").Logger()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error().Err(err).Msg("exit")
		return 1
	}
	return 0
}

// run serves until ctx is done, then lets open requests finish for
// o.Shutdown.
func run(ctx context.Context, o options, log zerolog.Logger) error {
	p, err := baseline.New(o.Proxy)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(runCtx) }()
	hs := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Str("policy", o.Proxy.Policy).Int("backends", len(o.Proxy.Backends)).Msg("listening")

	var result error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		result = fmt.Errorf("serve: %w", err)
	case err := <-runErr:
		if err != nil {
			result = err
		}
		runErr <- nil // the shutdown below waits on it
	}
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), o.Shutdown)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && result == nil {
		result = fmt.Errorf("shutdown: %w", err)
	}
	cancelRun()
	<-runErr
	for _, s := range p.Stats() {
		log.Info().Str("pod", s.Name).Int("served", s.Served).Int("stored", s.Stored).Int("index_keys", s.IndexKeys).Msg("stats")
	}
	return result
}
