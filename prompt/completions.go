package prompt

import (
	"encoding/json"

	"github.com/kvroute/kvroute/tokenids"
)

// parseCompletions reads a /v1/completions body. With batch, a prompt of
// several strings or token lists is read into Batch and Texts, and a list
// vLLM refuses is ErrBadJSON; without it (Parse), any list of more than
// one prompt is ErrNoPrompt, as it always was.
func parseCompletions(body []byte, batch bool) (Prompt, error) {
	var f wireFields
	if err := f.scan(body, f.takeIDs); err != nil {
		return Prompt{}, err
	}
	p := Prompt{Tools: nullToNil(f.tools)}
	if err := f.common(&p); err != nil {
		return Prompt{}, err
	}
	if err := f.chatOptions(&p); err != nil {
		return Prompt{}, err
	}
	p.MaxTokens = jsonCount(f.maxTokens)
	if f.promptIDs != nil {
		p.Tokens = f.promptIDs
		return p, nil
	}
	raw := nullToNil(f.prompt)
	err := parseCompletionPrompt(raw, &p)
	if err == ErrNoPrompt && batch && len(raw) > 0 && raw[0] == '[' {
		return p, parseBatch(raw, &p)
	}
	return p, err
}

// takeIDs parses a completion prompt of token ids in the scan's one pass
// (tokenids.ParsePrefix accepts only valid JSON).
func (f *wireFields) takeIDs(key []byte, v int) int {
	if string(key) != "prompt" {
		return 0
	}
	ids, n, ok := tokenids.ParsePrefix(f.body[v:])
	if !ok {
		return 0
	}
	f.taken = ids
	return n
}

// parseCompletionPrompt accepts the four shapes vLLM does: a string, a list
// with one string, token ids, or a list with one list of token ids.
func parseCompletionPrompt(raw json.RawMessage, p *Prompt) error {
	if len(raw) == 0 {
		return ErrNoPrompt
	}
	if ids, ok := tokenids.Parse(raw); ok {
		p.Tokens = ids
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return ErrNoPrompt
		}
		p.Text = s
		return nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		p.Tokens = ids
		return nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) == 1 && ss[0] != "" {
		p.Text = ss[0]
		return nil
	}
	var ii [][]uint32
	if json.Unmarshal(raw, &ii) == nil && len(ii) == 1 && len(ii[0]) > 0 {
		p.Tokens = ii[0]
		return nil
	}
	return ErrNoPrompt
}

// parseBatch reads a prompt list of two or more strings or token lists
// into p.Batch (and p.Texts), one engine request each. vLLM's
// CompletionRequest.prompt is list[int] | list[list[int]] | str |
// list[str]: pydantic refuses a list mixing strings and lists with 400,
// and vLLM's renderer refuses an empty prompt in a batch ("prompt cannot
// be empty"), so both are ErrBadJSON here. A list of one that is empty, or
// ids vLLM would take but uint32 cannot hold, stay ErrNoPrompt: the
// engine, not routing, answers them.
func parseBatch(raw []byte, p *Prompt) error {
	var ints []int64
	if json.Unmarshal(raw, &ints) == nil {
		return ErrNoPrompt // one prompt of ids vLLM's own checks answer
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) < 2 {
			return ErrNoPrompt
		}
		for i, t := range texts {
			if t == "" {
				return badf("prompt[%d]: the prompt cannot be empty", i)
			}
		}
		p.Batch, p.Texts = make([][]uint32, len(texts)), texts
		return nil
	}
	var lists []json.RawMessage
	if json.Unmarshal(raw, &lists) != nil {
		return ErrNoPrompt
	}
	if len(lists) < 2 {
		return ErrNoPrompt
	}
	batch := make([][]uint32, len(lists))
	for i, l := range lists {
		if len(l) == 0 || l[0] != '[' {
			return badf("prompt: want a string, a list of strings, a list of token ids or a list of lists of token ids; entry %d is neither", i)
		}
		ids, ok := tokenids.Parse(l)
		if !ok {
			var elems []json.RawMessage
			if json.Unmarshal(l, &elems) == nil && len(elems) == 0 {
				return badf("prompt[%d]: the prompt cannot be empty", i)
			}
			if json.Unmarshal(l, &ints) != nil {
				return badf("prompt[%d]: want a list of token ids", i)
			}
			return ErrNoPrompt // ids out of range: vLLM refuses them itself
		}
		batch[i] = ids
	}
	p.Batch = batch
	return nil
}
