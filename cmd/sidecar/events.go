package main

import (
	"bufio"
	"bytes"
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
// SIGINT or SIGTERM. An event's object carries every wire field the
// decoder knows for its kind, null when the event did not send it (bin
// values in extra_keys print as base64, as encoding/json writes []byte).
func runEvents(args []string, stdout, stderr io.Writer) error {
	cfg := vllmclient.DefaultConfig()
	fs := flag.NewFlagSet("sidecar events", flag.ContinueOnError)
	cli.Usage(fs, "sidecar events [flags]",
		"Prints a vLLM KV-event stream as JSON lines on stdout, one per event or notice (gap,\n"+
			"restart, decode error), until --count events, SIGINT or SIGTERM: a debugging tap.\n"+
			"An event line carries every field of its kind, null where the event sent none.")
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

// line shapes, field order as printed. An event line is eventHead
// followed by the event's wire fields (kvevent.Event.Fields).
type (
	eventHead struct {
		Kind   string  `json:"kind"`
		Topic  string  `json:"topic"`
		Seq    uint64  `json:"seq"`
		TS     float64 `json:"ts"`
		DPRank int64   `json:"dp_rank"`
		Type   string  `json:"type"`
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
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // topics and errors stay readable
	var err error
	switch it.Kind {
	case vllmclient.KindGap:
		err = enc.Encode(gapLine{"gap", it.Stream.Topic, it.Expected, it.Got})
	case vllmclient.KindRestart:
		err = enc.Encode(restartLine{"restart", it.Stream.Topic, it.Seq})
	case vllmclient.KindDecodeError:
		err = enc.Encode(errorLine{"error", it.Stream.Topic, it.Seq, errString(it.Err)})
	case vllmclient.KindBatch:
	default:
		return 0, nil
	}
	if it.Kind != vllmclient.KindBatch {
		if err == nil {
			_, err = w.Write(buf.Bytes())
		}
		return 0, err
	}
	b := it.Batch
	h := eventHead{Kind: "event", Topic: it.Stream.Topic, Seq: b.Seq, TS: b.TS, DPRank: int64(it.Stream.Rank)}
	if b.DPRank != nil {
		h.DPRank = *b.DPRank
	}
	n := 0
	for i := range b.Events {
		if max > 0 && n >= max {
			break
		}
		buf.Reset()
		if err := eventLine(enc, &buf, h, &b.Events[i]); err != nil {
			return n, err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// eventLine writes e's line to buf through enc, which writes to buf: the
// head, then every field the decoder's table has, so a field added to
// kvevent is printed without a change here.
func eventLine(enc *json.Encoder, buf *bytes.Buffer, h eventHead, e *kvevent.Event) error {
	h.Type = e.Kind.String()
	if e.Kind == kvevent.Unknown {
		h.Type = e.Tag // show what arrived rather than "Unknown"
	}
	if err := enc.Encode(h); err != nil {
		return err
	}
	buf.Truncate(buf.Len() - len("}\n"))
	for name, v := range e.Fields() {
		buf.WriteByte(',')
		if err := enc.Encode(name); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // the encoder's newline
		buf.WriteByte(':')
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("event field %s: %w", name, err)
		}
		buf.Truncate(buf.Len() - 1)
	}
	buf.WriteString("}\n")
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
