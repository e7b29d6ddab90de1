package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ServedByHeader names the pod that served a request; kvroute's sidecar and
// the baseline proxy set it.
const ServedByHeader = "X-Kvroute-Served-By"

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

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Call is one request to send.
type Call struct {
	Kind Kind
	// Model overrides the client's model (a LoRA adapter); "" keeps it.
	Model     string
	Prompt    []uint32  // Completion
	Messages  []Message // Chat
	MaxTokens int
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

// Do sends one call to ep and reads the whole answer. It blocks until the
// answer is complete, ctx ends, or the connection fails.
func (c *Client) Do(ctx context.Context, ep Endpoint, call Call) (Reply, error) {
	body := requestBody{Model: c.Model, MaxTokens: call.MaxTokens, Stream: c.Stream}
	if call.Model != "" {
		body.Model = call.Model
	}
	path := "/v1/completions"
	if call.Kind == Chat {
		path = "/v1/chat/completions"
		body.Messages = call.Messages
	} else {
		body.Prompt = call.Prompt
	}
	if c.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Reply{}, fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(ep.URL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return Reply{}, fmt.Errorf("new request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	rep := Reply{Pod: ep.Pod}
	if p := resp.Header.Get(ServedByHeader); p != "" {
		rep.Pod = p
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return rep, &StatusError{Status: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		err = readStream(resp.Body, &rep, start)
	} else {
		rep.WallTTFT = time.Since(start)
		err = readBody(resp.Body, &rep)
	}
	rep.WallE2E = time.Since(start)
	return rep, err
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
		}
		rep.take(c)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return ErrTruncated
}
