package loadgen

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"
)

// conv is an agent conversation as its next request will send it.
type conv struct {
	// history is everything said, in order: what a request resends.
	history []Message
	// prevID is the stored response a Continue session's next request
	// names as previous_response_id ("" none: the history is sent), and
	// pending what was said after it.
	prevID  string
	pending []Message
}

func (c *conv) add(m Message) {
	c.history = append(c.history, m)
	c.pending = append(c.pending, m)
}

// request returns the messages and previous_response_id of the next
// request.
func (c *conv) request() ([]Message, string) {
	if c.prevID != "" {
		return c.pending, c.prevID
	}
	return c.history, ""
}

// answered records the assistant's answer m. A stored answer (stored, with
// its id) is the new previous_response_id; what follows it starts with m's
// tool calls, since vLLM's stored output holds the answer's text and not
// the calls the agent scripted after it (construct_input_messages appends
// only output messages).
func (c *conv) answered(m Message, stored bool, id string) {
	c.history = append(c.history, m)
	if stored && id != "" {
		c.prevID, c.pending = id, nil
		if len(m.ToolCalls) > 0 {
			c.pending = append(c.pending, Message{Role: "assistant", ToolCalls: m.ToolCalls})
		}
		return
	}
	c.pending = append(c.pending, m)
}

// clone is a copy that shares no slice with c.
func (c *conv) clone() conv {
	return conv{history: append([]Message(nil), c.history...), prevID: c.prevID,
		pending: append([]Message(nil), c.pending...)}
}

// billingHeader is Claude Code's per-request attribution text, which vLLM
// strips from the system prompt: the cch value changes with every request
// (a deterministic stand-in here, so every policy sends the same bytes).
func billingHeader(session string, turn int) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s.%d", session, turn)
	return fmt.Sprintf("x-anthropic-billing-header: cc_version=2.1.12.%03x; cc_entrypoint=cli; cch=%05x;",
		h.Sum32()>>20, h.Sum32()&0xfffff)
}

// subFailed stands in a tool result for a sub-agent that gave no answer.
const subFailed = "(the sub-agent failed)"

// agent runs an agent session (Messages or Responses) from conversation
// c, which it owns, and returns its last answer ("" when a turn failed or
// the run stopped before the last). arrival says x's first turn is a
// scheduled arrival, always sent; a sub-agent's first turn is a later
// turn of its parent's run, dropped past Stop like any other.
func (r *run) agent(ctx context.Context, x *Session, c conv, plain, arrival bool) string {
	scheduled := x.At
	if !arrival {
		scheduled = time.Since(r.start)
	}
	var subs []string // the last turn's sub-agents' answers
	last := ""
	for k := range x.Turns {
		turn := &x.Turns[k]
		if k > 0 || !arrival {
			if r.cfg.Stop > 0 && time.Since(r.start)+turn.Think > r.cfg.Stop {
				return ""
			}
			if !sleep(ctx, turn.Think) {
				return ""
			}
			scheduled = time.Since(r.start)
		}
		if k > 0 {
			if prev := x.Turns[k-1]; prev.Call != nil {
				result := turn.Result
				if len(prev.Spawn) > 0 {
					result = strings.Join(subs, "\n\n")
				}
				c.add(Message{Role: "tool", ToolCallID: prev.Call.ID, Content: result})
			}
		}
		if turn.User != "" || len(turn.Images) > 0 {
			c.add(Message{Role: "user", Content: turn.User, Images: turn.Images, ImagesFirst: k == 0})
		}
		msgs, prev := c.request()
		call := Call{Kind: x.Kind, Model: x.Model, MaxTokens: turn.MaxTokens, Plain: plain,
			Messages: msgs, System: x.System, Tools: x.Tools, PreviousResponseID: prev}
		if x.Billing && x.Kind == Messages {
			call.Billing = billingHeader(x.ID, k)
		}
		if x.Kind == Responses {
			store := x.Continue
			call.Store = &store
		}
		var fork conv
		if len(turn.Spawn) > 0 {
			fork = c.clone() // the parent's prefix as this turn sends it
		}
		rep, ok := r.send(ctx, x, k, scheduled, call)
		if !ok {
			return ""
		}
		last = rep.Text
		asst := Message{Role: "assistant", Content: rep.Text}
		if turn.Call != nil {
			asst.ToolCalls = []ToolCall{*turn.Call}
		}
		c.answered(asst, x.Kind == Responses && x.Continue, rep.ResponseID)
		subs = nil
		if len(turn.Spawn) > 0 {
			subs = r.spawn(ctx, turn.Spawn, fork, plain)
		}
	}
	return last
}

// spawn runs sub-agents at once, each from its own copy of fork, and
// returns their last answers in order once all have ended.
func (r *run) spawn(ctx context.Context, subs []Session, fork conv, plain bool) []string {
	out := make([]string, len(subs))
	var wg sync.WaitGroup
	for i := range subs {
		wg.Go(func() {
			if out[i] = r.agent(ctx, &subs[i], fork.clone(), plain, false); out[i] == "" {
				out[i] = subFailed
			}
		})
	}
	wg.Wait()
	return out
}
