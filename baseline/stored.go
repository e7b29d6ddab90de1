package baseline

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"sync"
)

// vLLM keeps its Responses store (VLLM_ENABLE_RESPONSES_API_STORE=1) in
// one process's memory: a request with previous_response_id,
// GET /v1/responses/{id} and POST /v1/responses/{id}/cancel are served
// right only by the pod that created the response, and any other answers
// 404. A central proxy sees every answer, so it learns which pod created
// each response from the answer's id and sends those requests there,
// whatever its policy.

// owners maps response ids to the backend that created them, the oldest
// forgotten first past its bound (vLLM's store has no bound of its own;
// a follow-up of a forgotten id is routed as a new request and 404s).
type owners struct {
	mu    sync.Mutex
	pod   map[string]int
	order []string // ring of ids in insertion order
	next  int
	max   int
}

func newOwners(max int) *owners {
	return &owners{pod: make(map[string]int), max: max}
}

func (o *owners) put(id string, pod int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.pod[id]; ok {
		o.pod[id] = pod
		return
	}
	if len(o.order) < o.max {
		o.order = append(o.order, id)
	} else {
		delete(o.pod, o.order[o.next])
		o.order[o.next] = id
		o.next = (o.next + 1) % o.max
	}
	o.pod[id] = pod
}

func (o *owners) get(id string) (int, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.pod[id]
	return p, ok
}

// storedID returns the response id a stored-response path names:
// /v1/responses/{id} and /v1/responses/{id}/cancel.
func storedID(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	return id, id != ""
}

// Bounds of what idTap holds while it looks for the id: a JSON answer's
// first bytes (vLLM's ResponsesResponse and the simulator put "id" first),
// one SSE line (response.created echoes the request's instructions and
// tools, so it can be long).
const (
	maxIDPrefix = 64 << 10
	maxIDLine   = 1 << 20
)

// idTap passes a Responses answer through unchanged and calls found with
// the response's id as soon as the bytes holding it were read, before they
// go on to the client: a client cannot send the follow-up naming an id it
// has not yet received, so the owner is always known by then. A JSON
// answer's id is its top-level "id"; a stream's is the response's id in
// its first response.* event (response.created).
type idTap struct {
	rc    io.ReadCloser
	sse   bool
	found func(id string)
	done  bool
	buf   []byte
}

func (t *idTap) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if !t.done && n > 0 {
		t.scan(p[:n])
	}
	return n, err
}

func (t *idTap) Close() error { return t.rc.Close() }

func (t *idTap) scan(b []byte) {
	if !t.sse {
		t.buf = append(t.buf, b[:min(len(b), maxIDPrefix-len(t.buf))]...)
		if id, ok := jsonID(t.buf); ok {
			t.report(id)
		} else if len(t.buf) >= maxIDPrefix {
			t.done = true
		}
		return
	}
	for len(b) > 0 && !t.done {
		i := bytes.IndexByte(b, '\n')
		line := b
		if i >= 0 {
			line = b[:i]
		}
		if len(t.buf)+len(line) <= maxIDLine {
			t.buf = append(t.buf, line...)
		} else {
			t.buf = t.buf[:0:0] // a line too long to hold: skip it
			if i < 0 {
				return
			}
		}
		if i < 0 {
			return
		}
		if id, ok := eventID(t.buf); ok {
			t.report(id)
		}
		t.buf = t.buf[:0]
		b = b[i+1:]
	}
}

func (t *idTap) report(id string) {
	t.done, t.buf = true, nil
	if id != "" {
		t.found(id)
	}
}

// jsonID returns the top-level "id" of a JSON object whose first bytes are
// b, ok once it is known ("" when the object has none, or it is no object).
func jsonID(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return "", false
	}
	if tok != json.Delim('{') {
		return "", true
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", false
		}
		if key == "id" {
			v, err := dec.Token()
			if err != nil {
				return "", false
			}
			s, _ := v.(string)
			return s, true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	_, err = dec.Token() // the closing brace, unless b ends before it
	return "", err == nil
}

// eventID reads one SSE line: ok for the data line of a response.* event,
// with its response's id.
func eventID(line []byte) (string, bool) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
	if !ok {
		return "", false
	}
	var e struct {
		Type     string `json:"type"`
		Response *struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &e) != nil || !strings.HasPrefix(e.Type, "response.") || e.Response == nil {
		return "", false
	}
	return e.Response.ID, true
}
