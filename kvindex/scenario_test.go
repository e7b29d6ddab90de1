package kvindex

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// NB: if a scenario fails, run `go test ./kvindex -run TestScenarios
// -update` and inspect the diff. Keep the change only if you understand
// what caused it and it is desired.
var update = flag.Bool("update", false, "rewrite testdata/*.txt with the actual output")

// TestScenarios runs testdata/*.txt: blocks of commands, "----", and the
// expected output up to a blank line (etcd-io/raft's interaction tests).
//
//	config model=M bs=4 stride=1 capacity=0 orphans=0 [ttl=S] [tierstride=N] [recall=N]
//	apply|replay|lose seq=N [topic=T] [dp=R] [ts=S]   then event lines:
//	  stored hashes=1,2 [blocks=ab] [parent=H] [bs=N] [lora=L] [medium=M] [short=N]
//	  removed hashes=1,2 [medium=M]
//	  cleared | unknown
//	fixture file=F name=P seq=N
//	expire | uncertain true|false | state | entries
//	age now=S                      Expire at S seconds
//	prefix chain=abcd [rank=R]     TierPrefix and PrefixLen of the chain's routing keys
//
// blocks=ab stores two blocks whose tokens are all 'a' and all 'b'; keys
// print as their token prefix ("ab" is the key of block b after a), or
// "Alice:ab" under a LoRA, so expectations are readable. A store without
// blocks= is hash-only, as a KV connector's offload events are. Entries
// other than rank 0's GPU print as key/TIER@RANK ("ab/CPU", "ab@1").
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenario struct {
	t       *testing.T
	cfg     Config
	ix      *Index
	names   map[blockkey.Key]string
	chain   map[uint64]named // vLLM hash → its key and name, from every script event
	unnamed []unnamed        // stored events whose parent the script has not stored yet
}

type named struct {
	key  blockkey.Key
	name string
}

func runScenario(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{t: t, names: map[blockkey.Key]string{}, chain: map[uint64]named{}}
	s.configure(nil)
	var out strings.Builder
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); {
		if l := strings.TrimSpace(lines[i]); l == "" || strings.HasPrefix(l, "#") {
			out.WriteString(lines[i] + "\n")
			i++
			continue
		}
		var cmd []string
		for ; i < len(lines) && lines[i] != "----"; i++ {
			cmd = append(cmd, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("%s: command %q has no ----", path, cmd[0])
		}
		i++
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got := s.run(cmd)
		if *update {
			fmt.Fprintf(&out, "%s\n----\n%s\n", strings.Join(cmd, "\n"), got)
		} else if w := strings.Join(want, "\n"); got != w {
			t.Errorf("%s: %s\ngot:\n%s\nwant:\n%s", path, cmd[0], got, w)
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func args(fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func (s *scenario) atoi(m map[string]string, k string, def int) int {
	v, ok := m[k]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		s.t.Fatalf("%s=%q: %v", k, v, err)
	}
	return n
}

func (s *scenario) hashes(v string) []uint64 {
	var hs []uint64
	for _, f := range strings.Split(v, ",") {
		if f == "" {
			continue
		}
		h, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			s.t.Fatalf("hash %q: %v", f, err)
		}
		hs = append(hs, h)
	}
	return hs
}

func (s *scenario) configure(a map[string]string) {
	s.cfg = Config{
		Model:          a["model"],
		Scheme:         blockkey.Scheme{BlockSize: s.atoi(a, "bs", 4), Stride: s.atoi(a, "stride", 1)},
		CapacityBlocks: s.atoi(a, "capacity", 0),
		OrphanLimit:    s.atoi(a, "orphans", 0),
		StoreOnlyTTL:   time.Duration(s.atoi(a, "ttl", 0)) * time.Second,
		TierStride:     s.atoi(a, "tierstride", 0),
		RecallLimit:    s.atoi(a, "recall", 0),
	}
	s.ix = New(s.cfg)
}

func (s *scenario) run(cmd []string) string {
	f := strings.Fields(cmd[0])
	a := args(f[1:])
	switch f[0] {
	case "config":
		s.configure(a)
		return "ok"
	case "apply", "lose":
		b := s.batch(a, cmd[1:])
		if f[0] == "lose" {
			return "lost"
		}
		return s.change(s.ix.Apply(b))
	case "restart":
		return s.change(s.ix.Restart())
	case "fixture":
		ev := s.fixture(a["file"], a["name"])
		return s.change(s.ix.Apply(kvevent.Batch{Seq: uint64(s.atoi(a, "seq", 0)), Events: []kvevent.Event{ev}}))
	case "expire":
		return fmt.Sprintf("expired %d\n%s", s.ix.ExpireOrphans(), s.summary())
	case "uncertain":
		s.ix.SetUncertain(f[1] == "true")
		return s.summary()
	case "state":
		return s.state()
	case "entries":
		var ns []string
		for _, e := range s.ix.Entries() {
			ns = append(ns, s.entry(e))
		}
		return "entries: " + strings.Join(ns, " ")
	case "age":
		ch := s.ix.Expire(time.Unix(int64(s.atoi(a, "now", 0)), 0))
		return s.change(ch)
	case "prefix":
		keys := s.chainKeys(a["chain"])
		g, c, d := s.ix.TierPrefix(keys, s.atoi(a, "rank", 0))
		return fmt.Sprintf("gpu=%d cpu=%d disk=%d prefixlen=%d of %d", g, c, d, s.ix.PrefixLen(keys), len(keys))
	}
	s.t.Fatalf("unknown command %q", cmd[0])
	return ""
}

func (s *scenario) batch(a map[string]string, evs []string) kvevent.Batch {
	b := kvevent.Batch{Topic: a["topic"], Seq: uint64(s.atoi(a, "seq", 0)), TS: float64(s.atoi(a, "ts", 0))}
	if _, ok := a["dp"]; ok {
		r := int64(s.atoi(a, "dp", 0))
		b.DPRank = &r
	}
	for _, l := range evs {
		f := strings.Fields(l)
		ea := args(f[1:])
		var ev kvevent.Event
		if m, ok := ea["medium"]; ok {
			ev.Medium = &m
		}
		ev.BlockHashes = s.hashes(ea["hashes"])
		switch f[0] {
		case "stored":
			ev.Kind = kvevent.BlockStored
			ev.BlockSize = s.atoi(ea, "bs", s.cfg.Scheme.BlockSize)
			tbs := ev.BlockSize
			if tbs == 0 {
				tbs = s.cfg.Scheme.BlockSize
			}
			if p, ok := ea["parent"]; ok {
				h := s.hashes(p)[0]
				ev.Parent = &h
			}
			if l, ok := ea["lora"]; ok {
				ev.LoRAName = &l
			}
			for _, c := range ea["blocks"] {
				for j := range tbs {
					ev.TokenIDs = append(ev.TokenIDs, uint32(c)*1000+uint32(j))
				}
			}
			ev.TokenIDs = ev.TokenIDs[:len(ev.TokenIDs)-s.atoi(ea, "short", 0)]
			s.learn(ev, ea["blocks"], tbs)
		case "removed":
			ev.Kind = kvevent.BlockRemoved
		case "cleared":
			ev.Kind = kvevent.AllBlocksCleared
		case "unknown":
			ev.Tag = "SomethingNew"
		default:
			s.t.Fatalf("unknown event %q", l)
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// learn names the keys of a stored event from the script's own view of
// every chain, independent of what the index saw. An event whose parent
// the script has not stored yet is named once that parent appears.
func (s *scenario) learn(ev kvevent.Event, letters string, bs int) {
	s.unnamed = append(s.unnamed, unnamed{ev, letters, bs})
	for progress := true; progress; {
		progress = false
		rest := s.unnamed[:0]
		for _, u := range s.unnamed {
			if s.nameEvent(u) {
				progress = true
			} else {
				rest = append(rest, u)
			}
		}
		s.unnamed = rest
	}
}

type unnamed struct {
	ev      kvevent.Event
	letters string
	bs      int
}

func (s *scenario) nameEvent(u unnamed) bool {
	var prev named
	switch ev := u.ev; {
	case ev.Parent == nil:
		lora := ""
		if ev.LoRAName != nil {
			lora = *ev.LoRAName
			prev.name = lora + ":"
		}
		prev.key = blockkey.Root(s.cfg.Model, lora, "")
	default:
		p, ok := s.chain[*ev.Parent]
		if !ok {
			return false
		}
		prev = p
	}
	for i, h := range u.ev.BlockHashes {
		if (i+1)*u.bs > len(u.ev.TokenIDs) || i >= len(u.letters) {
			break
		}
		prev = named{blockkey.Next(prev.key, u.ev.TokenIDs[i*u.bs:(i+1)*u.bs]), prev.name + u.letters[i:i+1]}
		s.chain[h] = prev
		if _, ok := s.names[prev.key]; !ok {
			s.names[prev.key] = prev.name
		}
	}
	return true
}

func (s *scenario) name(k blockkey.Key) string {
	if n, ok := s.names[k]; ok {
		return n
	}
	return fmt.Sprintf("%#016x", uint64(k))
}

func (s *scenario) keys(ks []blockkey.Key) string {
	ns := make([]string, len(ks))
	for i, k := range ks {
		ns[i] = s.name(k)
	}
	return strings.Join(ns, " ")
}

func (s *scenario) change(ch Change) string {
	var b strings.Builder
	if len(ch.Added) > 0 {
		fmt.Fprintf(&b, "added: %s\n", s.keys(ch.Added))
	}
	if len(ch.Removed) > 0 {
		fmt.Fprintf(&b, "removed: %s\n", s.keys(ch.Removed))
	}
	if len(ch.TierAdded) > 0 {
		fmt.Fprintf(&b, "tier-added: %s\n", s.entries(ch.TierAdded))
	}
	if len(ch.TierRemoved) > 0 {
		fmt.Fprintf(&b, "tier-removed: %s\n", s.entries(ch.TierRemoved))
	}
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{ch.Restarted, "restarted"}, {ch.Cleared, "cleared"}, {ch.OverCapacity, "over-capacity"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	if len(flags) > 0 {
		fmt.Fprintf(&b, "%s\n", strings.Join(flags, " "))
	}
	var counts []string
	for _, c := range []struct {
		n    int
		name string
	}{{ch.Orphaned, "orphaned"}, {ch.Resolved, "resolved"}, {ch.Expired, "expired"}, {ch.Ignored, "ignored"}, {ch.Unresolved, "unresolved"}, {ch.Aged, "aged"}, {ch.UnknownRemoved, "unknown-removed"}} {
		if c.n != 0 {
			counts = append(counts, fmt.Sprintf("%s=%d", c.name, c.n))
		}
	}
	if len(counts) > 0 {
		fmt.Fprintf(&b, "%s\n", strings.Join(counts, " "))
	}
	b.WriteString(s.summary())
	return b.String()
}

func (s *scenario) summary() string {
	st := s.ix.Stats()
	u := ""
	if st.Uncertain {
		u = " uncertain"
	}
	tiers := ""
	if st.TierBlocks[CPU]+st.TierBlocks[Disk] > 0 || st.Entries != st.Keys {
		tiers = fmt.Sprintf(" cpu=%d disk=%d entries=%d", st.TierBlocks[CPU], st.TierBlocks[Disk], st.Entries)
	}
	if st.Ranks > 1 {
		tiers += fmt.Sprintf(" ranks=%d", st.Ranks)
	}
	return fmt.Sprintf("epoch=%d version=%d keys=%d blocks=%d orphans=%d%s%s", st.Epoch, st.Version, st.Keys, st.Blocks, st.Orphans, tiers, u)
}

func (s *scenario) entry(e Entry) string {
	n := s.name(e.Key)
	if e.Tier != GPU {
		n += "/" + e.Tier.String()
	}
	if e.Rank != 0 {
		n += fmt.Sprintf("@%d", e.Rank)
	}
	return n
}

func (s *scenario) entries(es []Entry) string {
	ns := make([]string, len(es))
	for i, e := range es {
		ns[i] = s.entry(e)
	}
	return strings.Join(ns, " ")
}

// chainKeys returns the routing keys of a chain of blocks named by
// letters, as the script's stores build them.
func (s *scenario) chainKeys(letters string) []blockkey.Key {
	var toks []uint32
	for _, c := range letters {
		for j := range s.cfg.Scheme.BlockSize {
			toks = append(toks, uint32(c)*1000+uint32(j))
		}
	}
	var keys []blockkey.Key
	for pos, k := range blockkey.Chain(blockkey.Root(s.cfg.Model, "", ""), toks, s.cfg.Scheme.BlockSize) {
		if s.cfg.Scheme.Routed(pos) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (s *scenario) state() string {
	var ns []string
	for _, k := range s.ix.Keys() {
		ns = append(ns, s.name(k))
	}
	slices.Sort(ns)
	var b strings.Builder
	fmt.Fprintf(&b, "keys: %s\n", strings.Join(ns, " "))
	for _, t := range []Tier{GPU, CPU, Disk} {
		for _, r := range s.ix.Held(t) {
			fmt.Fprintf(&b, "hash=%d key=%s pos=%d refs=%d", r.Hash, s.name(r.Key), r.Pos, r.Refs)
			if t != GPU {
				fmt.Fprintf(&b, " tier=%s", t)
			}
			if r.Rank != 0 {
				fmt.Fprintf(&b, " rank=%d", r.Rank)
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString(s.summary())
	return b.String()
}

// fixtureEvent is the JSON shape of kvevent/testdata/kv_event_*.json.
type fixtureEvent struct {
	ModelName   string   `json:"model_name"`
	LoRAName    *string  `json:"lora_name"`
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent_block_hash"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      *string  `json:"medium"`
}

func loadFixture(t *testing.T, file string) (fixtureEvent, kvevent.Event) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var fx fixtureEvent
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	return fx, kvevent.Event{
		Kind: kvevent.BlockStored, Tag: "BlockStored",
		BlockHashes: fx.BlockHashes, Parent: fx.Parent, TokenIDs: fx.TokenIDs,
		BlockSize: fx.BlockSize, Medium: fx.Medium, LoRAName: fx.LoRAName,
	}
}

// fixture loads a real vLLM event and names its keys from blockkey.Chain
// over its tokens: if the index keys them any other way they print as hex.
func (s *scenario) fixture(file, prefix string) kvevent.Event {
	fx, ev := loadFixture(s.t, file)
	lora := ""
	if fx.LoRAName != nil {
		lora = *fx.LoRAName
	}
	for i, k := range blockkey.Chain(blockkey.Root(s.cfg.Model, lora, ""), fx.TokenIDs, fx.BlockSize) {
		s.names[k] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ev
}
