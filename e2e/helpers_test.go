package e2e

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Pure helpers shared by the integration tests and benchmarks. They carry
// no build tag so that their own tests run in every `go test ./...`.

// tokens returns n pseudo-random token ids. Ids stay inside the simulator's
// vocabulary and clear of its special tokens, so prompts decode to text.
func tokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = 1000 + uint32(rng.IntN(20000))
	}
	return out
}

// join concatenates token slices into a new slice.
func join(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// seeded returns a generator seeded from name, so each test draws its own
// prompts (independent of test order) and a rerun draws the same ones.
func seeded(name string) *rand.Rand {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return rand.New(rand.NewPCG(h, h>>17|1))
}

var (
	sseID      = regexp.MustCompile(`"id":"[^"]*"`)
	sseCreated = regexp.MustCompile(`"created":[0-9]+`)
)

// normalizeSSE blanks the two fields of an OpenAI SSE stream that differ
// between two runs of a deterministic engine: the request id and the
// creation timestamp. Everything else, framing included, is kept byte for
// byte.
func normalizeSSE(b []byte) []byte {
	b = sseID.ReplaceAll(b, []byte(`"id":""`))
	return sseCreated.ReplaceAll(b, []byte(`"created":0`))
}

// sseEvents counts the `data:` events of an SSE body and reports whether it
// ended with `data: [DONE]`.
func sseEvents(b []byte) (n int, done bool) {
	for _, ev := range bytes.Split(b, []byte("\n\n")) {
		if bytes.HasPrefix(ev, []byte("data: ")) {
			n++
			done = bytes.Equal(ev, []byte("data: [DONE]"))
		}
	}
	return n, done
}

// metricValue returns the value of the Prometheus text-format sample whose
// name and label set are exactly series (e.g.
// `kvroute_hop_rejected_total{reason="bad_mac"}`). A series that is absent
// reads as 0, as an unincremented counter vector child would.
func metricValue(text, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, series)
		if !ok || !strings.HasPrefix(rest, " ") {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			return v
		}
	}
	return 0
}

// percentile returns the p-th percentile (0..100) of d by the nearest-rank
// method; d need not be sorted and is not modified. Zero for no samples.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// blockAligned rounds n tokens down to whole blocks.
func blockAligned(n, blockSize int) int { return n / blockSize * blockSize }
