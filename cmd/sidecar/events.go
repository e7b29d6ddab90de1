package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/vllmclient"
)

// runEvents implements `sidecar events`: subscribe to a vLLM KV-event stream
// and print one JSON object per event or notice until --count events,
// SIGINT or SIGTERM.
func runEvents(args []string, stdout, stderr io.Writer) error {
	cfg := vllmclient.DefaultConfig()
	fs := flag.NewFlagSet("sidecar events", flag.ContinueOnError)
	cli.Usage(fs, "sidecar events [flags]",
		"Prints a vLLM KV-event stream as JSON lines on stdout, one per event or notice (gap,\n"+
			"restart, decode error), until --count events, SIGINT or SIGTERM: a debugging tap.")
	fs.StringVar(&cfg.Endpoint, "endpoint", cfg.Endpoint, "vLLM KV-event PUB endpoint")
	fs.BoolVar(&cfg.Bind, "bind", cfg.Bind, "bind the endpoint (for a vLLM that connects out)")
	fs.StringVar(&cfg.Topic, "topic", cfg.Topic, "topic prefix to subscribe to")
	fs.StringVar(&cfg.ReplayEndpoint, "replay-endpoint", cfg.ReplayEndpoint, "vLLM replay ROUTER endpoint (empty: no replay)")
	fs.IntVar(&cfg.DPRanks, "dp-ranks", cfg.DPRanks, "data-parallel ranks (endpoint port + rank)")
	count := fs.Int("count", 0, "exit after this many events (0: run until signalled)")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		if errors.Is(err, cli.ErrDone) {
			return nil
		}
		return exitError{code: 2, err: err}
	}
	if fs.NArg() > 0 {
		return exitError{code: 2, err: fmt.Errorf("events: unexpected argument %q", fs.Arg(0))}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return printEvents(ctx, cfg, *count, stdout)
}

// printEvents subscribes with cfg and writes lines to w until ctx is done or
// count events (0: no limit) were written.
func printEvents(ctx context.Context, cfg vllmclient.Config, count int, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub, err := vllmclient.Subscribe(ctx, cfg)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	var werr error
	events := 0
	for it := range sub.Items() {
		if werr != nil || (count > 0 && events >= count) {
			continue // draining until the subscriber closes its sockets
		}
		n, err := writeItem(bw, it, remaining(count, events))
		events += n
		if err == nil {
			err = bw.Flush() // a line must reach a pipe reader as it happens
		}
		if err != nil {
			werr = err
			cancel()
		}
		if count > 0 && events >= count {
			cancel()
		}
	}
	if werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	return sub.Err()
}

func remaining(count, done int) int {
	if count == 0 {
		return 0
	}
	return count - done
}

// line shapes, field order as printed.
type (
	eventHead struct {
		Kind   string  `json:"kind"`
		Topic  string  `json:"topic"`
		Seq    uint64  `json:"seq"`
		TS     float64 `json:"ts"`
		DPRank int64   `json:"dp_rank"`
		Type   string  `json:"type"`
	}
	storedLine struct {
		eventHead
		BlockHashes []uint64 `json:"block_hashes"`
		Parent      *uint64  `json:"parent_block_hash"`
		TokenIDs    []uint32 `json:"token_ids"`
		BlockSize   int      `json:"block_size"`
		LoRAName    *string  `json:"lora_name"`
		Medium      *string  `json:"medium"`
	}
	removedLine struct {
		eventHead
		BlockHashes []uint64 `json:"block_hashes"`
		Medium      *string  `json:"medium"`
	}
	gapLine struct {
		Kind     string `json:"kind"`
		Topic    string `json:"topic"`
		Expected uint64 `json:"expected"`
		Got      uint64 `json:"got"`
	}
	restartLine struct {
		Kind  string `json:"kind"`
		Topic string `json:"topic"`
		Seq   uint64 `json:"seq"`
	}
	errorLine struct {
		Kind  string `json:"kind"`
		Topic string `json:"topic"`
		Seq   uint64 `json:"seq"`
		Error string `json:"error"`
	}
)

// writeItem writes it as JSON lines: one per event of a batch (at most max
// events when max > 0), one per notice. It returns the events written.
// dp_rank is the batch's data_parallel_rank, or the socket's rank when the
// batch omits it.
func writeItem(w io.Writer, it vllmclient.Item, max int) (int, error) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // topics and errors stay readable
	switch it.Kind {
	case vllmclient.KindGap:
		return 0, enc.Encode(gapLine{"gap", it.Stream.Topic, it.Expected, it.Got})
	case vllmclient.KindRestart:
		return 0, enc.Encode(restartLine{"restart", it.Stream.Topic, it.Seq})
	case vllmclient.KindDecodeError:
		return 0, enc.Encode(errorLine{"error", it.Stream.Topic, it.Seq, errString(it.Err)})
	case vllmclient.KindBatch:
	default:
		return 0, nil
	}
	b := it.Batch
	h := eventHead{Kind: "event", Topic: it.Stream.Topic, Seq: b.Seq, TS: b.TS, DPRank: int64(it.Stream.Rank)}
	if b.DPRank != nil {
		h.DPRank = *b.DPRank
	}
	n := 0
	for _, e := range b.Events {
		if max > 0 && n >= max {
			break
		}
		h.Type = e.Kind.String()
		var v any = h
		switch e.Kind {
		case kvevent.BlockStored:
			v = storedLine{h, orEmpty(e.BlockHashes), e.Parent, orEmpty(e.TokenIDs), e.BlockSize, e.LoRAName, e.Medium}
		case kvevent.BlockRemoved:
			v = removedLine{h, orEmpty(e.BlockHashes), e.Medium}
		case kvevent.AllBlocksCleared:
		default:
			h.Type = e.Tag // show what arrived rather than "Unknown"
			v = h
		}
		if err := enc.Encode(v); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// orEmpty makes a nil slice print as [] rather than null.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
