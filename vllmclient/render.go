package vllmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
)

// Rendered is one engine request as vLLM's render endpoint says it will
// compute it: the prompt's token ids and its multimodal items.
type Rendered struct {
	Tokens []uint32
	MM     []MMItem
}

// MMItem is one multimodal item of a rendered prompt: the identifier vLLM
// hashes its blocks with (features.mm_hashes) and its placeholder tokens
// (features.mm_placeholders).
type MMItem struct {
	ID             string
	Offset, Length int
}

// ErrNoRender means the engine has no render endpoint for the API: vLLM
// before v0.29 (Messages) or v0.30 (Responses), or v0.30 without
// --enable-scale-out, which answers 404 (or 405) as for any unknown path.
var ErrNoRender = errors.New("the engine has no render endpoint for this API")

// Render posts body, byte for byte as the client sent it, to the local
// vLLM's render endpoint path (/v1/chat/completions/render,
// /v1/completions/render, /v1/messages/render, /v1/responses/render) and
// returns the engine requests it renders to: one, or one per prompt for a
// batch of completions. The raw body matters: re-serialising it changes
// the order of tool schema keys and so the tokens (llm-d-router#2641).
func (c *Client) Render(ctx context.Context, path string, body []byte) ([]Rendered, error) {
	b, err := c.do(ctx, http.MethodPost, path, body)
	var he *HTTPError
	if errors.As(err, &he) && (he.Status == http.StatusNotFound || he.Status == http.StatusMethodNotAllowed) {
		return nil, fmt.Errorf("%w (%s: %d)", ErrNoRender, path, he.Status)
	}
	if err != nil {
		return nil, err
	}
	return parseRendered(b)
}

// generateRequest is what Render reads of vLLM's GenerateRequest
// (vllm/entrypoints/serve/disagg/protocol.py).
type generateRequest struct {
	TokenIDs *[]uint32      `json:"token_ids"`
	Features *renderFeature `json:"features"`
}

// renderFeature holds mm_hashes and mm_placeholders either as lists or
// keyed by modality (both forms are read; items pair up in order).
type renderFeature struct {
	Hashes       json.RawMessage `json:"mm_hashes"`
	Placeholders json.RawMessage `json:"mm_placeholders"`
}

type placeholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

func parseRendered(b []byte) ([]Rendered, error) {
	b = bytes.TrimSpace(b)
	var list []generateRequest
	if len(b) > 0 && b[0] == '[' {
		if err := json.Unmarshal(b, &list); err != nil {
			return nil, fmt.Errorf("render response: %w", err)
		}
	} else {
		var one generateRequest
		if err := json.Unmarshal(b, &one); err != nil {
			return nil, fmt.Errorf("render response: %w", err)
		}
		list = []generateRequest{one}
	}
	out := make([]Rendered, 0, len(list))
	for i, g := range list {
		if g.TokenIDs == nil {
			return nil, fmt.Errorf("render response: entry %d has no token_ids", i)
		}
		r := Rendered{Tokens: *g.TokenIDs}
		if g.Features != nil {
			mm, err := g.Features.items()
			if err != nil {
				return nil, fmt.Errorf("render response: entry %d: %w", i, err)
			}
			r.MM = mm
		}
		out = append(out, r)
	}
	return out, nil
}

func (f *renderFeature) items() ([]MMItem, error) {
	var hashes []string
	if err := byModality(f.Hashes, &hashes); err != nil {
		return nil, fmt.Errorf("mm_hashes: %w", err)
	}
	var ph []placeholder
	if err := byModality(f.Placeholders, &ph); err != nil {
		return nil, fmt.Errorf("mm_placeholders: %w", err)
	}
	if len(hashes) != len(ph) {
		return nil, fmt.Errorf("%d mm_hashes for %d mm_placeholders", len(hashes), len(ph))
	}
	out := make([]MMItem, len(hashes))
	for i := range hashes {
		out[i] = MMItem{ID: hashes[i], Offset: ph[i].Offset, Length: ph[i].Length}
	}
	return out, nil
}

// byModality decodes a list, or a map of modality to list (modalities in
// name order), into *dst; null or absent is an empty list.
func byModality[T any](raw json.RawMessage, dst *[]T) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '[' {
		return json.Unmarshal(raw, dst)
	}
	var m map[string][]T
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		*dst = append(*dst, m[k]...)
	}
	return nil
}
