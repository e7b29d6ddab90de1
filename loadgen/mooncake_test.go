package loadgen

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func readTrace(t *testing.T, path string) []TraceRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ParseMooncake(f)
	if err != nil {
		t.Fatalf("ParseMooncake(%s): %v", path, err)
	}
	return recs
}

func TestParseMooncakeRealFiles(t *testing.T) {
	tests := []struct {
		file  string
		first TraceRecord
	}{
		{"testdata/conversation_head.jsonl", TraceRecord{Timestamp: 0, InputLength: 6758, OutputLength: 500,
			HashIDs: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}}},
		{"testdata/synthetic_head.jsonl", TraceRecord{Timestamp: 0, InputLength: 40160, OutputLength: 6,
			HashIDs: seq(0, 78)}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			recs := readTrace(t, tt.file)
			if len(recs) != 40 {
				t.Fatalf("%d records; want 40", len(recs))
			}
			if d := cmp.Diff(tt.first, recs[0]); d != "" {
				t.Errorf("first record (-want +got):\n%s", d)
			}
			for i, r := range recs {
				if want := (r.InputLength + 511) / 512; len(r.HashIDs) != want {
					t.Errorf("record %d: %d hash ids; want ceil(%d/512) = %d", i, len(r.HashIDs), r.InputLength, want)
				}
				if i > 0 && r.Timestamp < recs[i-1].Timestamp {
					t.Errorf("record %d: timestamp goes back", i)
				}
			}
		})
	}
}

func seq(a, b int64) []int64 {
	var out []int64
	for i := a; i <= b; i++ {
		out = append(out, i)
	}
	return out
}

func TestParseMooncakeErrors(t *testing.T) {
	tests := []struct{ name, in string }{
		{"not json", "hello\n"},
		{"array", "[1,2]\n"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`},
		{"negative output", `{"timestamp": 0, "input_length": 10, "output_length": -2, "hash_ids": [1]}`},
		{"too few hash ids", `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`},
		{"string field", `{"timestamp": "0", "input_length": 10, "output_length": 1, "hash_ids": [1]}`},
		{"second line bad", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}` + "\n{"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseMooncake(strings.NewReader(tt.in))
			if !errors.Is(err, ErrTrace) {
				t.Errorf("ParseMooncake(%q) error = %v; want ErrTrace", tt.in, err)
			}
		})
	}
	recs, err := ParseMooncake(strings.NewReader("\n" + `{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}` + "\n\n"))
	if err != nil || len(recs) != 1 {
		t.Errorf("blank lines: %v, %d records; want 1", err, len(recs))
	}
}

func TestBlockTokens(t *testing.T) {
	a := BlockTokens(1, 42, 512)
	if !slices.Equal(a, BlockTokens(1, 42, 512)) {
		t.Fatal("BlockTokens not deterministic")
	}
	if !slices.Equal(a[:100], BlockTokens(1, 42, 100)) {
		t.Error("a shorter block is not a prefix of the full one")
	}
	seen := map[uint32]bool{}
	for id := int64(0); id < 2000; id++ {
		b := BlockTokens(1, id, 512)
		if seen[b[0]] && slices.Equal(b[:8], BlockTokens(1, id-1, 8)) {
			t.Fatalf("ids %d and %d give the same block", id, id-1)
		}
		seen[b[0]] = true
		for _, x := range b {
			if x < tokenBase || x >= tokenBase+tokenSpan {
				t.Fatalf("token %d out of range", x)
			}
		}
	}
	if commonPrefix(BlockTokens(1, 7, 512), BlockTokens(2, 7, 512)) > 2 {
		t.Error("seeds 1 and 2 give the same block")
	}
	// Distinct ids give distinct first blocks (the whole point).
	firsts := map[[4]uint32]int64{}
	for id := int64(0); id < 5000; id++ {
		var k [4]uint32
		copy(k[:], BlockTokens(3, id, 4))
		if o, ok := firsts[k]; ok {
			t.Fatalf("ids %d and %d share their first 4 tokens", o, id)
		}
		firsts[k] = id
	}
}

func TestMooncakeSchedule(t *testing.T) {
	recs := readTrace(t, "testdata/conversation_head.jsonl")
	s, skipped := Mooncake(recs, MooncakeParams{TimeScale: 2, Seed: 9, MaxPromptTokens: 30000, MaxOutputTokens: 100})
	if skipped+len(s.Sessions) != len(recs) {
		t.Fatalf("%d sessions + %d skipped != %d records", len(s.Sessions), skipped, len(recs))
	}
	byID := map[string]TraceRecord{}
	for i, r := range recs {
		byID[sessionID("trace", i)] = r
	}
	var prev []uint32
	for _, x := range s.Sessions {
		r := byID[x.ID]
		if want := time.Duration(r.Timestamp) * time.Millisecond / 2; x.At != want {
			t.Errorf("%s at %v; want %v (time scale 2)", x.ID, x.At, want)
		}
		tu := x.Turns[0]
		p := tu.tokens()
		if len(p) != r.InputLength || r.InputLength > 30000 {
			t.Errorf("%s: prompt %d tokens; input_length %d", x.ID, len(p), r.InputLength)
		}
		if tu.MaxTokens != min(max(1, r.OutputLength), 100) {
			t.Errorf("%s: max tokens %d; output_length %d", x.ID, tu.MaxTokens, r.OutputLength)
		}
		// Every conversation-trace request starts with hash id 0.
		if prev != nil && commonPrefix(prev, p) < 512 {
			t.Errorf("%s shares %d tokens with the previous request; want >= 512", x.ID, commonPrefix(prev, p))
		}
		prev = p
	}
	if got := s.PromptTokens(); got == 0 {
		t.Error("PromptTokens() = 0")
	}
	syn := readTrace(t, "testdata/synthetic_head.jsonl")
	cut := time.Duration(syn[20].Timestamp) * time.Millisecond
	short, _ := Mooncake(syn, MooncakeParams{Duration: cut})
	for _, x := range short.Sessions {
		if x.At >= cut {
			t.Errorf("session at %v after the %v cut", x.At, cut)
		}
	}
	if len(short.Sessions) == 0 || len(short.Sessions) > 20 {
		t.Errorf("duration cut kept %d sessions; want 1..20", len(short.Sessions))
	}
	capped, _ := Mooncake(recs, MooncakeParams{MaxRequests: 5})
	if len(capped.Sessions) != 5 {
		t.Errorf("MaxRequests 5 gave %d sessions", len(capped.Sessions))
	}
}

func TestTracePromptSharing(t *testing.T) {
	a := TracePrompt{Seed: 1, HashIDs: []int64{5, 6, 7}, Length: 1100}.Tokens()
	b := TracePrompt{Seed: 1, HashIDs: []int64{5, 6, 8}, Length: 1500}.Tokens()
	if len(a) != 1100 || len(b) != 1500 {
		t.Fatalf("lengths %d, %d; want 1100, 1500", len(a), len(b))
	}
	if n := commonPrefix(a, b); n != 1024 {
		t.Errorf("prompts sharing two hash ids share %d tokens; want 1024", n)
	}
}

func FuzzParseMooncake(f *testing.F) {
	for _, p := range []string{"testdata/conversation_head.jsonl", "testdata/synthetic_head.jsonl"} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.SplitN(string(b), "\n", 3)
		f.Add([]byte(lines[0] + "\n" + lines[1]))
	}
	f.Add([]byte(`{"timestamp": 1e3, "input_length": 1, "output_length": 0, "hash_ids": [-1]}`))
	f.Add([]byte("{}\n\n{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := ParseMooncake(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		for _, r := range recs {
			if r.check() != nil {
				t.Fatalf("accepted invalid record %+v", r)
			}
		}
		s, _ := Mooncake(recs, MooncakeParams{MaxPromptTokens: 4096})
		for _, x := range s.Sessions {
			if n := len(x.Turns[0].tokens()); n > 4096 || n < 1 {
				t.Fatalf("prompt of %d tokens", n)
			}
		}
	})
}
