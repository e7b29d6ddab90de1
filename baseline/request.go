package baseline

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
)

// Request is what the policies read from one OpenAI request.
type Request struct {
	// Model is the request's model field.
	Model string
	// FirstUser is what KubeAI hashes: the completions prompt, or the first
	// user message of a chat (text parts joined). Token prompts are their
	// decimal ids joined by commas.
	FirstUser string
	// Input is what GIE's approximate scorer hashes: the completions prompt
	// (token prompts as for FirstUser) or the compact JSON of the chat
	// messages.
	Input string
	// Tokens are the prompt's token ids, nil until known (central-precise
	// asks a simulator's /tokenize for text prompts).
	Tokens []uint32
	// Batch are the token ids of each prompt of a batch of completions
	// (Tokens is then nil; an entry is nil until known): vLLM runs one
	// engine request per prompt, and the batch is sent whole to one pod.
	Batch [][]uint32
	// MM are the images of the prompt as render placed them: blocks that
	// overlap an image are keyed with its identifier, as vLLM hashes them.
	MM []blockkey.MM
	// Salt is the request's cache_salt.
	Salt string
}

// requestFrom derives the policy inputs from a parsed body.
func requestFrom(p prompt.Prompt) Request {
	r := Request{Model: p.Model, Tokens: p.Tokens, Salt: p.CacheSalt}
	if p.Batch != nil {
		r.Batch = make([][]uint32, len(p.Batch))
		copy(r.Batch, p.Batch)
	}
	switch {
	case p.Batch != nil:
		// What KubeAI and GIE hash of a batch is its first prompt.
		if p.Batch[0] != nil {
			r.FirstUser = joinIDs(p.Batch[0])
		} else if len(p.Texts) > 0 {
			r.FirstUser = p.Texts[0]
		}
		r.Input = r.FirstUser
	case p.Chat:
		r.FirstUser = firstUserMessage(p.Messages)
		var b bytes.Buffer
		if json.Compact(&b, p.Messages) == nil {
			r.Input = b.String()
		}
	case p.Tokens != nil:
		r.FirstUser = joinIDs(p.Tokens)
		r.Input = r.FirstUser
	default:
		r.FirstUser, r.Input = p.Text, p.Text
	}
	return r
}

// joinIDs renders token ids as "1,2,3".
func joinIDs(ids []uint32) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(id), 10))
	}
	return b.String()
}

// firstUserMessage returns the text of the first message with role "user":
// a string content, or the "text" parts of an array content joined by
// newlines. Malformed messages give "".
func firstUserMessage(raw json.RawMessage) string {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return ""
	}
	for _, m := range msgs {
		if m.Role != "user" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &parts) != nil {
			return ""
		}
		var texts []string
		for _, p := range parts {
			if p.Type == "text" {
				texts = append(texts, p.Text)
			}
		}
		return strings.Join(texts, "\n")
	}
	return ""
}
