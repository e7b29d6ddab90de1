package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// RunConfig configures Run. Zero values take the defaults noted.
type RunConfig struct {
	// Endpoints receive the requests; each request goes to one picked
	// uniformly at random, as a Kubernetes Service spreads connections.
	Endpoints []Endpoint
	Client    *Client
	// Concurrency bounds the requests in flight (default 256). Arrivals stay
	// open-loop below it; above it a request waits for a slot, and the wait
	// shows as Sample.Sent - Sample.Scheduled.
	Concurrency int
	// Seed seeds the endpoint choice.
	Seed uint64
	// Start is the moment the run's offsets count from (the schedule,
	// Sample.Sent): a caller timing other things against the samples
	// (faults, probes) passes its own; zero: when Run starts.
	Start time.Time
	// Stop: no later turn of a session is sent after this offset from the
	// start (it is dropped, not counted); first turns are always sent, so
	// every run of a schedule sends the same arrivals. 0 means no limit.
	Stop time.Duration
	// RequestTimeout bounds one request (default 5 minutes).
	RequestTimeout time.Duration
	// RequestIDs sends every request with X-Request-Id RequestID(session,
	// turn).
	RequestIDs bool
	// PlainEvery sends every PlainEvery-th session without streaming
	// (0: all as the client says), so a run mixes streaming and plain
	// answers deterministically.
	PlainEvery int
	// Progress, when set, gets a line every ProgressEvery (default 5 s):
	// sent, done, errors, in flight, send rate.
	Progress      io.Writer
	ProgressEvery time.Duration
}

// Sample is the outcome of one request.
type Sample struct {
	Session string
	Model   string // the session's model; "" for the client's
	Turn    int
	Group   string // the session's Group
	// Scheduled and Sent are offsets from the start of the run.
	Scheduled, Sent time.Duration
	Pod             string
	// Err is empty for a success.
	Err          string
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Chunks is Reply.Chunks: the text chunks a stream got, also when it
	// failed after them.
	Chunks int
	// TTFT and E2E are seconds: simulated when Sim, else wall-clock.
	TTFT, E2E float64
	Sim       bool
	// SimArrival is when the request reached the simulator that served
	// it, on that simulator's clock, in seconds (0 without Sim): against
	// Sent it shows whether the simulators kept pace (SimClock).
	SimArrival        float64
	WallTTFT, WallE2E time.Duration
	// Decision, LocalAddr, Attempts, Status and Streamed are the Reply's.
	Decision  string
	LocalAddr string
	Attempts  int
	Status    int
	Streamed  bool
	// API is the request's shape (Kind.API: "completions", "chat",
	// "messages", "responses").
	API string
	// Continued: the request named a stored response
	// (previous_response_id), which only the pod holding it can serve.
	Continued bool
}

// OK reports whether the request succeeded.
func (s Sample) OK() bool { return s.Err == "" }

func sampleOf(rep Reply) Sample {
	s := Sample{Pod: rep.Pod, PromptTokens: rep.PromptTokens, CachedTokens: rep.CachedTokens,
		OutputTokens: rep.OutputTokens, WallTTFT: rep.WallTTFT, WallE2E: rep.WallE2E,
		Decision: rep.Decision, LocalAddr: rep.LocalAddr, Attempts: rep.Attempts, Status: rep.Status,
		Streamed: rep.Streamed, Chunks: rep.Chunks}
	if s.WallTTFT == 0 {
		s.WallTTFT = s.WallE2E
	}
	if rep.Sim != nil {
		s.Sim = true
		s.SimArrival = rep.Sim.ArrivalS
		s.TTFT = max(0, rep.Sim.FirstTokenS-rep.Sim.ArrivalS)
		s.E2E = max(0, rep.Sim.FinishS-rep.Sim.ArrivalS)
	} else {
		s.TTFT = s.WallTTFT.Seconds()
		s.E2E = s.WallE2E.Seconds()
	}
	return s
}

// Run sends the schedule open-loop: each session starts at its offset,
// whatever happens to earlier ones; turns of one session go one after the
// other. It returns when every session has ended, or ctx ends (then with
// the samples so far and ctx's error). Run's goroutines all exit before it
// returns.
func Run(ctx context.Context, c RunConfig, s Schedule) ([]Sample, error) {
	if len(c.Endpoints) == 0 {
		return nil, errors.New("run: no endpoints")
	}
	if c.Client == nil {
		return nil, errors.New("run: no client")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 256
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 5 * time.Minute
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 5 * time.Second
	}
	if c.Start.IsZero() {
		c.Start = time.Now()
	}
	r := &run{cfg: c, start: c.Start, sem: make(chan struct{}, c.Concurrency),
		rng: rand.New(rand.NewPCG(c.Seed, 0x6b76))}

	progDone := make(chan struct{})
	var progWG sync.WaitGroup
	if c.Progress != nil {
		progWG.Add(1)
		go func() { defer progWG.Done(); r.progress(progDone) }()
	}

	var wg sync.WaitGroup
	var err error
	t := time.NewTimer(0)
	defer t.Stop()
launch:
	for i := range s.Sessions {
		x := &s.Sessions[i]
		plain := c.PlainEvery > 0 && i%c.PlainEvery == c.PlainEvery-1
		if wait := x.At - time.Since(r.start); wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				err = ctx.Err()
				break launch
			case <-t.C:
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.session(ctx, x, plain) }()
	}
	wg.Wait()
	close(progDone)
	progWG.Wait()
	if err == nil {
		err = ctx.Err()
	}
	if c.Progress != nil {
		r.line(c.Progress, float64(r.sent.Load())/max(time.Since(r.start).Seconds(), 1e-9))
	}
	sort.SliceStable(r.samples, func(i, j int) bool { return r.samples[i].Sent < r.samples[j].Sent })
	return r.samples, err
}

type run struct {
	cfg   RunConfig
	start time.Time
	sem   chan struct{}

	mu      sync.Mutex
	rng     *rand.Rand
	samples []Sample

	sent, done, errs atomic.Int64
}

func (r *run) pick() Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Endpoints[r.rng.IntN(len(r.cfg.Endpoints))]
}

func (r *run) record(s Sample) {
	r.done.Add(1)
	if !s.OK() {
		r.errs.Add(1)
	}
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// session sends x's turns in order; a chat session ends at its first
// failed turn, since later turns need the answer. Messages and Responses
// sessions run the agent loop (agent.go).
func (r *run) session(ctx context.Context, x *Session, plain bool) {
	if x.Kind.agentic() {
		r.agent(ctx, x, conv{}, plain, true)
		return
	}
	var history []Message
	if x.Kind == Chat && x.System != "" {
		history = append(history, Message{Role: "system", Content: x.System})
	}
	scheduled := x.At
	for k, turn := range x.Turns {
		if k > 0 {
			// A turn that would start after Stop is dropped now, rather
			// than after its think time.
			if r.cfg.Stop > 0 && time.Since(r.start)+turn.Think > r.cfg.Stop {
				return
			}
			if !sleep(ctx, turn.Think) {
				return
			}
			scheduled = time.Since(r.start)
		}
		call := Call{Kind: x.Kind, Model: x.Model, MaxTokens: turn.MaxTokens, Plain: plain}
		if x.Kind == Chat {
			history = append(history, Message{Role: "user", Content: turn.User})
			call.Messages = history
		} else {
			call.Prompt = turn.tokens()
		}
		rep, ok := r.send(ctx, x, k, scheduled, call)
		if !ok {
			return
		}
		if x.Kind == Chat {
			history = append(history, Message{Role: "assistant", Content: rep.Text})
		}
	}
}

// send sends turn k of x once a concurrency slot is free and records its
// sample; ok is false when it failed or ctx ended first.
func (r *run) send(ctx context.Context, x *Session, k int, scheduled time.Duration, call Call) (Reply, bool) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return Reply{}, false
	}
	if r.cfg.RequestIDs {
		call.ID = RequestID(x.ID, k)
	}
	sent := time.Since(r.start)
	r.sent.Add(1)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	rep, err := r.cfg.Client.Do(rctx, r.pick(), call)
	cancel()
	<-r.sem
	s := sampleOf(rep)
	s.Session, s.Model, s.Turn, s.Group, s.Scheduled, s.Sent = x.ID, x.Model, k, x.Group, scheduled, sent
	s.API, s.Continued = x.Kind.API(), call.PreviousResponseID != ""
	if err != nil {
		s.Err = err.Error()
	}
	r.record(s)
	return rep, err == nil
}

// RequestID is the X-Request-Id of a session's turn when
// RunConfig.RequestIDs is set.
func RequestID(session string, turn int) string { return session + "." + strconv.Itoa(turn) }

// sleep waits d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// progress prints a line every ProgressEvery until done is closed.
func (r *run) progress(done <-chan struct{}) {
	tk := time.NewTicker(r.cfg.ProgressEvery)
	defer tk.Stop()
	var last int64
	for {
		select {
		case <-done:
			return
		case <-tk.C:
			sent := r.sent.Load()
			r.line(r.cfg.Progress, float64(sent-last)/r.cfg.ProgressEvery.Seconds())
			last = sent
		}
	}
}

func (r *run) line(w io.Writer, rate float64) {
	sent, done := r.sent.Load(), r.done.Load()
	fmt.Fprintf(w, "  [%5.1fs] sent %d  done %d  errors %d  in flight %d  rate %.1f/s\n",
		time.Since(r.start).Seconds(), sent, done, r.errs.Load(), sent-done, rate)
}
