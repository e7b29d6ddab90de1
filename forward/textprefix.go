package forward

import (
	"bytes"
	"context"
	"errors"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
	"github.com/kvroute/kvroute/tokenids"
)

// TextPrefixes routes chat prompts on what earlier requests taught it, so
// that a text prompt whose leading messages were seen before is routed
// without a /tokenize call on the request path; *textroute.Router
// satisfies it.
type TextPrefixes interface {
	// Keys returns the routing keys and prompt tokens of a chat prompt,
	// given split into its messages (nil keys: route by load); root is
	// the chain root the front keys p's tokens from (its model's), under
	// the same blockkey.Scheme. after is called
	// once the request has been served, with the prompt's token ids when
	// the engine's answer carried them (nil otherwise); it must not block.
	Keys(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, root blockkey.Key) (keys []blockkey.Key, tokens int, after func(promptIDs []uint32))
}

// SetTextPrefixes routes chat prompts through t (call before serving).
// With ids, chats ask the engine for their prompt's token ids (vLLM's
// return_token_ids), which after then gets; a client that did not ask
// for them gets null in their place, as vLLM answers without the flag.
func (h *Handler) SetTextPrefixes(t TextPrefixes, ids bool) { h.text, h.textIDs = t, ids }

// askIDs sets up st to take the prompt's token ids from the answer, and
// returns the body to send: with return_token_ids set when the client
// left it unset. A client's false is kept (nothing is taken).
func (h *Handler) askIDs(body []byte, p prompt.Prompt, st *reqState) []byte {
	if !h.textIDs {
		return body
	}
	switch {
	case p.ReturnTokenIDs == nil:
		st.tapIDs, st.stripIDs = true, true
		return askTokenIDs(body)
	case *p.ReturnTokenIDs:
		st.tapIDs = true
	}
	return body
}

// parseIDs parses the prompt_token_ids an answer carried (nil: none).
func parseIDs(raw []byte) []uint32 {
	if raw == nil {
		return nil
	}
	ids, _ := tokenids.Parse(raw)
	return ids
}

// splitMessages cuts a messages array into its elements' raw JSON and
// finds each one's top-level "role" string. raw must be
// valid JSON (ParsePrompt validated the body): this pass only finds the
// element boundaries, jumping through strings with bytes.IndexByte, so it
// costs a small part of the body scan (a validating pass took 0.7 ms on a
// 160 KB conversation). On invalid input it returns an error or
// meaningless elements, never panics.
func splitMessages(raw []byte) ([]textprefix.Message, error) {
	i := space(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, errors.New("messages: want an array")
	}
	var out []textprefix.Message
	depth, start := 1, -1
	wantKey, roleKey := false, false
	var role []byte
	closeScalar := func(end int) {
		if start >= 0 && depth == 1 {
			out = append(out, textprefix.Message{Raw: raw[start:end], Role: role})
			start = -1
		}
	}
	for i++; i < len(raw); i++ {
		c := raw[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			if depth == 1 {
				closeScalar(i)
			}
		case '"':
			end, err := stringEnd(raw, i)
			if err != nil {
				return nil, err
			}
			if depth == 1 && start < 0 {
				start, role = i, nil
			}
			if depth == 2 {
				str := raw[i+1 : end-1]
				switch {
				case wantKey:
					roleKey, wantKey = string(str) == "role", false
				case roleKey:
					role, roleKey = str, false
				}
			}
			i = end - 1
			if depth == 1 {
				closeScalar(end)
			}
		case '{', '[':
			if depth == 1 {
				start, role = i, nil
			}
			depth++
			wantKey = depth == 2 && c == '{'
		case '}', ']':
			if depth == 1 {
				closeScalar(i)
			}
			depth--
			if depth == 0 {
				if space(raw, i+1) != len(raw) {
					return nil, errors.New("messages: data after the array")
				}
				return out, nil
			}
			if depth == 1 {
				out = append(out, textprefix.Message{Raw: raw[start : i+1], Role: role})
				start = -1
			}
		case ',':
			if depth == 1 {
				closeScalar(i)
			}
			if depth == 2 {
				wantKey, roleKey = true, false
			}
		default:
			if depth == 1 && start < 0 {
				start, role = i, nil
			}
		}
	}
	return nil, errors.New("messages: unterminated array")
}

// stringEnd returns the index after the string that starts at raw[i].
func stringEnd(raw []byte, i int) (int, error) {
	for j := i + 1; ; {
		k := bytes.IndexByte(raw[j:], '"')
		if k < 0 {
			return 0, errors.New("messages: unterminated string")
		}
		q := j + k
		n := 0
		for n < q-i-1 && raw[q-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

// space returns the index of the first non-space byte at or after i.
func space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
