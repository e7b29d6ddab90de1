package forward

import (
	"bytes"
	"context"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/textprefix"
)

// TextPrefixes routes chat prompts on what earlier requests taught it, so
// that a text prompt whose leading messages were seen before is routed
// without a /tokenize call on the request path; *textroute.Router
// satisfies it.
type TextPrefixes interface {
	// Keys returns the routing keys and prompt tokens of a chat prompt,
	// given split into its messages (nil keys: route by load). after is
	// called once the request has been served; it must not block.
	Keys(ctx context.Context, p Prompt, msgs []textprefix.Message) (keys []blockkey.Key, tokens int, after func())
}

// SetTextPrefixes routes chat prompts through t (call before serving).
func (h *Handler) SetTextPrefixes(t TextPrefixes) { h.text = t }

// routeKeys is keys, with chat prompts going through the text prefixes
// when they are set.
func (h *Handler) routeKeys(ctx context.Context, p Prompt, perr error) ([]blockkey.Key, int, func()) {
	if perr == nil && p.Chat && h.text != nil {
		if msgs, err := splitMessages(p.Messages); err == nil && len(msgs) > 0 {
			return h.text.Keys(ctx, p, msgs)
		}
	}
	keys, tokens := h.keys(ctx, p, perr)
	return keys, tokens, func() {}
}

// end fails unless only space follows i.
func (s scanner) end(i int) error {
	if i = s.space(i); i != len(s.b) {
		return s.fail(i, "data after the messages")
	}
	return nil
}

// splitMessages cuts a messages array into its elements' raw JSON and
// marks assistant turns. It reads the bytes once, with the body's scanner.
func splitMessages(raw []byte) ([]textprefix.Message, error) {
	s := scanner{b: raw}
	i := s.space(0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, s.fail(i, "want an array")
	}
	var out []textprefix.Message
	i = s.space(i + 1)
	if i < len(raw) && raw[i] == ']' {
		return nil, s.end(i + 1)
	}
	for {
		if i >= len(raw) {
			return nil, s.fail(i, "want a message")
		}
		var end int
		var err error
		assistant := false
		if raw[i] == '{' {
			end, err = s.object(i, 2, func(key, val []byte) error {
				if string(key) == "role" {
					assistant = bytes.Equal(val, []byte(`"assistant"`))
				}
				return nil
			})
		} else {
			end, err = s.value(i, 1)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, textprefix.Message{Raw: raw[i:end], Assistant: assistant})
		i = s.space(end)
		switch {
		case i < len(raw) && raw[i] == ',':
			i = s.space(i + 1)
		case i < len(raw) && raw[i] == ']':
			if err := s.end(i + 1); err != nil {
				return nil, err
			}
			return out, nil
		default:
			return nil, s.fail(i, "want ',' or ']' in the messages")
		}
	}
}
