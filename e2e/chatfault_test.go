//go:build integration

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestEngineKilledCostsNoChat is TestEngineKilledCostsNoRequest for
// streaming text chats, which the sidecars route on learned text prefixes
// (textroute) and, learning from the answer, whose SSE answers the entry
// sidecar taps for the prompt's token ids: the engine of the pod holding
// the conversations' prefixes is SIGKILLed under a chat load through every
// sidecar, then started again empty. No chat a live pod could serve may
// fail, and the client never sees token ids it did not ask for. It runs
// once per learning mode (--text-prefix-from-answer).
func TestEngineKilledCostsNoChat(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 3-pod clusters")
	}
	for _, m := range []struct {
		name       string
		subnet     int
		fromAnswer bool
	}{{"from-answer", 5, true}, {"tokenize", 6, false}} {
		t.Run(m.name, func(t *testing.T) { chatFault(t, m.subnet, m.fromAnswer) })
	}
}

const prefixRouted = `kvroute_textprefix_requests_total{path="prefix"}`

func chatFault(t *testing.T, sub int, fromAnswer bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 3, subnet: sub, secret: true, timeScale: 20, progress: testProgress{t},
		args: []string{fmt.Sprintf("--text-prefix-from-answer=%v", fromAnswer)}}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logSidecarTails(t, f, 40)
		}
	})
	rng := seeded(t.Name())
	convs := f.warmChats(t, rng, 3)
	x := convs[0].holder
	name := f.c.Pod(x).Name
	var held []*conversation
	for _, c := range convs {
		if c.holder == x {
			held = append(held, c)
		}
	}
	t.Logf("%d of %d conversations held by %s", len(held), len(convs), name)

	routed := f.sumMetric(t, prefixRouted)
	l := startChatLoad(f, t.Name(), func(rng *mrand.Rand, n int) ([]chatMessage, bool) {
		if n%3 == 2 { // a new conversation on the shared system prompt
			return []chatMessage{convs[0].msgs[0], {"user", words(rng, 20)}}, false
		}
		c := held[n/3%len(held)]
		return c.next(rng), true
	})
	// Before the fault, the held conversations go to their holder, on a
	// text prefix.
	waitFor(t, 15*time.Second, "load chats routed to "+name+" on a prefix", func(context.Context) (bool, string) {
		n, p := l.servedBy(name), f.sumMetric(t, prefixRouted)-routed
		return n >= 6 && p >= 1, fmt.Sprintf("%d held-conversation chats served by %s, %v chats routed on a prefix", n, name, p)
	})
	killAt := time.Now()
	if err := f.c.KillSim(x); err != nil {
		t.Fatal(err)
	}
	took := f.waitExcluded(t, x, killAt)
	t.Logf("every sidecar excluded %s %v after the kill", name, took.Round(time.Millisecond))
	excludedAt := time.Now()
	time.Sleep(time.Second) // traffic while the pod is out
	healAt := time.Now()
	if err := f.c.StartSim(ctx, x); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, name+" serving again", func(ctx context.Context) (bool, string) {
		for i := range f.c.Len() {
			e, err := f.engineOf(ctx, i, x)
			if err != nil || e != "serving" {
				return false, fmt.Sprintf("%s sees %s as %q (%v)", f.c.Pod(i).Name, name, e, err)
			}
		}
		return true, ""
	})
	time.Sleep(500 * time.Millisecond) // traffic after the heal
	rs := l.stop()

	// Every chat must be whole; a stream the broken engine had begun when
	// it died is counted apart (no router can save it).
	var failed, cut, viaBroken, viaBrokenOut, heldOut, asked, retried, blind int
	for _, r := range rs {
		if strings.HasSuffix(r.decision, "-retried") {
			retried++
		}
		if r.end.After(killAt) && r.start.Before(excludedAt) {
			blind++ // in flight between the kill and every sidecar's exclusion
		}
		if r.via == x && r.start.After(excludedAt) && r.end.Before(healAt) {
			viaBrokenOut++
		}
		if r.held && r.start.After(killAt) && r.end.Before(healAt) {
			heldOut++
		}
		if r.via == x {
			viaBroken++
		}
		if r.idsNull {
			asked++
		}
		switch {
		case r.problem == "":
		case r.cut && r.served == name && r.start.Before(killAt) && r.end.After(killAt):
			cut++
		default:
			failed++
			if failed <= 8 {
				t.Errorf("chat failed that a live pod could serve: %s", r.describe(f, killAt))
			}
		}
	}
	prefixed := f.sumMetric(t, prefixRouted) - routed
	t.Logf("chat load: %d requests, %d routed on a text prefix, %d retried, %d in flight between the kill and the exclusion; %d via %s's sidecar, %d of them while it was excluded; %d held-conversation chats while %s was down; %d with null prompt_token_ids; %d cut mid-answer on the broken pod, %d failed",
		len(rs), int(prefixed), retried, blind, viaBroken, name, viaBrokenOut, heldOut, name, asked, cut, failed)
	if failed > 8 {
		t.Errorf("... and %d more failed", failed-8)
	}
	if len(rs) < 30 {
		t.Errorf("only %d chats sent; the load did not run", len(rs))
	}
	if viaBrokenOut == 0 {
		t.Errorf("no chat entered %s's sidecar while its engine was out; the test proves nothing for it", name)
	}
	if heldOut == 0 {
		t.Errorf("no chat of a conversation held by %s was sent while its engine was down", name)
	}
	if prefixed < 1 {
		t.Errorf("the sidecars routed %v load chats on a text prefix; want some, else the test proves nothing", prefixed)
	}
	// With the ids asked for by the sidecar, the client gets null, as vLLM
	// answers unasked; without, the sidecar must not ask.
	switch {
	case fromAnswer && asked == 0:
		t.Errorf("no answer carried null prompt_token_ids: the sidecars did not ask for the ids, the path under test did not run")
	case !fromAnswer && asked > 0:
		t.Errorf("%d answers carried prompt_token_ids with --text-prefix-from-answer=false", asked)
	}
	m := f.metrics(t, x)
	if got := metricValue(m, `kvroute_engine_transitions_total{state="down"}`); got < 1 {
		t.Errorf("%s: engine_transitions_total{state=down} = %v; want >= 1", name, got)
	}
}

// chatMessage is one chat message.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation is a chat whose turns are learned; holder is the pod that
// served its first turn.
type conversation struct {
	msgs   []chatMessage
	holder int
}

// next returns c's messages with a new answer and question appended (c is
// not changed, so every follow-up shares c's learned prefix).
func (c *conversation) next(rng *mrand.Rand) []chatMessage {
	return append(append([]chatMessage(nil), c.msgs...),
		chatMessage{"assistant", words(rng, 30)}, chatMessage{"user", words(rng, 20)})
}

// streamChatBody is a streaming chat request; usage asks for the final
// usage chunk.
func streamChatBody(msgs []chatMessage, usage bool) []byte {
	v := map[string]any{"model": model, "max_tokens": 4, "stream": true, "messages": msgs}
	if usage {
		v["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(v)
	return b
}

// tokenIDsShown matches token ids an answer carries (an array; null is
// what vLLM answers when they were not asked for).
var tokenIDsShown = regexp.MustCompile(`"(prompt_)?token_ids":\s*\[`)

// chatProblem says what is wrong with a streaming chat answer ("" when
// nothing is); cut is a 200 whose stream did not end.
func chatProblem(r reply, err error) (problem string, cut bool) {
	_, done := sseEvents(r.Body)
	switch {
	case err != nil && r.Status == 0:
		return err.Error(), false
	case r.Status != http.StatusOK:
		return fmt.Sprintf("status %d: %.300s", r.Status, r.Body), false
	case err != nil:
		return fmt.Sprintf("stream broken after %d bytes: %v; ends %q", len(r.Body), err, tail(r.Body, 160)), true
	case !strings.HasPrefix(r.Type, "text/event-stream"):
		return fmt.Sprintf("content type %q: %.300s", r.Type, r.Body), false
	case !done:
		return fmt.Sprintf("stream of %d bytes does not end with data: [DONE]; ends %q", len(r.Body), tail(r.Body, 160)), true
	case tokenIDsShown.Match(r.Body):
		return fmt.Sprintf("the client got token ids it did not ask for: %.300s", r.Body), false
	}
	return "", false
}

func tail(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

// streamChat posts a streaming chat to pod i's sidecar and reads it whole.
func (f *fixture) streamChat(ctx context.Context, i int, msgs []chatMessage, usage bool) (reply, error) {
	return f.do(ctx, http.MethodPost, f.c.Pod(i).API, "/v1/chat/completions", streamChatBody(msgs, usage), nil)
}

// warmChats starts n conversations on a shared system prompt, each first
// turn entering another sidecar, and sends each one's second turn through
// a sidecar other than its holder's until that sidecar routes it on a
// learned text prefix to the holder.
func (f *fixture) warmChats(t *testing.T, rng *mrand.Rand, n int) []*conversation {
	t.Helper()
	sys := chatMessage{"system", words(rng, 400)}
	out := make([]*conversation, n)
	for c := range out {
		// The first user turn is what tells the holder from a pod that
		// holds the shared system prompt only: at 20 words (~3 blocks) it
		// weighed less than one request of load (route.Config.LoadTokens,
		// 64 tokens), so a second turn entering a pod with the system
		// prompt stayed there whenever the holder had a request in flight,
		// and every try after it found that pod the better holder (1 run
		// in 4 failed so). 200 words outweigh a few requests.
		msgs := []chatMessage{sys, {"user", words(rng, 200)}}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := f.streamChat(ctx, c%f.c.Len(), msgs, false)
		cancel()
		if p, _ := chatProblem(r, err); p != "" {
			t.Fatalf("first turn of conversation %d: %s", c, p)
		}
		x := f.index(r.ServedBy)
		if x < 0 {
			t.Fatalf("first turn served by %q; want a pod name", r.ServedBy)
		}
		out[c] = &conversation{msgs: append(msgs, chatMessage{"assistant", words(rng, 30)}, chatMessage{"user", words(rng, 20)}), holder: x}
	}
	for c, cv := range out {
		via := (cv.holder + 1 + c%2) % f.c.Len()
		holder := f.c.Pod(cv.holder).Name
		tries := 0
		// 45 s: the prefix is learned from answers and a loaded machine
		// (make test's -race beside benchmarks) took 7 tries and ran a 20 s
		// budget out mid-request.
		waitFor(t, 45*time.Second, fmt.Sprintf("conversation %d's second turn routed on a prefix by %s to %s", c, f.c.Pod(via).Name, holder),
			func(ctx context.Context) (bool, string) {
				tries++
				was := metricValue(f.metrics(t, via), prefixRouted)
				r, err := f.streamChat(ctx, via, cv.msgs, false)
				if p, _ := chatProblem(r, err); p != "" {
					t.Fatalf("second turn of conversation %d: %s", c, p)
				}
				d := metricValue(f.metrics(t, via), prefixRouted) - was
				return d == 1 && r.ServedBy == holder, fmt.Sprintf("served by %s (%s), %v routed on a prefix", r.ServedBy, r.Decision, d)
			})
		t.Logf("conversation %d: held by %s, second turn routed on a prefix via %s after %d tries", c, holder, f.c.Pod(via).Name, tries)
	}
	return out
}

// sumMetric is series summed over every sidecar.
func (f *fixture) sumMetric(t *testing.T, series string) float64 {
	t.Helper()
	var s float64
	for i := range f.c.Len() {
		s += metricValue(f.metrics(t, i), series)
	}
	return s
}

// chatResult is one load chat's outcome.
type chatResult struct {
	via        int
	held       bool // a follow-up of a conversation held by the broken pod
	served     string
	decision   string
	status     int
	start, end time.Time
	problem    string
	cut        bool
	idsNull    bool // the answer carried "prompt_token_ids":null
}

func (r chatResult) describe(f *fixture, killAt time.Time) string {
	return fmt.Sprintf("via %s, served by %q (%s), %v..%v after the kill: %s",
		f.c.Pod(r.via).Name, r.served, r.decision, r.start.Sub(killAt).Round(time.Millisecond), r.end.Sub(killAt).Round(time.Millisecond), r.problem)
}

// chatLoad is startLoad for streaming chats: two workers, round-robin over
// every sidecar (the broken pod's own included), each result kept.
type chatLoad struct {
	f    *fixture
	quit chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	out  []chatResult
}

func startChatLoad(f *fixture, seed string, next func(rng *mrand.Rand, n int) ([]chatMessage, bool)) *chatLoad {
	l := &chatLoad{f: f, quit: make(chan struct{})}
	twoWorkers(&l.wg, l.quit, seed, func(rng *mrand.Rand, n int) {
		via := n % f.c.Len()
		msgs, held := next(rng, n)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		r, err := f.streamChat(ctx, via, msgs, n%4 < 2)
		end := time.Now()
		cancel()
		p, cut := chatProblem(r, err)
		res := chatResult{via: via, held: held, served: r.ServedBy, decision: r.Decision, status: r.Status,
			start: start, end: end, problem: p, cut: cut, idsNull: bytes.Contains(r.Body, []byte(`"prompt_token_ids":null`))}
		l.mu.Lock()
		l.out = append(l.out, res)
		l.mu.Unlock()
	})
	return l
}

// servedBy counts the held conversations' chats served whole by name.
func (l *chatLoad) servedBy(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.out {
		if r.held && r.problem == "" && r.served == name {
			n++
		}
	}
	return n
}

func (l *chatLoad) stop() []chatResult {
	close(l.quit)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out
}

// logSidecarTails logs the last n lines of every sidecar's log.
func logSidecarTails(t *testing.T, f *fixture, n int) {
	for i := range f.c.Len() {
		b, err := os.ReadFile(f.c.LogPath(i, "sidecar"))
		if err != nil {
			t.Logf("%s sidecar log: %v", f.c.Pod(i).Name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("%s sidecar log, last %d lines:\n%s", f.c.Pod(i).Name, n, strings.Join(lines[max(0, len(lines)-n):], "\n"))
	}
}
