package forward

import (
	"context"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// keyed is what routing knows of a request's prompts: the first prompt's
// routing keys, a batch's further prompts', every prompt's tokens, and,
// for a chat routed on learned text prefixes, what to call after the answer.
type keyed struct {
	keys   []blockkey.Key
	batch  [][]blockkey.Key
	tokens int
	after  func(promptIDs []uint32)
	// path says how the keys were had, for /debug/route and the logs:
	// "ids", "tokenize", "text-prefix", "render", "none".
	path string
}

// routeKeys computes the request's routing keys, whatever its API: every
// API is one request shape in prompt, and from there one path
// (docs/design.md D11). A prompt with images is rendered where the engine
// can, since only render says where each image's placeholders are and how
// vLLM identifies it; a chat (Messages and Responses are chats) goes
// through the learned text prefixes when they are set; a batch keys each
// prompt. Any failure routes by load alone (D6).
func (h *Handler) routeKeys(ctx context.Context, p prompt.Prompt, perr error) keyed {
	if perr != nil {
		return keyed{path: "none"}
	}
	if len(p.Images) > 0 && h.render != nil {
		if k, ok := h.renderKeys(ctx, p); ok {
			return k
		}
	}
	if len(p.Batch) > 0 {
		return h.batchKeys(ctx, p)
	}
	if p.Chat && h.text != nil {
		if msgs, err := splitMessages(p.Messages); err == nil && len(msgs) > 0 {
			keys, tokens, after := h.text.Keys(ctx, p, msgs, h.root(p))
			return keyed{keys: keys, tokens: tokens, after: after, path: "text-prefix"}
		}
	}
	keys, tokens := h.keys(ctx, p, nil)
	path := "tokenize"
	if p.Tokens != nil {
		path = "ids"
	}
	return keyed{keys: keys, tokens: tokens, path: path}
}

// idsOnly reports whether routeKeys keys p from its token ids alone,
// calling no engine (/tokenize, render, the learned text prefixes): a
// request that calls none needs no watch over its engine calls.
func idsOnly(p prompt.Prompt, perr error) bool {
	return perr != nil || (len(p.Images) == 0 && !p.Chat && len(p.Texts) == 0 && (p.Tokens != nil || len(p.Batch) > 0))
}

// batchKeys keys each prompt of a batch of completions: token ids as they
// are, texts through /tokenize (or one render call for them all).
func (h *Handler) batchKeys(ctx context.Context, p prompt.Prompt) keyed {
	k := keyed{path: "ids"}
	add := func(ks []blockkey.Key, tokens int) {
		if k.keys == nil && k.batch == nil {
			k.keys = ks
			if ks == nil {
				k.keys = []blockkey.Key{} // the first prompt stays first
			}
		} else {
			k.batch = append(k.batch, ks)
		}
		k.tokens += tokens
	}
	if len(p.Texts) > 0 && h.render != nil {
		if rs, err := h.render.render(ctx, p.API, p.Raw); err == nil && len(rs) == len(p.Batch) {
			for _, r := range rs {
				add(h.cfg.Scheme.RequestMM(h.modelRoot(p), r.Tokens, r.MM, p.CacheSalt), len(r.Tokens))
			}
			k.path = "render"
			return k
		}
	}
	for i, ids := range p.Batch {
		if ids == nil && i < len(p.Texts) {
			one := p
			one.Batch, one.Texts, one.Text = nil, nil, p.Texts[i]
			ks, n := h.keys(ctx, one, nil)
			add(ks, n)
			k.path = "tokenize"
			continue
		}
		add(h.keysOf(p, ids), len(ids))
	}
	return k
}

// renderKeys keys a prompt from the engine's render of the client's raw
// body: the exact tokens and each image's identifier and placeholders, so
// a different image never matches past the blocks before it. ok is false
// when the engine cannot render (the caller keys it the usual way: its
// image blocks are then keyed without their identifiers and match nothing
// the index holds, which undervalues the prompt but never overvalues it).
func (h *Handler) renderKeys(ctx context.Context, p prompt.Prompt) (keyed, bool) {
	rs, err := h.render.render(ctx, p.API, p.Raw)
	if err != nil || len(rs) == 0 {
		return keyed{}, false
	}
	k := keyed{path: "render"}
	for i, r := range rs {
		ks := h.cfg.Scheme.RequestMM(h.modelRoot(p), r.Tokens, r.MM, p.CacheSalt)
		if i == 0 {
			k.keys = ks
		} else {
			k.batch = append(k.batch, ks)
		}
		k.tokens += len(r.Tokens)
	}
	return k, true
}

// remember records where a request's prefixes were just sent: this
// sidecar's recent forwards (its own follow-ups find them before any
// digest) and a claim every peer hears with the next load push, of what
// the choice d did not find there already (a single prompt's; a batch's
// match is its prompts' sum).
func (h *Handler) remember(peer string, k keyed, d route.Decision) {
	all := append([][]blockkey.Key{k.keys}, k.batch...)
	held := 0
	if len(k.batch) == 0 {
		held = d.HeldAt(peer)
	}
	for _, keys := range all {
		if len(keys) == 0 {
			continue
		}
		if peer != "" {
			h.mu.Lock()
			h.recent.Record(peer, keys, h.now())
			h.mu.Unlock()
		}
		if h.peers != nil {
			to := peer
			if to == "" {
				to = h.cfg.Self
			}
			if cs := route.ClaimsFor(h.cfg.Route, keys, held); len(cs) > 0 {
				h.peers.Claim(to, cs)
			}
		}
	}
}
