package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// MooncakeBlockTokens is the block size of the Mooncake FAST'25 traces'
// hash_ids.
const MooncakeBlockTokens = 512

// maxTraceLine bounds one JSONL line; the largest line of the published
// traces is a few kilobytes.
const maxTraceLine = 4 << 20

// TraceRecord is one line of a Mooncake trace.
type TraceRecord struct {
	// Timestamp is milliseconds since the trace start.
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ErrTrace marks a malformed trace file.
var ErrTrace = errors.New("malformed trace")

// ParseMooncake reads a Mooncake JSONL trace (timestamp, input_length,
// output_length, hash_ids of 512-token blocks). Blank lines are skipped.
// It rejects, with the line number, a line that is not such an object or
// whose hash_ids cannot cover its input_length.
func ParseMooncake(r io.Reader) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w: %v", line, ErrTrace, err)
		}
		if err := rec.check(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w: %v", line, ErrTrace, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return out, nil
}

func (t TraceRecord) check() error {
	switch {
	case t.Timestamp < 0:
		return fmt.Errorf("timestamp %d < 0", t.Timestamp)
	case t.InputLength < 1:
		return fmt.Errorf("input_length %d < 1", t.InputLength)
	case t.OutputLength < 0:
		return fmt.Errorf("output_length %d < 0", t.OutputLength)
	case len(t.HashIDs) < (t.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens:
		return fmt.Errorf("%d hash_ids cannot cover input_length %d", len(t.HashIDs), t.InputLength)
	}
	return nil
}

// BlockTokens returns the fixed pseudo-random block of n tokens that trace
// hash id stands for under seed. Equal ids give equal blocks, so requests
// that share leading hash ids share a token prefix, as in the trace.
func BlockTokens(seed uint64, id int64, n int) []uint32 {
	out := make([]uint32, n)
	x := seed ^ (uint64(id)+1)*0x9e3779b97f4a7c15
	for i := range out {
		x += 0x9e3779b97f4a7c15
		out[i] = tokenBase + uint32(mix64(x)%tokenSpan)
	}
	return out
}

// mix64 is splitmix64's finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// TracePrompt is a trace request's prompt, built on demand: a whole trace
// materialised would take gigabytes.
type TracePrompt struct {
	Seed    uint64
	HashIDs []int64
	Length  int // tokens; the last block is cut to fit
}

// Tokens materialises the prompt.
func (p TracePrompt) Tokens() []uint32 {
	out := make([]uint32, 0, p.Length)
	for _, id := range p.HashIDs {
		if len(out) >= p.Length {
			break
		}
		out = append(out, BlockTokens(p.Seed, id, min(MooncakeBlockTokens, p.Length-len(out)))...)
	}
	return out
}

// MooncakeParams control a trace replay.
type MooncakeParams struct {
	// TimeScale compresses the trace's clock: 2 replays it twice as fast.
	// Zero means 1.
	TimeScale float64
	// Seed picks the token content of the hash ids.
	Seed uint64
	// Duration stops the replay at this (compressed) offset; 0: whole trace.
	Duration time.Duration
	// MaxRequests caps the number of requests; 0: no cap.
	MaxRequests int
	// MaxPromptTokens skips longer requests (the server's context limit);
	// 0: no limit. MaxOutputTokens caps output_length; 0: as in the trace.
	MaxPromptTokens int
	MaxOutputTokens int
}

// Mooncake turns trace records into a schedule of /v1/completions requests
// with token-id prompts. It reports how many records it skipped for
// MaxPromptTokens.
func Mooncake(recs []TraceRecord, p MooncakeParams) (Schedule, int) {
	scale := p.TimeScale
	if scale <= 0 {
		scale = 1
	}
	s := Schedule{Workload: "mooncake"}
	skipped := 0
	for i, rec := range recs {
		at := time.Duration(float64(rec.Timestamp) * float64(time.Millisecond) / scale)
		if p.Duration > 0 && at >= p.Duration {
			break
		}
		if p.MaxRequests > 0 && len(s.Sessions) >= p.MaxRequests {
			break
		}
		out := max(1, rec.OutputLength)
		if p.MaxOutputTokens > 0 {
			out = min(out, p.MaxOutputTokens)
		}
		if p.MaxPromptTokens > 0 && rec.InputLength > p.MaxPromptTokens {
			skipped++
			continue
		}
		tp := &TracePrompt{Seed: p.Seed, HashIDs: rec.HashIDs, Length: rec.InputLength}
		s.Sessions = append(s.Sessions, Session{ID: sessionID("trace", i), At: at,
			Turns: []Turn{{Trace: tp, MaxTokens: out}}})
	}
	sortSessions(s.Sessions)
	return s, skipped
}
