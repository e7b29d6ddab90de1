package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ServedByHeader names the pod that served a request; kvroute's sidecar and
// the baseline proxy set it. DecisionHeader is the sidecar's routing reason
// ("affinity", "least-load", ...; "-retried" appended when the first
// target failed before its first byte).
//
// RetryCountHeader numbers a call's attempts, 0 first, as the OpenAI and
// Anthropic SDKs do on every attempt: the sidecar serves an SDK's last
// past its prefill-share bound.
const (
	ServedByHeader   = "X-Kvroute-Served-By"
	DecisionHeader   = "X-Kvroute-Decision"
	RetryCountHeader = "X-Stainless-Retry-Count"
)

// maxSSELine bounds one server-sent event line (a usage chunk is small; a
// non-streaming body with a long answer is bounded by maxBody).
const (
	maxSSELine = 1 << 20
	maxBody    = 16 << 20
)

// Endpoint is an address requests are sent to.
type Endpoint struct {
	// URL is the base URL, e.g. http://127.0.0.1:8000.
	URL string
	// Pod names the single backend behind URL; empty when a router sits
	// there and ServedByHeader says which pod served.
	Pod string
}

// Message is one chat message. The agent fields are sent on Messages and
// Responses calls only (a chat call sends role and content).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`

	// Images of a user message, before Content when ImagesFirst.
	Images      []Image `json:"-"`
	ImagesFirst bool    `json:"-"`
	// ToolCalls of an assistant message, after Content (which may be "").
	ToolCalls []ToolCall `json:"-"`
	// ToolCallID makes the message a tool's result (Role "tool"): the call
	// it answers, with Content the result.
	ToolCallID string `json:"-"`
}

// Call is one request to send.
type Call struct {
	Kind Kind
	// Model overrides the client's model (a LoRA adapter); "" keeps it.
	Model     string
	Prompt    []uint32  // Completion
	Messages  []Message // Chat, Messages, Responses
	MaxTokens int

	// System is the system prompt of a Messages call (a system block) or
	// the instructions of a Responses call.
	System string
	// Billing is a Messages call's first system block, Claude Code's
	// per-request "x-anthropic-billing-header: ..." ("" none).
	Billing string
	Tools   []Tool
	// PreviousResponseID continues a stored response (Responses): Messages
	// then holds only what is new since it.
	PreviousResponseID string
	// Store is a Responses call's "store" (nil: not sent, vLLM's default
	// true).
	Store *bool
	// Plain sends this call without streaming even when the client streams.
	Plain bool
	// ID, when set, goes out as X-Request-Id (kvroute's sidecar logs it
	// as the request's id), so a harness can join a server's logs to the
	// samples.
	ID string
}

// SimTiming is the simulator's "sim" object: simulated seconds since the
// serving engine started.
type SimTiming struct {
	ArrivalS    float64 `json:"arrival_s"`
	FirstTokenS float64 `json:"first_token_s"`
	FinishS     float64 `json:"finish_s"`
}

// Reply is what one successful call returned and how long it took.
type Reply struct {
	Pod          string
	Text         string // the generated text (the assistant message for Chat)
	PromptTokens int
	CachedTokens int
	OutputTokens int
	Sim          *SimTiming // nil when the server does not report it
	// WallTTFT is the client's time to the first non-empty token chunk
	// (streaming) or to the response headers (non-streaming).
	WallTTFT time.Duration
	WallE2E  time.Duration
	// Decision is the DecisionHeader of the answer ("" without one).
	Decision string
	// LocalAddr is the client side of the connection the last attempt used
	// ("" when no connection was made): a harness that splices connections
	// can tell from it which backend the request entered through.
	LocalAddr string
	// Attempts is how many times the call was sent (1 without retries).
	Attempts int
	// Status is the HTTP status of the last attempt (0: no answer).
	Status int
	// Streamed: the call asked for SSE.
	Streamed bool
	// Chunks counts the stream's chunks that carried text, about one a
	// token: how far a stream got, kept when it then fails (0 for a plain
	// answer).
	Chunks int
	// ResponseID is the answer's id (Messages "msg_...", Responses
	// "resp_...": what previous_response_id names); "" for chat and
	// completions.
	ResponseID string
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.Status, e.Body)
}

// ErrTruncated: a stream ended before its final usage chunk or [DONE].
var ErrTruncated = errors.New("stream ended early")

// Client sends OpenAI requests. It is safe for concurrent use.
type Client struct {
	HTTP  *http.Client
	Model string
	// Stream asks for SSE with stream_options.include_usage, so the client
	// sees its first token (default in NewClient: true).
	Stream bool
	// Retry is the client's own retry policy; the zero value never retries,
	// so a result shows what the server side absorbed.
	Retry RetryPolicy
	// sleep waits between retries; nil means a timer (tests replace it).
	sleep func(context.Context, time.Duration) bool
}

// RetryPolicy retries a call as the OpenAI SDKs do: on a connection error,
// or on status 408, 409, 429 or 5xx, before any answer was read. A stream
// cut after its headers is never retried (the SDKs surface that error to
// the caller's iteration). The wait before retry k (1-based) is
// Backoff·2^(k-1), at most MaxBackoff, times a jitter in [0.75, 1].
type RetryPolicy struct {
	// Retries is the number of retries after the first attempt (0: none).
	Retries    int
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Jitter returns a value in [0, 1); nil means no jitter (factor 1).
	Jitter func() float64
}

// SDKRetry is the OpenAI Python and Node SDKs' default: two retries, 0.5 s
// initial backoff doubling up to 8 s, with up to 25% jitter.
func SDKRetry(jitter func() float64) RetryPolicy {
	return RetryPolicy{Retries: 2, Backoff: 500 * time.Millisecond, MaxBackoff: 8 * time.Second, Jitter: jitter}
}

// SeededJitter returns a jitter for SDKRetry drawn from a generator of
// seed, safe for the concurrent workers of a run.
func SeededJitter(seed uint64) func() float64 {
	r := rand.New(rand.NewPCG(seed, 0x5d4))
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// wait is the backoff before retry k (1-based).
func (p RetryPolicy) wait(k int) time.Duration {
	d := p.Backoff << (k - 1)
	if p.MaxBackoff > 0 && (d > p.MaxBackoff || d <= 0) {
		d = p.MaxBackoff
	}
	f := 1.0
	if p.Jitter != nil {
		f = 1 - 0.25*p.Jitter()
	}
	return time.Duration(float64(d) * f)
}

// retryableStatus are the statuses the SDKs retry.
func retryableStatus(st int) bool {
	return st == http.StatusRequestTimeout || st == http.StatusConflict ||
		st == http.StatusTooManyRequests || st >= 500
}

// shouldRetry decides one retry: err is the attempt's error, answered
// whether response headers arrived, streamed whether the call was SSE.
func shouldRetry(err error, answered, streamed bool) bool {
	var se *StatusError
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &se):
		return retryableStatus(se.Status)
	case !answered:
		return true // connection error: nothing was read
	default:
		// A body that failed to arrive: the SDKs read a plain body inside
		// the retried send, but hand a stream to the caller.
		return !streamed
	}
}

// NewClient returns a streaming client for model over h (nil: a client
// with enough idle connections per host for a benchmark).
func NewClient(h *http.Client, model string) *Client {
	if h == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 512
		tr.MaxIdleConns = 2048
		h = &http.Client{Transport: tr}
	}
	return &Client{HTTP: h, Model: model, Stream: true}
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type requestBody struct {
	Model         string         `json:"model,omitempty"`
	Prompt        []uint32       `json:"prompt,omitempty"`
	Messages      []Message      `json:"messages,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chunk is the union of the response shapes we read: a completion or chat
// body, a streamed chunk of either, or an error object.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage *usage     `json:"usage"`
	Sim   *SimTiming `json:"sim"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (c chunk) text() string {
	var b strings.Builder
	for _, ch := range c.Choices {
		b.WriteString(ch.Text)
		b.WriteString(ch.Delta.Content)
		b.WriteString(ch.Message.Content)
	}
	return b.String()
}

func (r *Reply) take(c chunk) {
	if c.Usage != nil {
		r.PromptTokens = c.Usage.PromptTokens
		r.OutputTokens = c.Usage.CompletionTokens
		if c.Usage.PromptTokensDetails != nil {
			r.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if c.Sim != nil {
		r.Sim = c.Sim
	}
}

// Do sends one call to ep and reads the whole answer, retrying as c.Retry
// says. It blocks until the answer is complete, ctx ends, or the last
// attempt failed.
func (c *Client) Do(ctx context.Context, ep Endpoint, call Call) (Reply, error) {
	start := time.Now()
	var rep Reply
	var err error
	last := start
	for k := 0; ; k++ {
		if k > 0 {
			wait := c.sleep
			if wait == nil {
				wait = sleep
			}
			if !wait(ctx, c.Retry.wait(k)) {
				break
			}
		}
		var answered bool
		last = time.Now()
		rep, answered, err = c.once(ctx, ep, call, k)
		rep.Attempts = k + 1
		if k >= c.Retry.Retries || !shouldRetry(err, answered, rep.Streamed) {
			break
		}
	}
	// Client-side times span every attempt, as a user of the SDK sees them.
	if rep.WallTTFT > 0 {
		rep.WallTTFT += last.Sub(start)
	}
	rep.WallE2E = time.Since(start)
	return rep, err
}

// once sends attempt k (0 first); answered reports whether response
// headers came.
func (c *Client) once(ctx context.Context, ep Endpoint, call Call, k int) (rep Reply, answered bool, err error) {
	stream := c.Stream && !call.Plain
	model := c.Model
	if call.Model != "" {
		model = call.Model
	}
	rep = Reply{Pod: ep.Pod, Streamed: stream}
	path, b, err := encodeCall(call, model, stream)
	if err != nil {
		return rep, false, fmt.Errorf("encode request: %w", err)
	}
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if a := i.Conn.LocalAddr(); a != nil {
			rep.LocalAddr = a.String()
		}
	}}
	ctx = httptrace.WithClientTrace(ctx, trace)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(ep.URL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return rep, false, fmt.Errorf("new request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(RetryCountHeader, strconv.Itoa(k))
	if call.ID != "" {
		req.Header.Set("X-Request-Id", call.ID)
	}
	start := time.Now()
	defer func() { rep.WallE2E = time.Since(start) }()
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return rep, false, err
	}
	defer resp.Body.Close()
	rep.Status = resp.StatusCode
	rep.Decision = resp.Header.Get(DecisionHeader)
	if p := resp.Header.Get(ServedByHeader); p != "" {
		rep.Pod = p
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return rep, true, &StatusError{Status: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
	}
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	switch {
	case sse && call.Kind.agentic():
		err = readEvents(resp.Body, call.Kind, &rep, start)
	case sse:
		err = readStream(resp.Body, &rep, start)
	case call.Kind.agentic():
		rep.WallTTFT = time.Since(start)
		err = readAgentBody(resp.Body, call.Kind, &rep)
	default:
		rep.WallTTFT = time.Since(start)
		err = readBody(resp.Body, &rep)
	}
	return rep, true, err
}

// encodeCall returns the path and body of call for model.
func encodeCall(call Call, model string, stream bool) (string, []byte, error) {
	switch call.Kind {
	case Messages:
		b, err := messagesBody(call, model, stream)
		return "/v1/messages", b, err
	case Responses:
		b, err := responsesBody(call, model, stream)
		return "/v1/responses", b, err
	}
	body := requestBody{Model: model, MaxTokens: call.MaxTokens, Stream: stream}
	path := "/v1/completions"
	if call.Kind == Chat {
		path = "/v1/chat/completions"
		body.Messages = call.Messages
	} else {
		body.Prompt = call.Prompt
	}
	if stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	b, err := json.Marshal(body)
	return path, b, err
}

func readBody(r io.Reader, rep *Reply) error {
	var c chunk
	if err := json.NewDecoder(io.LimitReader(r, maxBody)).Decode(&c); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	if c.Error != nil {
		return fmt.Errorf("server error: %s", c.Error.Message)
	}
	rep.Text = c.text()
	rep.take(c)
	return nil
}

// readStream reads SSE `data:` lines until [DONE]. A usage-less stream is
// accepted only when it ends with [DONE].
func readStream(r io.Reader, rep *Reply, start time.Time) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 16<<10), maxSSELine)
	var text strings.Builder
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			rep.Text = text.String()
			return nil
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("decode stream chunk: %w", err)
		}
		if c.Error != nil {
			return fmt.Errorf("server error in stream: %s", c.Error.Message)
		}
		if t := c.text(); t != "" {
			if text.Len() == 0 {
				rep.WallTTFT = time.Since(start)
			}
			text.WriteString(t)
			rep.Chunks++
		}
		rep.take(c)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return ErrTruncated
}
