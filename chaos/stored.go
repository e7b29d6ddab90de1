package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// Stored responses under faults. vLLM keeps a stored response in the
// memory of the engine that made it, so a follow-up (previous_response_id,
// GET /v1/responses/{id}) has exactly one pod that can serve it, and none
// once that engine is gone. To classify follow-ups the harness must know,
// for each, which response it named and which pod made that response; the
// clients' transport tells it (storeTap), and a prober adds GETs of the
// stored responses during the run (probeStored).

// madeResponse is a stored response as the client saw it made: the pod
// that served it and when the request was sent and its answer read
// (seconds from the start of the load).
type madeResponse struct {
	Pod         string
	Req         string
	SentS, EndS float64
}

// storeLog is what the clients saw of stored responses. It is safe for
// concurrent use.
type storeLog struct {
	start time.Time

	mu    sync.Mutex
	names map[string]string       // request id → the response id it named
	made  map[string]madeResponse // response id → where and when it was made
	order []string                // made ids, in the order their answers ended
}

func newStoreLog(start time.Time) *storeLog {
	return &storeLog{start: start, names: map[string]string{}, made: map[string]madeResponse{}}
}

func (l *storeLog) since() float64 { return time.Since(l.start).Seconds() }

// named records that request req names response id.
func (l *storeLog) named(req, id string) {
	if req == "" || id == "" {
		return
	}
	l.mu.Lock()
	l.names[req] = id
	l.mu.Unlock()
}

// madeBy records a stored response.
func (l *storeLog) madeBy(id string, m madeResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.made[id]; !ok {
		l.order = append(l.order, id)
	}
	l.made[id] = m
}

// followUp returns the response request req named and how it was made;
// ok is false for a request that named none. known is false when the
// harness never saw that response made.
func (l *storeLog) followUp(req string) (id string, m madeResponse, ok, known bool) {
	if l == nil {
		return "", madeResponse{}, false, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok = l.names[req]
	if !ok {
		return "", madeResponse{}, false, false
	}
	m, known = l.made[id]
	return id, m, true, known
}

// pick returns a stored response for the prober's n-th read: the pods
// that made one in the last window seconds, and the held pods (those a
// fault holds now) that ever made one, take turns (sorted by name), and
// the pod whose turn it is gives one of its newest few. Taking turns
// makes every pod's store be read within a few reads of any moment; the
// held pods' stores are read even when the workload's sessions moved
// away from them before the fault (a hung pod's sessions settle
// elsewhere and may not come back), which is when reads matter most.
func (l *storeLog) pick(n int, rng *rand.Rand, window float64, held []string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.since()
	byPod := map[string][]string{}
	var pods []string
	for k := len(l.order) - 1; k >= 0; k-- {
		id := l.order[k]
		m := l.made[id]
		if now-m.EndS > window && !slices.Contains(held, m.Pod) {
			continue
		}
		if _, ok := byPod[m.Pod]; !ok {
			pods = append(pods, m.Pod)
		}
		if len(byPod[m.Pod]) < 8 {
			byPod[m.Pod] = append(byPod[m.Pod], id)
		}
	}
	if len(pods) == 0 {
		return "", false
	}
	slices.Sort(pods)
	ids := byPod[pods[n%len(pods)]]
	return ids[rng.IntN(len(ids))], true
}

// storeTap is the clients' transport: it passes every request through and
// notes, for POST /v1/responses, the previous_response_id a request names
// and the id of each stored response an answer carries, with the pod that
// served it (X-Kvroute-Served-By).
type storeTap struct {
	base http.RoundTripper
	log  *storeLog
}

// responsesRequest is the part of a Responses request the tap reads.
type responsesRequest struct {
	PreviousResponseID string `json:"previous_response_id"`
	Store              *bool  `json:"store"`
}

func (t storeTap) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/responses" || req.GetBody == nil {
		return t.base.RoundTrip(req)
	}
	var body responsesRequest
	if rc, err := req.GetBody(); err == nil {
		// A body that does not decode names nothing: the request goes
		// out as it is, and the server answers it.
		_ = json.NewDecoder(rc).Decode(&body)
		rc.Close()
	}
	reqID := req.Header.Get("X-Request-Id")
	t.log.named(reqID, body.PreviousResponseID)
	sent := t.log.since()
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || (body.Store != nil && !*body.Store) {
		return resp, err
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	pod := resp.Header.Get(loadgen.ServedByHeader)
	resp.Body = &idTap{rc: resp.Body, sse: sse, found: func(id string) {
		t.log.madeBy(id, madeResponse{Pod: pod, Req: reqID, SentS: sent, EndS: t.log.since()})
	}}
	return resp, nil
}

// maxTapBytes bounds what idTap keeps of an answer: a whole plain answer,
// or a stream's first event (response.created carries the instructions
// and tools, tens of KB).
const maxTapBytes = 4 << 20

// idTap passes an answer through, keeping its beginning, and at its end
// (EOF, or Close: the client stops reading a stream at response.completed)
// calls found with the response's id if the answer was complete. An answer cut short made no response the client
// could continue.
type idTap struct {
	rc    io.ReadCloser
	sse   bool
	buf   []byte
	found func(string)
	done  bool
}

func (t *idTap) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if len(t.buf) < maxTapBytes {
		t.buf = append(t.buf, p[:min(n, maxTapBytes-len(t.buf))]...)
	}
	if err == io.EOF {
		t.finish()
	}
	return n, err
}

func (t *idTap) Close() error {
	t.finish()
	return t.rc.Close()
}

// finish reports the id once.
func (t *idTap) finish() {
	if t.done {
		return
	}
	t.done = true
	// A plain answer is whole when it decodes; a stream when it got to
	// response.completed (a cut stream may still end in EOF).
	complete := !t.sse || bytes.Contains(t.buf, []byte(`"response.completed"`))
	if id := responseID(t.buf, t.sse); complete && id != "" {
		t.found(id)
	}
	t.buf = nil
}

// responseID is the id of a Responses answer: the object's "id", or in a
// stream the response of its first event (response.created).
func responseID(b []byte, sse bool) string {
	if !sse {
		var o struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &o) != nil {
			return ""
		}
		return o.ID
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, maxTapBytes)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		var ev struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
			return ""
		}
		return ev.Response.ID
	}
	return ""
}

// getSession names the prober's requests: request n is
// X-Request-Id RequestID(getSession, n), so the sidecars' logs join them.
const getSession = "stored-get"

// APIStoredGet labels the prober's GET /v1/responses/{id} in the per-API
// table.
const APIStoredGet = "responses GET"

// probeConfig configures probeStored.
type probeConfig struct {
	URL   string // the Service
	Every time.Duration
	// Window: only responses made this recently are read (seconds).
	Window float64
	// Retry retries as the SDKs do: connection errors, 408, 409, 429 and
	// 5xx, up to Retries times, after Retry-After when the answer has one
	// (as the OpenAI and Anthropic SDKs honour it), else the backoff.
	Retry   bool
	Timeout time.Duration
	Rng     *rand.Rand
	// Held returns the pods a fault holds now (nil: none).
	Held func() []string
}

// probeStored reads a stored response the workload made through the
// Service every Every, each on a new connection (so the Service spreads
// them over the pods as it spreads new clients), until stop ends; the
// GETs in flight then go on, with their retries, until ctx ends (the
// run's drain), as loadgen's requests do. It returns one Sample per GET,
// as loadgen records its requests.
func probeStored(ctx, stop context.Context, log *storeLog, c probeConfig) []loadgen.Sample {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	tk := time.NewTicker(c.Every)
	defer tk.Stop()
	var out []loadgen.Sample
	var wg sync.WaitGroup
	var mu sync.Mutex
	for n := 0; ; {
		select {
		case <-stop.Done():
			wg.Wait()
			return out
		case <-tk.C:
		}
		var held []string
		if c.Held != nil {
			held = c.Held()
		}
		id, ok := log.pick(n, c.Rng, c.Window, held)
		if !ok {
			continue
		}
		req := loadgen.RequestID(getSession, n)
		n++
		log.named(req, id)
		wg.Go(func() {
			s := getStored(ctx, hc, log, c, req, id)
			mu.Lock()
			out = append(out, s)
			mu.Unlock()
		})
	}
}

// getStored GETs stored response id once, retrying as c says.
func getStored(ctx context.Context, hc *http.Client, log *storeLog, c probeConfig, req, id string) loadgen.Sample {
	s := loadgen.Sample{Session: getSession, API: APIStoredGet, Continued: true,
		Sent: time.Since(log.start)}
	s.Turn, _ = strconv.Atoi(req[len(getSession)+1:])
	begin := time.Now()
	retries := 0
	if c.Retry {
		retries = 2
	}
	for k := 0; ; k++ {
		s.Attempts = k + 1
		wait, retry := getOnce(ctx, hc, c, req, id, &s)
		if !retry || k >= retries {
			break
		}
		if wait <= 0 {
			wait = 500 * time.Millisecond << k
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			break
		}
	}
	s.WallE2E = time.Since(begin)
	s.E2E, s.TTFT, s.WallTTFT = s.WallE2E.Seconds(), s.WallE2E.Seconds(), s.WallE2E
	return s
}

// getOnce is one attempt; it fills s and says whether to retry and after
// how long (0: the backoff).
func getOnce(ctx context.Context, hc *http.Client, c probeConfig, req, id string, s *loadgen.Sample) (time.Duration, bool) {
	actx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	*s = loadgen.Sample{Session: s.Session, Turn: s.Turn, API: s.API, Continued: true, Sent: s.Sent, Attempts: s.Attempts}
	actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if a := i.Conn.LocalAddr(); a != nil {
			s.LocalAddr = a.String()
		}
	}})
	hr, err := http.NewRequestWithContext(actx, http.MethodGet, c.URL+"/v1/responses/"+url.PathEscape(id), nil)
	if err != nil {
		s.Err = err.Error()
		return 0, false
	}
	hr.Header.Set("X-Request-Id", req)
	resp, err := hc.Do(hr)
	if err != nil {
		s.Err = err.Error()
		return 0, ctx.Err() == nil
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	s.Pod = resp.Header.Get(loadgen.ServedByHeader)
	s.Decision = resp.Header.Get(loadgen.DecisionHeader)
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case err != nil:
		s.Err = "read answer: " + err.Error()
		return 0, ctx.Err() == nil
	case resp.StatusCode != http.StatusOK:
		s.Err = (&loadgen.StatusError{Status: resp.StatusCode, Body: strings.TrimSpace(string(b[:min(len(b), 512)]))}).Error()
		st := resp.StatusCode
		retry := st == http.StatusRequestTimeout || st == http.StatusConflict || st == http.StatusTooManyRequests || st >= 500
		return retryAfter(resp.Header.Get("Retry-After")), retry
	}
	if got := responseID(b, false); got != id {
		s.Err = "answer is response " + strconv.Quote(got) + ", not " + strconv.Quote(id)
	}
	return 0, false
}

// retryAfter reads a Retry-After of whole seconds as the SDKs do: a value
// outside (0, 60] s means the backoff (0).
func retryAfter(v string) time.Duration {
	n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || n <= 0 || n > 60 {
		return 0
	}
	return time.Duration(n * float64(time.Second))
}

// engineEnds reports whether a fault ends a pod's engine, and with it the
// responses it stores.
func engineEnds(fault string) bool {
	switch fault {
	case FaultKillEngine, FaultKillPod, FaultReplacePod, FaultRollingRestart:
		return true
	}
	return false
}

// storeLost returns the fault that ended the engine holding m before a
// follow-up that ended at end: one that ends engines, on m's pod, that
// ended it after m's request was sent and by end. ok is false while the
// engine that made m lived on, or may have.
//
// A kill ends the engine at once (AtS). A rolling restart drains the pod
// first, which serves the follow-ups of its stored responses (and makes
// new ones) until it stops, sometime before the step is undone: a
// response made then is lost with it, surely by UndoneS.
func storeLost(m madeResponse, end float64, faults []FaultRecord) (FaultRecord, bool) {
	for _, f := range faults {
		if f.Pod != m.Pod || !engineEnds(f.Fault) || f.Err != "" {
			continue
		}
		ended := f.AtS // the engine had surely ended by then, and may have served until then
		if f.Fault == FaultRollingRestart && f.UndoneS > f.AtS {
			ended = f.UndoneS
		}
		if m.SentS <= ended && ended <= end {
			return f, true
		}
	}
	return FaultRecord{}, false
}

// goneAnswer is the mesh's clear answer for a response whose pod is gone:
// a 404 whose message says so (forward/stored.go).
func goneAnswer(s loadgen.Sample) bool {
	return s.Status == http.StatusNotFound && strings.Contains(s.Err, "which is gone")
}
