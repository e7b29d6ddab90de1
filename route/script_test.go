package route

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// NB: if TestScripts fails, run `go test ./route -run TestScripts -update`
// and inspect the diff. Commit the changes only if you understand what
// caused them and want them.
var update = flag.Bool("update", false, "rewrite testdata/*.txt with the actual output")

// keySet is an exact Matcher for tests: it holds keys and walks a chain
// until the first miss, as bloom.Digest does.
type keySet map[blockkey.Key]bool

func (s keySet) PrefixLen(keys []blockkey.Key) int {
	for i, k := range keys {
		if !s[k] {
			return i
		}
	}
	return len(keys)
}

// scriptNow is the fixed clock of every scenario.
var scriptNow = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// parseKeys reads "1-10,20,30-32" as keys 1..10, 20, 30..32.
func parseKeys(s string) ([]blockkey.Key, error) {
	var keys []blockkey.Key
	if s == "" || s == "none" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("keys %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil {
				return nil, fmt.Errorf("keys %q: %w", s, err)
			}
		}
		for k := a; k <= b; k++ {
			keys = append(keys, blockkey.Key(k))
		}
	}
	return keys, nil
}

// scenario is the state a script builds up.
type scenario struct {
	cfg    Config
	peers  []PeerView
	req    Request
	recent *Recent
}

func newScenario() *scenario {
	cfg := DefaultConfig()
	// The scripts were written for a bound of Slack 1 and MinHeadroom 4,
	// and their cases (a holder over the bound, spilling) are sized for
	// it: they keep it, and a script sets others with config.
	cfg.Slack, cfg.MinHeadroom = 1, 4
	return &scenario{
		cfg:    cfg,
		req:    Request{TokensPerKey: 16},
		recent: NewRecent(DefaultRecentConfig()),
	}
}

// run executes one command line and returns its output.
func (s *scenario) run(line string) (string, error) {
	f := strings.Fields(line)
	cmd, args := f[0], map[string]string{}
	var flags []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			flags = append(flags, a)
		}
	}
	age := func(k string) (time.Time, error) {
		v, ok := args[k]
		if !ok || v == "never" {
			return time.Time{}, nil
		}
		d, err := time.ParseDuration(v)
		return scriptNow.Add(-d), err
	}
	num := func(k string) (int, error) {
		if v, ok := args[k]; ok {
			return strconv.Atoi(v)
		}
		return 0, nil
	}
	var err error
	switch cmd {
	case "reset":
		*s = *newScenario()
	case "peer":
		if len(flags) == 0 {
			return "", fmt.Errorf("peer needs an id")
		}
		p := PeerView{ID: flags[0], KeyScheme: blockkey.Version, LoadAt: scriptNow}
		for _, fl := range flags[1:] {
			switch fl {
			case "local":
				p.Local = true
			case "draining":
				p.Draining = true
			default:
				return "", fmt.Errorf("unknown flag %q", fl)
			}
		}
		if v, ok := args["digest"]; ok && v != "none" {
			keys, err := parseKeys(v)
			if err != nil {
				return "", err
			}
			set := keySet{}
			for _, k := range keys {
				set[k] = true
			}
			p.Digest, p.DigestAt = set, scriptNow
		}
		if v, ok := args["models"]; ok {
			p.Models = strings.Split(v, ",")
		}
		for k, dst := range map[string]*int{"scheme": &p.KeyScheme, "running": &p.Load.Running,
			"waiting": &p.Load.Waiting, "inflight": &p.Load.InFlight, "queued": &p.Load.QueuedPrefillTokens, "sent-queued": &p.Load.InFlightPrefillTokens,
			"prefilling": &p.Load.Prefilling} {
			if _, ok := args[k]; ok {
				if *dst, err = num(k); err != nil {
					return "", err
				}
			}
		}
		if v, ok := args["kv"]; ok {
			if p.Load.KVUsage, err = strconv.ParseFloat(v, 64); err != nil {
				return "", err
			}
		}
		if _, ok := args["load-age"]; ok {
			if p.LoadAt, err = age("load-age"); err != nil {
				return "", err
			}
		}
		if _, ok := args["digest-age"]; ok {
			if p.DigestAt, err = age("digest-age"); err != nil {
				return "", err
			}
		}
		if p.LastFailure, err = age("failed"); err != nil {
			return "", err
		}
		for i := range s.peers {
			if s.peers[i].ID == p.ID {
				s.peers[i] = p
				return "", nil
			}
		}
		s.peers = append(s.peers, p)
	case "recent":
		if len(flags) != 1 {
			return "", fmt.Errorf("recent needs one peer id")
		}
		keys, err := parseKeys(args["keys"])
		if err != nil {
			return "", err
		}
		at, err := age("age")
		if err != nil {
			return "", err
		}
		if at.IsZero() {
			at = scriptNow
		}
		s.recent.Record(flags[0], keys, at)
	case "request":
		s.req = Request{Model: args["model"], TokensPerKey: 16}
		if s.req.Keys, err = parseKeys(args["keys"]); err != nil {
			return "", err
		}
		if _, ok := args["tokens-per-key"]; ok {
			if s.req.TokensPerKey, err = num("tokens-per-key"); err != nil {
				return "", err
			}
		}
		if s.req.PromptTokens, err = num("prompt-tokens"); err != nil {
			return "", err
		}
	case "config":
		for k, v := range args {
			if err := s.set(k, v); err != nil {
				return "", err
			}
		}
	case "choose":
		var p Policy
		switch args["policy"] {
		case "", "chain":
			p = DefaultChain(s.cfg, s.recent)
		case "affinity":
			p = Affinity{Config: s.cfg, Recent: s.recent}
		case "rendezvous":
			p = Rendezvous{Config: s.cfg}
		case "leastload":
			p = LeastLoad{Config: s.cfg}
		default:
			return "", fmt.Errorf("unknown policy %q", args["policy"])
		}
		return p.Choose(s.req, s.peers, scriptNow).Table(), nil
	default:
		return "", fmt.Errorf("unknown command %q", cmd)
	}
	return "", nil
}

func (s *scenario) set(k, v string) error {
	var err error
	fl := func(dst *float64) { *dst, err = strconv.ParseFloat(v, 64) }
	it := func(dst *int) { *dst, err = strconv.Atoi(v) }
	dur := func(dst *time.Duration) { *dst, err = time.ParseDuration(v) }
	switch k {
	case "slack":
		fl(&s.cfg.Slack)
	case "headroom":
		fl(&s.cfg.MinHeadroom)
	case "load-tokens":
		fl(&s.cfg.LoadTokens)
	case "idle-load-tokens":
		fl(&s.cfg.IdleLoadTokens)
	case "queued-weight":
		fl(&s.cfg.QueuedWeight)
	case "kv-weight":
		fl(&s.cfg.KVWeight)
	case "min-match":
		it(&s.cfg.MinMatchKeys)
	case "cold-headroom":
		fl(&s.cfg.ColdHeadroom)
	case "rendezvous-keys":
		it(&s.cfg.RendezvousKeys)
	case "fail-for":
		dur(&s.cfg.FailFor)
	case "load-ttl":
		dur(&s.cfg.LoadTTL)
	case "digest-ttl":
		dur(&s.cfg.DigestTTL)
	default:
		return fmt.Errorf("unknown config %q", k)
	}
	return err
}

// TestScripts runs testdata/*.txt. A script is blocks of command lines,
// then "----", then the expected output of the block's last command, up to
// a blank line. State carries over between blocks until "reset". Lines
// starting with '#' are comments.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
			var out strings.Builder
			s := newScenario()
			for i := 0; i < len(lines); {
				// Comments and blank lines between blocks pass through.
				if l := lines[i]; l == "" || strings.HasPrefix(l, "#") {
					out.WriteString(l + "\n")
					i++
					continue
				}
				start := i
				var got string
				for ; i < len(lines) && lines[i] != "----"; i++ {
					out.WriteString(lines[i] + "\n")
					if strings.HasPrefix(lines[i], "#") {
						continue
					}
					if got, err = s.run(lines[i]); err != nil {
						t.Fatalf("%s:%d: %v", file, i+1, err)
					}
				}
				if i == len(lines) {
					t.Fatalf("%s:%d: block without ----", file, start+1)
				}
				i++
				var want strings.Builder
				for ; i < len(lines) && lines[i] != ""; i++ {
					want.WriteString(lines[i] + "\n")
				}
				out.WriteString("----\n" + got)
				if !*update && got != want.String() {
					t.Errorf("%s:%d:\n%s\ngot:\n%s\nwant:\n%s", file, start+1,
						strings.Join(lines[start:start+1], "\n"), got, want.String())
				}
			}
			if *update {
				if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
