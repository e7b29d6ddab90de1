package vllmclient

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/kvevent"
)

// op is one input to the sequencer in a table test.
type op struct {
	kind  string // start, live, replay, replay-old (no topic frame), done, fail
	topic string
	seq   uint64
	ts    float64 // batch ts; a live copy of a replayed batch has the same ts
	bad   bool    // payload did not decode
}

func live(topic string, seq uint64) op {
	return op{kind: "live", topic: topic, seq: seq, ts: float64(seq)}
}

func rep(topic string, seq uint64) op {
	return op{kind: "replay", topic: topic, seq: seq, ts: float64(seq)}
}

var (
	start = op{kind: "start"}
	done  = op{kind: "done"}
	fail  = op{kind: "fail"}
)

// trace renders a step as short lines: "b t 3" batch, "r t 3" replayed
// batch, "gap t 3 5", "restart t 0", "err t 4", "replay 3", "abort", "dup".
// A step's dups are listed after its items.
func trace(s step) []string {
	var out []string
	for _, it := range s.items {
		switch it.Kind {
		case KindBatch:
			p := "b"
			if it.Replayed {
				p = "r"
			}
			if it.Batch.Topic != it.Stream.Topic || it.Batch.TS != float64(it.Batch.Seq) {
				p += "!" // topic or payload mixed up
			}
			out = append(out, fmt.Sprintf("%s %s %d", p, it.Stream.Topic, it.Batch.Seq))
		case KindGap:
			out = append(out, fmt.Sprintf("gap %s %d %d", it.Stream.Topic, it.Expected, it.Got))
		case KindRestart:
			out = append(out, fmt.Sprintf("restart %s %d", it.Stream.Topic, it.Seq))
		case KindDecodeError:
			out = append(out, fmt.Sprintf("err %s %d", it.Stream.Topic, it.Seq))
		}
	}
	for range s.dups {
		out = append(out, "dup")
	}
	if s.abort {
		out = append(out, "abort")
	}
	if s.replay {
		out = append(out, fmt.Sprintf("replay %d", s.replayFrom))
	}
	return out
}

func TestSequencer(t *testing.T) {
	tests := []struct {
		name    string
		replay  bool
		topic   string
		holdMax int
		ops     []op
		want    []string
	}{
		{
			name: "in order",
			ops:  []op{live("t", 7), live("t", 8), live("t", 9)},
			want: []string{"b t 7", "b t 8", "b t 9"},
		},
		{
			name: "gap without replay",
			ops:  []op{live("t", 0), live("t", 1), live("t", 4), live("t", 5)},
			want: []string{"b t 0", "b t 1", "gap t 2 4", "b t 4", "b t 5"},
		},
		{
			name: "restart without replay",
			ops:  []op{live("t", 5), live("t", 6), live("t", 0), live("t", 1)},
			want: []string{"b t 5", "b t 6", "restart t 0", "b t 0", "b t 1"},
		},
		{
			// Another DP rank reported the restart: this rank's own is
			// silent, and the old engine's last batches still count.
			name: "expected restart is not reported again",
			ops:  []op{live("t", 5), {kind: "expect-restart"}, live("t", 6), live("t", 0), live("t", 1), live("t", 0)},
			want: []string{"b t 5", "b t 6", "b t 0", "b t 1", "restart t 0", "b t 0"},
		},
		{
			name:   "expected restart with replay: a new start above 0 replays from 0",
			replay: true,
			ops:    []op{start, done, live("t", 0), live("t", 1), {kind: "expect-restart"}, live("t", 2), live("t", 1), rep("t", 0), done},
			want:   []string{"replay 0", "b t 0", "b t 1", "b t 2", "replay 0", "r t 0", "b t 1"},
		},
		{
			name: "decode error keeps its place",
			ops:  []op{live("t", 0), {kind: "live", topic: "t", seq: 1, bad: true}, live("t", 2)},
			want: []string{"b t 0", "err t 1", "b t 2"},
		},
		{
			name: "streams are independent",
			ops:  []op{live("a", 0), live("b", 10), live("a", 1), live("b", 12), live("a", 0)},
			want: []string{"b a 0", "b b 10", "b a 1", "gap b 11 12", "b b 12", "restart a 0", "b a 0"},
		},
		{
			name:   "gap repaired by replay, live held meanwhile",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 3), live("t", 4),
				rep("t", 1), rep("t", 2), rep("t", 3), done, live("t", 5)},
			want: []string{"replay 0", "b t 0", "replay 1",
				"r t 1", "r t 2", "r t 3", "b t 4", "dup", "b t 5"},
		},
		{
			name:   "replay overlapping held and lagging live copies",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 2),
				rep("t", 1), rep("t", 2), rep("t", 3), rep("t", 4), done,
				live("t", 3), live("t", 4), live("t", 5), live("t", 6)},
			want: []string{"replay 0", "b t 0", "replay 1",
				"r t 1", "r t 2", "r t 3", "r t 4", "dup",
				"dup", "dup", "b t 5", "b t 6"},
		},
		{
			name:   "replayed duplicates and seqs already delivered are dropped",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 1), live("t", 3),
				rep("t", 2), rep("t", 2), done},
			want: []string{"replay 0", "b t 0", "b t 1", "replay 2", "r t 2", "dup", "b t 3"},
		},
		{
			name:   "incomplete replay reports the remaining gap",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 9),
				rep("t", 5), rep("t", 6), rep("t", 7), rep("t", 8), rep("t", 9), done},
			want: []string{"replay 0", "b t 0", "replay 1",
				"gap t 1 5", "r t 5", "r t 6", "r t 7", "r t 8", "r t 9", "dup"},
		},
		{
			name:   "empty replay: gap up to the held batch",
			replay: true,
			ops:    []op{start, done, live("t", 0), live("t", 4), live("t", 5), done},
			want:   []string{"replay 0", "b t 0", "replay 1", "gap t 1 4", "b t 4", "b t 5"},
		},
		{
			// Seq 5 is lost live while the replay of 1..3 runs; vLLM still
			// holds it, so a second replay fetches it instead of a Gap.
			name:   "batch lost during a replay is replayed too",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 4), live("t", 6), rep("t", 1), rep("t", 2), rep("t", 3),
				rep("t", 4), done, rep("t", 5), rep("t", 6), done, live("t", 7)},
			want: []string{"replay 0", "b t 0", "replay 1", "r t 1", "r t 2", "r t 3", "r t 4",
				"dup", "replay 5", "r t 5", "r t 6", "dup", "b t 7"},
		},
		{
			name:   "failed replay releases what it has",
			replay: true,
			ops:    []op{start, done, live("t", 0), live("t", 4), rep("t", 1), fail},
			want:   []string{"replay 0", "b t 0", "replay 1", "r t 1", "gap t 2 4", "b t 4", "abort"},
		},
		{
			name:    "hold overflow abandons the replay",
			replay:  true,
			holdMax: 2,
			ops:     []op{start, done, live("t", 0), live("t", 4), live("t", 5), live("t", 6)},
			want:    []string{"replay 0", "b t 0", "replay 1", "gap t 1 4", "b t 4", "b t 5", "b t 6", "abort"},
		},
		{
			name:   "start-up replay from 0 then live",
			replay: true,
			topic:  "kv",
			ops: []op{start, live("kv", 3), live("kv", 4),
				{kind: "replay-old", seq: 0, ts: 0}, {kind: "replay-old", seq: 1, ts: 1},
				{kind: "replay-old", seq: 2, ts: 2}, {kind: "replay-old", seq: 3, ts: 3}, done, live("kv", 5)},
			want: []string{"replay 0", "r kv 0", "r kv 1", "r kv 2", "r kv 3", "b kv 4", "dup", "b kv 5"},
		},
		{
			name:   "start-up replay with older batches gone",
			replay: true,
			ops:    []op{start, rep("t", 100), rep("t", 101), done, live("t", 102)},
			want:   []string{"replay 0", "gap t 0 100", "r t 100", "r t 101", "b t 102"},
		},
		{
			name:   "start-up replay timed out: first live above 0 is a gap from 0",
			replay: true,
			ops:    []op{start, live("t", 3), fail, live("t", 4)},
			want:   []string{"replay 0", "gap t 0 3", "b t 3", "abort", "b t 4"},
		},
		{
			// The start-up replay is answered before the publisher sent
			// anything; its first batch is lost live, the second held:
			// one more replay from 0 fetches the first.
			name:   "start-up replay answered empty while a batch is held: replayed from 0",
			replay: true,
			ops:    []op{start, live("t", 1), done, rep("t", 0), rep("t", 1), done},
			want:   []string{"replay 0", "replay 0", "r t 0", "r t 1", "dup"},
		},
		{
			name:   "start-up replay empty, and the one after it too: a gap",
			replay: true,
			ops:    []op{start, live("t", 3), done, done},
			want:   []string{"replay 0", "replay 0", "gap t 0 3", "b t 3"},
		},
		{
			name:   "new stream after start-up asks for replay from 0",
			replay: true,
			ops:    []op{start, done, live("t", 2), rep("t", 0), rep("t", 1), rep("t", 2), done},
			want:   []string{"replay 0", "replay 0", "r t 0", "r t 1", "r t 2", "dup"},
		},
		{
			name:   "restart with replay: new publisher replayed from 0",
			replay: true,
			ops: []op{start, done, live("t", 0), live("t", 1), live("t", 2),
				{kind: "live", topic: "t", seq: 1, ts: 1001}, rep("t", 0), {kind: "replay", topic: "t", seq: 1, ts: 1001}, done, live("t", 2)},
			want: []string{"replay 0", "b t 0", "b t 1", "b t 2",
				"restart t 1", "replay 0", "r t 0", "r! t 1", "dup", "b t 2"},
		},
		{
			name:   "restart right after a replay: same seq, different ts",
			replay: true,
			ops: []op{start, live("t", 0), rep("t", 0), rep("t", 1), done,
				{kind: "live", topic: "t", seq: 0, ts: 500}},
			want: []string{"replay 0", "r t 0", "r t 1", "dup", "restart t 0", "b! t 0"},
		},
		{
			name:   "replay for one stream does not hold another",
			replay: true,
			ops: []op{start, done, live("a", 0), live("b", 0), live("a", 2), live("b", 1), live("b", 3),
				rep("a", 1), rep("b", 2), done},
			want: []string{"replay 0", "b a 0", "b b 0", "replay 1", "b b 1", "gap b 2 3", "b b 3",
				"r a 1", "b a 2"},
		},
		{
			name:   "late reply after the replay ended is ignored",
			replay: true,
			ops:    []op{start, done, rep("t", 0), live("t", 0)},
			want:   []string{"replay 0", "dup", "b t 0"},
		},
		{
			name:   "replayed topic outside the prefix is filtered",
			replay: true,
			topic:  "kv@",
			ops:    []op{start, rep("other", 0), rep("kv@a", 0), done},
			want:   []string{"replay 0", "r kv@a 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			holdMax := tt.holdMax
			if holdMax == 0 {
				holdMax = 100
			}
			sq := newSequencer(0, tt.topic, tt.replay, holdMax)
			var got []string
			for _, o := range tt.ops {
				m := msg{topic: o.topic, seq: o.seq, batch: kvevent.Batch{TS: o.ts}}
				if o.bad {
					m.err = errors.New("bad payload")
				}
				var s step
				switch o.kind {
				case "start":
					s = sq.start()
				case "live":
					s = sq.live(m)
				case "replay":
					s = sq.replayed(m, true)
				case "replay-old":
					s = sq.replayed(m, false)
				case "done":
					s = sq.replayDone()
				case "fail":
					s = sq.replayFailed()
				case "expect-restart":
					sq.expectRestart()
				default:
					t.Fatalf("unknown op %q", o.kind)
				}
				got = append(got, trace(s)...)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("trace mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
