package forward

import (
	"bytes"
	"context"
	"errors"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
)

// TextPrefixes routes chat prompts on what earlier requests taught it, so
// that a text prompt whose leading messages were seen before is routed
// without a /tokenize call on the request path; *textroute.Router
// satisfies it.
type TextPrefixes interface {
	// Keys returns the routing keys and prompt tokens of a chat prompt,
	// given split into its messages (nil keys: route by load); keysOf is
	// the front's rule from p's token ids to its keys. after is called
	// once the request has been served; it must not block.
	Keys(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, keysOf func([]uint32) []blockkey.Key) (keys []blockkey.Key, tokens int, after func())
}

// SetTextPrefixes routes chat prompts through t (call before serving).
func (h *Handler) SetTextPrefixes(t TextPrefixes) { h.text = t }

// routeKeys is keys, with chat prompts going through the text prefixes
// when they are set.
func (h *Handler) routeKeys(ctx context.Context, p prompt.Prompt, perr error) ([]blockkey.Key, int, func()) {
	if perr == nil && p.Chat && h.text != nil {
		if msgs, err := splitMessages(p.Messages); err == nil && len(msgs) > 0 {
			return h.text.Keys(ctx, p, msgs, func(ids []uint32) []blockkey.Key { return h.keysOf(p, ids) })
		}
	}
	keys, tokens := h.keys(ctx, p, perr)
	return keys, tokens, func() {}
}

// splitMessages cuts a messages array into its elements' raw JSON and
// marks assistant turns (a top-level "role" of "assistant"). raw must be
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
	wantKey, roleKey, assistant := false, false, false
	closeScalar := func(end int) {
		if start >= 0 && depth == 1 {
			out = append(out, textprefix.Message{Raw: raw[start:end], Assistant: assistant})
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
				start, assistant = i, false
			}
			if depth == 2 {
				str := raw[i+1 : end-1]
				switch {
				case wantKey:
					roleKey, wantKey = string(str) == "role", false
				case roleKey:
					assistant, roleKey = string(str) == "assistant", false
				}
			}
			i = end - 1
			if depth == 1 {
				closeScalar(end)
			}
		case '{', '[':
			if depth == 1 {
				start, assistant = i, false
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
				out = append(out, textprefix.Message{Raw: raw[start : i+1], Assistant: assistant})
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
				start, assistant = i, false
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
