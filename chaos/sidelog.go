package chaos

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Attempt is one forward attempt a sidecar logged: at debug level every
// routed request's log line lists the targets it tried in order ("tried"),
// the last being the one that served it or failed last.
type Attempt struct {
	At     time.Time // when the answer's headers came (whole seconds)
	Req    string    // the request id (the client's X-Request-Id)
	Node   string    // the sidecar that forwarded
	Target string    // the peer tried ("local" for its own vLLM)
	// Note is the forwarding sidecar's match_note for its choice: where
	// the chosen peer's match came from ("claim", "recent", ...).
	Note string
}

// routedLine is the part of the sidecar's "routed" debug line we read.
type routedLine struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node"`
	Req     string    `json:"req"`
	Message string    `json:"message"`
	Tried   []string  `json:"tried"`
	Note    string    `json:"match_note"`
}

// readAttempts reads every sidecar log in dir (*-sidecar.log) and returns
// the forward attempts to peers. Lines that are not "routed" lines, or
// do not parse, are skipped: the logs are the sidecars', not ours.
func readAttempts(dir string) ([]Attempt, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*-sidecar.log"))
	if err != nil {
		return nil, err
	}
	var out []Attempt
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return out, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), `"routed"`) {
				continue
			}
			var r routedLine
			if json.Unmarshal(line, &r) != nil || r.Message != "routed" {
				continue
			}
			for _, t := range r.Tried {
				if t != "local" {
					out = append(out, Attempt{At: r.Time, Req: r.Req, Node: r.Node, Target: t, Note: r.Note})
				}
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}
