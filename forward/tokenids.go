package forward

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// A chat prompt's token ids come back with its answer when the request
// asks for them (vLLM's return_token_ids, v0.10.2 on): the text prefixes
// then learn the conversation from the tokenization the engine did anyway,
// instead of tokenizing it a second time on the engine's one tokenizer
// thread, where it queued in front of the requests being served. vLLM
// answers without the flag with the same fields set to null, so replacing
// the ids by null gives the client what it would have got.

var (
	askField    = []byte(`"return_token_ids":true`)
	promptField = []byte(`"prompt_token_ids":`)
	outputField = []byte(`"token_ids":`)
	null        = []byte("null")
	eventEnd    = []byte("\n\n")
)

// askTokenIDs returns body, a JSON object, with return_token_ids set as
// its first member. The caller checked that the client did not set it.
func askTokenIDs(body []byte) []byte {
	i := space(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body
	}
	out := make([]byte, 0, len(body)+len(askField)+1)
	out = append(out, body[:i+1]...)
	out = append(out, askField...)
	if j := space(body, i+1); j < len(body) && body[j] != '}' {
		out = append(out, ',')
	}
	return append(out, body[i+1:]...)
}

// takeTokenIDs finds the first prompt_token_ids array in b and returns a
// copy of it; with strip it also replaces every prompt_token_ids and
// token_ids array in b by null, in place of the bytes (out may alias b).
// b is an answer's JSON, or a run of SSE events of JSON. A quote that is
// not escaped and is followed by a field name and a colon opens a member
// name in valid JSON (inside a string every quote is escaped), so the
// patterns need no parse; what is not a flat array of numbers after such a
// name is left as it is, and on invalid input the output is merely as
// invalid.
func takeTokenIDs(b []byte, strip bool) (out, prompt []byte) {
	out = b
	for _, f := range [][]byte{promptField, outputField} {
		if !strip && prompt != nil {
			break
		}
		var w []byte // the rewritten bytes so far, when something was cut
		last := 0    // b[last:] is not yet in w
		for i := 0; ; {
			k := bytes.Index(b[i:], f)
			if k < 0 {
				break
			}
			at := i + k
			i = at + len(f)
			if escaped(b, at) {
				continue
			}
			v := space(b, i)
			end := flatArrayEnd(b, v)
			if end < 0 {
				continue
			}
			if bytes.Equal(f, promptField) && prompt == nil {
				prompt = bytes.Clone(b[v:end])
			}
			if strip {
				w = append(append(w, b[last:v]...), null...)
				last = end
			}
			i = end
		}
		if w != nil {
			b = append(w, b[last:]...)
			out = b
		}
	}
	return out, prompt
}

// escaped reports whether the quote at b[i] follows an odd run of
// backslashes.
func escaped(b []byte, i int) bool {
	n := 0
	for i-1-n >= 0 && b[i-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

// flatArrayEnd returns the index after the array of numbers that starts at
// b[i], or -1 when none does.
func flatArrayEnd(b []byte, i int) int {
	if i >= len(b) || b[i] != '[' {
		return -1
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == ']':
			return j + 1
		case c >= '0' && c <= '9', c == ',', c == ' ', c == '\n', c == '\r', c == '\t', c == '-', c == '.', c == 'e', c == 'E', c == '+':
		default:
			return -1
		}
	}
	return -1
}

// tokenIDsTap passes an SSE answer through, event by event, taking the
// prompt's token ids from it (and nulling the ids when strip). It holds
// back only the bytes of an event not yet complete.
type tokenIDsTap struct {
	rc    io.ReadCloser
	strip bool
	found func(ids []byte)
	buf   []byte // read from rc, not yet returned
	ready int    // buf[:ready] is processed and may be returned
	done  bool   // the ids were found (or strip is off and one was)
	eof   error
	chunk []byte
}

func newTokenIDsTap(rc io.ReadCloser, strip bool, found func([]byte)) *tokenIDsTap {
	return &tokenIDsTap{rc: rc, strip: strip, found: found, chunk: make([]byte, 32<<10)}
}

func (t *tokenIDsTap) Read(p []byte) (int, error) {
	for t.ready == 0 {
		if t.eof != nil {
			if len(t.buf) > 0 { // a last event without its blank line
				t.process(len(t.buf))
				continue
			}
			return 0, t.eof
		}
		if t.done && !t.strip && len(t.buf) == 0 {
			return t.rc.Read(p) // nothing left to look for
		}
		n, err := t.rc.Read(t.chunk)
		old := len(t.buf)
		t.buf = append(t.buf, t.chunk[:n]...)
		if err != nil {
			t.eof = err
		}
		// An event ends with a blank line; look only where a new one can be.
		if k := bytes.LastIndex(t.buf[max(0, old-1):], eventEnd); k >= 0 {
			t.process(max(0, old-1) + k + 2)
		}
	}
	n := copy(p, t.buf[:t.ready])
	t.buf = t.buf[n:]
	t.ready -= n
	if len(t.buf) == 0 {
		t.buf = t.buf[:0:0]
	}
	return n, nil
}

// process rewrites buf[:n], complete events, and marks it ready.
func (t *tokenIDsTap) process(n int) {
	if t.done && !t.strip {
		t.ready = n
		return
	}
	out, ids := takeTokenIDs(t.buf[:n], t.strip)
	if ids != nil && !t.done {
		t.done = true
		t.found(ids)
	}
	if n > 0 && &out[0] != &t.buf[0] { // rewritten into a new slice
		t.buf = append(out, t.buf[n:]...)
	}
	t.ready = len(out)
}

func (t *tokenIDsTap) Close() error { return t.rc.Close() }

// maxTappedBody bounds the JSON answer read whole to take its ids; a
// larger one passes untouched.
const maxTappedBody = 64 << 20

// tapTokenIDs takes the prompt's token ids from resp, an answer to a chat
// request that asked for them, and nulls them there when strip.
func tapTokenIDs(resp *http.Response, strip bool, found func([]byte)) error {
	if resp.Header.Get("Content-Encoding") != "" {
		return nil // compressed: passed through as it is (vLLM does not compress)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = newTokenIDsTap(resp.Body, strip, found)
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTappedBody+1))
	if err != nil {
		return err
	}
	if len(body) > maxTappedBody {
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
		return nil
	}
	resp.Body.Close()
	out, ids := takeTokenIDs(body, strip)
	if ids != nil {
		found(ids)
	}
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}
