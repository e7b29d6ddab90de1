package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/vllmclient"
	zmq "github.com/pebbe/zmq4"
)

var updateEvents = flag.Bool("update-events", false, "rewrite testdata/events.golden")

func p[T any](v T) *T { return &v }

// eventItems covers every line shape: all three event types with set and
// nil optional fields (one BlockStored and one BlockRemoved with every
// field set), a hash above 2^63 (printed as an unsigned integer),
// a batch without dp rank, and each notice.
func eventItems() []vllmclient.Item {
	s := vllmclient.Stream{Topic: "kv@10.0.0.1@qwen", Rank: 1}
	return []vllmclient.Item{
		{Kind: vllmclient.KindBatch, Stream: s, Batch: kvevent.Batch{
			Topic: s.Topic, Seq: 41, TS: 1764403200.125, DPRank: p(int64(1)),
			Events: []kvevent.Event{
				{Kind: kvevent.BlockStored, Tag: "BlockStored", BlockHashes: []uint64{15760518052499183552, 7},
					TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: p("GPU")},
				{Kind: kvevent.BlockStored, Tag: "BlockStored", BlockHashes: []uint64{9}, Parent: p(uint64(7)),
					TokenIDs: []uint32{9, 10, 11, 12}, BlockSize: 4, LoRAName: p("Alice"), Medium: p("GPU")},
				{Kind: kvevent.BlockStored, Tag: "BlockStored", BlockHashes: []uint64{10}, BlockSize: 4, Medium: p("CPU")},
				{Kind: kvevent.BlockStored, Tag: "BlockStored", BlockHashes: []uint64{11}, Parent: p(uint64(10)),
					TokenIDs: []uint32{13, 14, 15, 16}, BlockSize: 4, LoRAID: p(int64(2)), Medium: p("GPU"),
					LoRAName: p("Bob"), ExtraKeys: [][]any{{"Bob", []any{"mm-hash", int64(0)}, []byte{1, 2}}, nil},
					GroupIdx: p(int64(1)), KVCacheSpecKind: p("sliding_window"), KVCacheSpecSlidingWindow: p(int64(4096)),
					Locality: p("local")},
			},
		}},
		{Kind: vllmclient.KindGap, Stream: s, Expected: 42, Got: 45},
		{Kind: vllmclient.KindBatch, Stream: s, Replayed: true, Batch: kvevent.Batch{
			Topic: s.Topic, Seq: 45, TS: 1764403201,
			Events: []kvevent.Event{
				{Kind: kvevent.BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{15760518052499183552}, Medium: p("GPU")},
				{Kind: kvevent.BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{9}},
				{Kind: kvevent.BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{11}, Medium: p("GPU"),
					GroupIdx: p(int64(1)), Locality: p("local")},
				{Kind: kvevent.AllBlocksCleared, Tag: "AllBlocksCleared"},
				{Kind: kvevent.Unknown, Tag: "BlockMoved"},
			},
		}},
		{Kind: vllmclient.KindRestart, Stream: s, Seq: 0},
		{Kind: vllmclient.KindDecodeError, Stream: s, Seq: 3, Err: errors.New(`decode batch seq 3: bad "tag"`)},
	}
}

func TestWriteItemGolden(t *testing.T) {
	var buf bytes.Buffer
	events := 0
	for _, it := range eventItems() {
		n, err := writeItem(&buf, it, 0)
		if err != nil {
			t.Fatalf("writeItem: %v", err)
		}
		events += n
	}
	if events != 9 {
		t.Errorf("events written = %d; want 9", events)
	}
	path := filepath.Join("testdata", "events.golden")
	if *updateEvents {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update-events to create it)", err)
	}
	if got := buf.String(); got != string(want) {
		t.Errorf("output differs from %s:\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestWriteItemEveryField checks that an event line is the head and then
// every field of the decoder's table, in its order and with the value the
// event holds, so the tap cannot fall behind the decoder again.
func TestWriteItemEveryField(t *testing.T) {
	head := []string{"kind", "topic", "seq", "ts", "dp_rank", "type"}
	seen := map[string]bool{}
	for _, it := range eventItems() {
		if it.Kind != vllmclient.KindBatch {
			continue
		}
		var buf bytes.Buffer
		if _, err := writeItem(&buf, it, 0); err != nil {
			t.Fatalf("writeItem: %v", err)
		}
		lines := strings.SplitAfter(buf.String(), "\n")
		for i, e := range it.Batch.Events {
			want := slices.Clone(head)
			wantVals := map[string]string{}
			for name, v := range e.Fields() {
				want = append(want, name)
				j, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				wantVals[name] = string(j)
				seen[name] = true
			}
			keys, vals := lineFields(t, lines[i])
			if !slices.Equal(keys, want) {
				t.Errorf("%s line keys = %v; want %v", e.Tag, keys, want)
			}
			for name, j := range wantVals {
				if vals[name] != j {
					t.Errorf("%s line %s = %s; want %s", e.Tag, name, vals[name], j)
				}
			}
		}
	}
	// The fields the tap used to omit.
	for _, name := range []string{"lora_id", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window", "locality"} {
		if !seen[name] {
			t.Errorf("no event line has %s", name)
		}
	}
}

// lineFields returns the top-level keys of a JSON object in the order they
// appear, and each one's raw value.
func lineFields(t *testing.T, line string) ([]string, map[string]string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("line %q: want an object (%v)", line, err)
	}
	var keys []string
	vals := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		k := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("line %q key %s: %v", line, k, err)
		}
		keys = append(keys, k)
		vals[k] = string(v)
	}
	return keys, vals
}

func TestWriteItemLimit(t *testing.T) {
	var buf bytes.Buffer
	n, err := writeItem(&buf, eventItems()[0], 2)
	if err != nil || n != 2 || strings.Count(buf.String(), "\n") != 2 {
		t.Errorf("writeItem(max 2) = %d, %v with %q; want 2 lines", n, err, buf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPrintEventsCount runs the tool against a real PUB socket and checks
// that --count stops it cleanly after exactly that many event lines.
func TestPrintEventsCount(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()

	cfg := vllmclient.LocalConfig()
	cfg.Endpoint = ep
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- printEvents(context.Background(), cfg, 4, &out) }()

	// Publish 3-event batches until the tool has printed 4 events and quit
	// (the first batches may be lost to the slow joiner).
	b := eventItems()[0].Batch
	deadline := time.After(10 * time.Second)
	for seq := uint64(0); ; seq++ {
		b.Seq = seq
		f, err := kvevent.EncodeFrames(b, kvevent.MapEncoding)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.SendMessage(f[0], f[1], f[2]); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("printEvents: %v", err)
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != 4 {
				t.Fatalf("printed %d lines; want 4:\n%s", len(lines), out.String())
			}
			for _, l := range lines {
				if !strings.HasPrefix(l, `{"kind":"event","topic":"kv@10.0.0.1@qwen","seq":`) {
					t.Errorf("line %s; want an event line", l)
				}
			}
			return
		case <-deadline:
			t.Fatalf("tool did not stop; output so far:\n%s", out.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func TestRunEventsUsage(t *testing.T) {
	var ec exitCoder
	if err := run([]string{"events", "--no-such-flag"}, io.Discard); !errors.As(err, &ec) || ec.ExitCode() != 2 {
		t.Errorf("run(events --no-such-flag) = %v; want usage error with exit 2", err)
	}
}
