package forward

import (
	"bytes"
	"io"
)

// The member that holds an answer's cached prompt tokens: OpenAI's APIs
// name it cached_tokens (usage.prompt_tokens_details in chat and
// completions, usage.input_tokens_details in Responses); Anthropic's
// Messages usage has cache_read_input_tokens.
var (
	cachedField          = []byte(`"cached_tokens":`)
	anthropicCachedField = []byte(`"cache_read_input_tokens":`)
)

// usageTap passes a response body through untouched and calls found once
// with the first cached-tokens figure it sees (field), in a plain JSON
// body or in an SSE stream's usage event. It keeps a short tail so a
// figure split across reads is still seen.
type usageTap struct {
	rc    io.ReadCloser
	field []byte
	found func(int)
	tail  []byte
	buf   []byte // the tail and a read, searched together: reused read after read
	done  bool
}

func (u *usageTap) Read(p []byte) (int, error) {
	n, err := u.rc.Read(p)
	if n > 0 && !u.done {
		u.scan(p[:n])
	}
	return n, err
}

func (u *usageTap) Close() error { return u.rc.Close() }

func (u *usageTap) scan(b []byte) {
	buf := b // no tail (the first read): searched in place, not copied
	if len(u.tail) > 0 {
		// A stream's every event is a read: one buffer for them all, not
		// an allocation per event.
		u.buf = append(append(u.buf[:0], u.tail...), b...)
		buf = u.buf
	}
	if i := bytes.Index(buf, u.field); i >= 0 {
		rest := bytes.TrimLeft(buf[i+len(u.field):], " ")
		v, ok, complete := leadingInt(rest)
		if complete {
			u.done = true
			if ok {
				u.found(v)
			}
			return
		}
		u.tail = append([]byte(nil), buf[i:]...)
		return
	}
	keep := len(u.field) + 24
	if len(buf) > keep {
		buf = buf[len(buf)-keep:]
	}
	u.tail = append(u.tail[:0], buf...)
}

// leadingInt parses the digits at the start of b. complete is false when b
// ends inside the number (more bytes may follow).
func leadingInt(b []byte) (v int, ok, complete bool) {
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' && i < 12 {
		v = v*10 + int(b[i]-'0')
		i++
	}
	if i == len(b) {
		return 0, false, false
	}
	return v, i > 0, true
}
