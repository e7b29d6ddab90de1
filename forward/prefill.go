package forward

import (
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/route"
)

// PrefillHeader carries, on a hop, the prompt tokens the sender predicted
// its target must compute. The target's sidecar counts them as its pod's
// queued prefill work (route.Load.QueuedPrefillTokens) without parsing the
// body: the sender already did. It is read only with a trusted hop header.
const PrefillHeader = "X-Kvroute-Prefill"

// maxPrefill caps what a hop may claim: more than any context vLLM serves.
const maxPrefill = 1 << 24

// withPrefill sets each target's prompt tokens and its predicted prefill
// work: the prompt less what the decision expected it to save there (a
// lower tier's tokens at their load's cost, route.Config.Work: loaded,
// not computed, but not free). For a non-streamed answer (stream false)
// it also sets how long the prefill should take there, the work queued
// ahead and its own at cfg's prefill rate (0: unknown, counted until the
// answer).
func withPrefill(ts []target, d route.Decision, promptTokens int, stream bool, cfg route.Config) {
	for i := range ts {
		work, queued := float64(promptTokens), 0
		for j := range d.Candidates {
			if c := &d.Candidates[j]; c.ID == ts[i].Peer || (ts[i].Peer == "" && c.Local) {
				work, queued = cfg.Work(c, promptTokens), c.Queued
				break
			}
		}
		ts[i].Prompt = max(promptTokens, 0)
		ts[i].Prefill = max(int(math.Ceil(work)), 0)
		if rate := cfg.PrefillTokensPerSecond; !stream && rate > 0 {
			ts[i].PrefillFor = time.Duration(float64(queued+ts[i].Prefill) / rate * float64(time.Second))
		}
	}
}

// prefillValue is PrefillHeader's value for t: "tokens", and for a
// non-streamed answer "; for=MS", how long the prefill should take.
func prefillValue(t target) string {
	v := strconv.Itoa(t.Prefill)
	if t.PrefillFor > 0 {
		v += "; for=" + strconv.FormatInt(max(t.PrefillFor.Milliseconds(), 1), 10)
	}
	return v
}

// hopPrefill reads a trusted hop's PrefillHeader and removes it, so that
// vLLM never sees it; a missing or malformed value counts as 0 tokens (a
// sender of an earlier version), a missing or malformed for as until the
// first byte.
func hopPrefill(r *http.Request) (tokens int, prefillFor time.Duration) {
	v := r.Header.Get(PrefillHeader)
	r.Header.Del(PrefillHeader)
	n, rest, _ := strings.Cut(v, ";")
	tokens, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || tokens < 0 {
		return 0, 0
	}
	if ms, ok := strings.CutPrefix(strings.TrimSpace(rest), "for="); ok {
		if d, err := strconv.ParseInt(ms, 10, 64); err == nil && d > 0 && d < 3600_000 {
			prefillFor = time.Duration(d) * time.Millisecond
		}
	}
	return min(tokens, maxPrefill), prefillFor
}

// firstByte calls fn once, when the first byte of the body has been read.
type firstByte struct {
	rc io.ReadCloser
	fn func()
}

func (f *firstByte) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if (n > 0 || err != nil) && f.fn != nil {
		f.fn()
		f.fn = nil
	}
	return n, err
}

func (f *firstByte) Close() error { return f.rc.Close() }

// firstOutput is firstByte for a Responses API stream: vLLM writes its
// response.created and response.in_progress events as soon as it takes the
// request, before the engine schedules it, so the prefill is done only at
// the first event after them (output_item.added comes with the first
// output). It reads each event's first line ("event: <type>"); a stream
// that never names one, or ends, calls fn too. Chat and Messages streams
// need no such care: vLLM's first chunk (the role, message_start) comes
// with the first output.
type firstOutput struct {
	rc   io.ReadCloser
	fn   func()
	line []byte // the current event's first line so far; nil while skipping to the event's end
	prev byte   // the byte before, to find an event's end ("\n\n")
	seen int    // bytes read
}

// maxPreamble bounds what firstOutput reads before it calls fn anyway:
// the two events before the output echo the request's instructions and
// tools, which stay far below it.
const maxPreamble = 1 << 20

func newFirstOutput(rc io.ReadCloser, fn func()) *firstOutput {
	return &firstOutput{rc: rc, fn: fn, line: []byte{}}
}

func (f *firstOutput) Read(p []byte) (int, error) {
	n, err := f.rc.Read(p)
	if f.fn == nil {
		return n, err
	}
	f.seen += n
	if err != nil || f.seen > maxPreamble || f.scan(p[:n]) {
		f.fn()
		f.fn = nil
	}
	return n, err
}

// scan reads b and reports whether an event other than the preamble's
// has begun.
func (f *firstOutput) scan(b []byte) bool {
	for _, c := range b {
		if c == '\r' { // CRLF framing reads as LF's
			continue
		}
		switch {
		case f.line == nil: // inside a preamble event: wait for its end
			if c == '\n' && f.prev == '\n' {
				f.line = []byte{}
			}
		case c == '\n' && len(f.line) == 0: // a blank line between events
		case c == '\n' || len(f.line) == 64:
			ln := string(f.line)
			if ln != "event: response.created" && ln != "event: response.in_progress" {
				return true
			}
			f.line = nil
		default:
			f.line = append(f.line, c)
		}
		f.prev = c
	}
	return false
}

func (f *firstOutput) Close() error { return f.rc.Close() }
