package vllmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenids"
)

// ClientConfig configures a Client for the local vLLM's HTTP API.
type ClientConfig struct {
	// BaseURL is vLLM's server, default "http://127.0.0.1:8001" (the sidecar
	// owns :8000 in the pod).
	BaseURL string
	// Timeout bounds each call, on top of the caller's ctx (default 5s).
	// Tokenize sits on the request path, so keep it short: on error the
	// router falls back to load (D6).
	Timeout time.Duration
	// HTTP is the client to use; nil means a dedicated client with its own
	// keep-alive pool (default).
	HTTP *http.Client
}

// DefaultClientConfig returns the settings for vLLM on pod loopback.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{BaseURL: "http://127.0.0.1:8001", Timeout: 5 * time.Second}
}

// Client calls the local vLLM's /tokenize, /metrics, /health and /v1/models. It is safe
// for concurrent use.
type Client struct {
	base    string
	timeout time.Duration
	hc      *http.Client
}

// New returns a Client; zero fields of cfg take DefaultClientConfig values.
func New(cfg ClientConfig) *Client {
	d := DefaultClientConfig()
	if cfg.BaseURL == "" {
		cfg.BaseURL = d.BaseURL
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = d.Timeout
	}
	hc := cfg.HTTP
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// /tokenize is on the path of every text request; the default of
		// two idle connections would close and redial under concurrency.
		tr.MaxIdleConnsPerHost = 64
		tr.DisableCompression = true // loopback: gzip costs CPU, saves nothing
		hc = &http.Client{Transport: tr}
	}
	return &Client{base: strings.TrimRight(cfg.BaseURL, "/"), timeout: cfg.Timeout, hc: hc}
}

// HTTPError is a non-2xx answer from vLLM.
type HTTPError struct {
	Status int
	// Body is the start of the response body (at most 4 KiB).
	Body string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("vllm http %d: %s", e.Status, e.Body)
}

// maxBody bounds what is read from vLLM, so a broken server cannot make the
// sidecar allocate without limit (a 128k-token answer is ~1 MiB).
const (
	maxBody      = 32 << 20
	maxErrorBody = 4 << 10
)

// ErrBodyTooLarge reports a response above the client's size limit.
var ErrBodyTooLarge = errors.New("response body too large")

// TokenizeRequest is a /tokenize call. With Messages set it is the chat
// variant, otherwise the completion variant with Prompt. Raw JSON fields
// are sent byte for byte and unset fields are omitted, so vLLM applies its
// own defaults exactly as its chat and completions endpoints would.
type TokenizeRequest struct {
	Model  string // omitted when ""
	Prompt string // completion variant
	// Messages is the chat request's "messages" array as received.
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  *bool
	ContinueFinalMessage *bool
	AddSpecialTokens     *bool
}

// TokenizeRequestFor is the /tokenize call that yields the token ids vLLM
// will compute for a parsed request: its chat fields or prompt, passed as
// the client sent them.
func TokenizeRequestFor(p prompt.Prompt) TokenizeRequest {
	return TokenizeRequest{
		Model: p.Model, Prompt: p.Text, Messages: p.Messages, Tools: p.Tools,
		ChatTemplateKwargs: p.ChatTemplateKwargs, AddGenerationPrompt: p.AddGenerationPrompt,
		ContinueFinalMessage: p.ContinueFinalMessage, AddSpecialTokens: p.AddSpecialTokens,
	}
}

// body builds the JSON body by hand: encoding/json would re-indent the raw
// fields, and the point is to pass the user's JSON through untouched.
func (r TokenizeRequest) body() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	field := func(name string, v []byte) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(name))
		b.WriteByte(':')
		b.Write(v)
	}
	str := func(s string) []byte { v, _ := json.Marshal(s); return v } // a string always marshals
	boolean := func(name string, v *bool) {
		if v != nil {
			field(name, strconv.AppendBool(nil, *v))
		}
	}
	raw := func(name string, v json.RawMessage) error {
		if v == nil {
			return nil
		}
		if !json.Valid(v) {
			return fmt.Errorf("tokenize: %s is not valid json", name)
		}
		field(name, v)
		return nil
	}
	if r.Model != "" {
		field("model", str(r.Model))
	}
	if r.Messages != nil {
		if err := raw("messages", r.Messages); err != nil {
			return nil, err
		}
	} else {
		field("prompt", str(r.Prompt))
	}
	if err := errors.Join(raw("tools", r.Tools), raw("chat_template_kwargs", r.ChatTemplateKwargs)); err != nil {
		return nil, err
	}
	boolean("add_generation_prompt", r.AddGenerationPrompt)
	boolean("continue_final_message", r.ContinueFinalMessage)
	boolean("add_special_tokens", r.AddSpecialTokens)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Tokenize returns the token ids vLLM's own tokenizer and chat template
// produce for r.
func (c *Client) Tokenize(ctx context.Context, r TokenizeRequest) ([]uint32, error) {
	body, err := r.body()
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/tokenize", body)
	if err != nil {
		return nil, err
	}
	return parseTokenize(resp)
}

func parseTokenize(body []byte) ([]uint32, error) {
	var out struct {
		Tokens *tokenids.IDs `json:"tokens"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("tokenize response: %w", err)
	}
	if out.Tokens == nil {
		return nil, errors.New("tokenize response: no tokens field")
	}
	return []uint32(*out.Tokens), nil
}

// Health returns nil when vLLM answers GET /health with 200. A connection
// error means vLLM is not listening yet (it listens once the model loaded);
// *HTTPError with 503 means its engine died.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodGet, "/health", nil)
	return err
}

// Load scrapes GET /metrics; see Load for what it reads.
func (c *Client) Load(ctx context.Context) (Load, error) {
	body, err := c.do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return Load{}, err
	}
	return parseLoad(bytes.NewReader(body))
}

// Model is one entry of vLLM's GET /v1/models.
type Model struct {
	ID string
	// Parent is the base model a LoRA adapter applies to; "" for the base
	// model and each of its --served-model-name aliases.
	Parent string
}

// Models returns what vLLM serves, in the order /v1/models lists it: the
// base model's served names, then the LoRA adapters (--lora-modules and
// those loaded at run time).
func (c *Client) Models(ctx context.Context) ([]Model, error) {
	body, err := c.do(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return nil, err
	}
	return parseModels(body)
}

func parseModels(body []byte) ([]Model, error) {
	var list struct {
		Data *[]struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("models response: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New("models response: no data field")
	}
	out := make([]Model, 0, len(*list.Data))
	for i, d := range *list.Data {
		if d.ID == "" {
			return nil, fmt.Errorf("models response: entry %d has no id", i)
		}
		m := Model{ID: d.ID}
		if d.Parent != nil {
			m.Parent = *d.Parent
		}
		out = append(out, m)
	}
	return out, nil
}

// do sends one request and returns the body of a 2xx answer.
func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // best effort: the status is the error
		return nil, &HTTPError{Status: resp.StatusCode, Body: string(b)}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("%s %s: %w", method, path, ErrBodyTooLarge)
	}
	return b, nil
}
