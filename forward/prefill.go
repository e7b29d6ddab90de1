package forward

import (
	"io"
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

// withPrefill sets each target's predicted uncached tokens: the prompt's
// tokens less what the decision expected cached there. For a non-streamed
// answer (stream false) it also sets how long the prefill should take
// there, the work queued ahead and its own at rate tokens per second (0:
// unknown, counted until the answer).
func withPrefill(ts []target, d route.Decision, promptTokens int, stream bool, rate float64) {
	for i := range ts {
		matched, queued := 0, 0
		for _, c := range d.Candidates {
			if c.ID == ts[i].Peer || (ts[i].Peer == "" && c.Local) {
				matched, queued = c.MatchedTokens, c.Queued
				break
			}
		}
		ts[i].Prefill = max(promptTokens-matched, 0)
		if !stream && rate > 0 {
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
