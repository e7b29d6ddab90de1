package route

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"hash"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
)

// TestDecisionsUnchanged pins every Decision of random meshes to what the
// code that recorded testdata/decisions.sum decided, byte for byte
// (floats as bits, Attempts for 1, 5 and 9): the oracle a change made only
// to choose faster is held to. A mesh is 1 to 1300 peers with grouped,
// stale-stamped, second-group, plain, tiered and ranked digests, Recent,
// claims, models, draining, failed, silent, stale and down peers, in a
// shuffled order; each is chosen by the default chain and each policy
// alone, under one of six configurations, for single prompts and batches,
// explained or not. A change that means to alter choices rewrites the
// file with -update, and says so.
func TestDecisionsUnchanged(t *testing.T) {
	const path = "testdata/decisions.sum"
	got := decisionDigests()
	if *update {
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	for s := bufio.NewScanner(f); s.Scan(); {
		want = append(want, s.Text())
	}
	if len(want) != len(got) {
		t.Fatalf("%d meshes; %s records %d", len(got), path, len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("decisions changed: %s; recorded %s", got[i], want[i])
		}
	}
}

// decisionDigests returns a line per random mesh: its size and the
// SHA-256 of every Decision made on it.
func decisionDigests() []string {
	rng := rand.New(rand.NewPCG(25, 7))
	now := time.Unix(1_800_000_000, 0)
	chains := make([][]blockkey.Key, 8)
	for i := range chains {
		chains[i] = make([]blockkey.Key, 96)
		for j := range chains[i] {
			chains[i][j] = blockkey.Key(rng.Uint64())
		}
		if i > 0 {
			copy(chains[i][:6], chains[0][:6]) // a shared system prompt
		}
	}
	configs := decisionConfigs()
	var lines []string
	for n := range 160 {
		npeers := 1 + rng.IntN(70)
		switch rng.IntN(5) {
		case 0:
			npeers = 64 + rng.IntN(3) // around ListPeers
		case 1:
			npeers = 200 + rng.IntN(1101)
		}
		peers, r := randomMesh(rng, npeers, now, chains)
		cfg := configs[n%len(configs)]
		policies := []Policy{DefaultChain(cfg, r), Affinity{Config: cfg, Recent: r},
			Rendezvous{Config: cfg}, LeastLoad{Config: cfg}}
		h := sha256.New()
		for range 3 {
			req := randomRequest(rng, chains)
			for _, p := range policies {
				d := p.Choose(req, peers, now)
				for _, max := range []int{1, 5, 9} {
					d.Attempts = Attempts(d, max)
					writeValue(h, reflect.ValueOf(d))
				}
			}
		}
		lines = append(lines, fmt.Sprintf("mesh %d peers %d %x", n, npeers, h.Sum(nil)[:12]))
	}
	return lines
}

func decisionConfigs() []Config {
	def := DefaultConfig()
	ttl := def
	ttl.DigestTTL = 10 * time.Second
	idle := def
	idle.IdleSlack, idle.IdleHeadroom = 0.5, 2
	product := def
	product.ProductCost = true
	requests := def
	requests.QueuedWeight, requests.LoadTokens, requests.MinMatchFraction = 0, 0, 0
	loose := def
	loose.SilentFor, loose.LoadTTL, loose.FailFor, loose.ClaimTTL, loose.ColdHeadroom = 0, 0, 0, 0, 2
	return []Config{def, ttl, idle, product, requests, loose}
}

// randomMesh returns npeers random views, shuffled, and a Recent that
// knows some of them.
func randomMesh(rng *rand.Rand, npeers int, now time.Time, chains [][]blockkey.Key) ([]PeerView, *Recent) {
	params := bloom.ParamsFor(2000, 0.01)
	g, g2 := bloom.NewTransposed(), bloom.NewTransposed()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	names := []string{"p%d", "pod-%04d", "kvroute-7d9f8-%x"}
	name := names[rng.IntN(len(names))]
	peers := make([]PeerView, npeers)
	for i := range peers {
		id := fmt.Sprintf(name, i)
		p := PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
			Ranks: rng.IntN(4) * rng.IntN(2), LoadAt: now, DigestAt: now}
		p.Load = Load{Running: rng.IntN(4), Waiting: rng.IntN(3) * rng.IntN(2), Serving: rng.IntN(5),
			Fronted: rng.IntN(2) == 0, KVUsage: rng.Float64() * 1.1, InFlight: rng.IntN(3) - 1}
		if rng.IntN(3) == 0 {
			p.Load.QueuedPrefillTokens, p.Load.Prefilling = rng.IntN(4000), rng.IntN(4)
			p.Load.InFlightPrefillTokens, p.Load.InFlightPrefilling = rng.IntN(2000), rng.IntN(2)
		}
		switch rng.IntN(24) {
		case 0:
			p.Engine = EngineStarting
		case 1:
			p.Engine = EngineDown
		case 2:
			p.Draining = true
		case 3:
			p.LastFailure = ago(time.Second)
		case 4:
			p.LastFailure = ago(time.Minute)
		case 5:
			p.LoadAt = ago(2 * time.Second) // silent if fronted
		case 6:
			p.LoadAt = ago(6 * time.Second) // stale
		case 7:
			p.LoadAt = time.Time{}
		case 8:
			p.KeyScheme = blockkey.Version + 1
		case 9:
			p.Models = []string{"m"}
		case 10:
			p.Models, p.ModelsTruncated = []string{"other"}, rng.IntN(2) == 0
		case 11:
			p.DigestAt = ago(30 * time.Second)
		case 12:
			p.Since = ago(time.Second)
		}
		if rng.IntN(8) == 0 {
			c := chains[rng.IntN(len(chains))]
			p.Claims = []Claim{{Key: c[11], Keys: 12, At: ago(time.Second)}, {Key: c[39], Keys: 40, At: ago(6 * time.Second)}}
		}
		var held []blockkey.Key
		for range rng.IntN(3) {
			c := chains[rng.IntN(len(chains))]
			held = append(held, c[:rng.IntN(len(c)+1)]...)
		}
		switch rng.IntN(10) {
		case 0:
			held = append(held, bloom.TierMarker(8))
		case 1:
			held = append(held, bloom.RankMarker(1))
		}
		d := bloom.Build(bloom.Header{Node: id, Params: params}, held)
		p.Digest = d
		switch k := rng.IntN(12); {
		case k == 0:
			p.Digest = nil
		case k == 1:
			p.Digest = benchMatcher{} // a Matcher alone
		case k < 10:
			in := g
			if i > 0 && k == 2 {
				in = g2 // not the group the choice asks, slots and stamps alike
			}
			if slot, stamp := in.Put(-1, d); slot >= 0 {
				m := &Member{TierMatcher: d, G: in, Slot: slot, Stamp: stamp}
				p.Digest = m
				if k == 3 {
					p.Digest = struct{ Grouped }{m} // a Grouped that is not a *Member
				}
				if k == 4 { // the group moved on: a newer digest of the peer
					in.Put(slot, bloom.Build(bloom.Header{Node: id, Params: params}, chains[0][:20]))
				}
			}
		}
		peers[i] = p
	}
	rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	var r *Recent
	if rng.IntN(2) == 0 {
		r = NewRecent(DefaultRecentConfig())
		for range rng.IntN(40) {
			c := chains[rng.IntN(len(chains))]
			r.Record(peers[rng.IntN(npeers)].ID, c[:1+rng.IntN(len(c))], ago(time.Duration(rng.IntN(4000))*time.Millisecond))
		}
	}
	return peers, r
}

func randomRequest(rng *rand.Rand, chains [][]blockkey.Key) Request {
	c := chains[rng.IntN(len(chains))]
	req := Request{Keys: c[:rng.IntN(len(c)+1)], TokensPerKey: 16 * rng.IntN(2)}
	if rng.IntN(5) == 0 {
		req.Batch = [][]blockkey.Key{chains[rng.IntN(len(chains))][:1+rng.IntN(40)]}
	}
	switch rng.IntN(3) {
	case 0:
		req.PromptTokens = 16 * len(req.Keys)
	case 1:
		req.PromptTokens = rng.IntN(16*len(req.Keys) + 1)
	}
	switch rng.IntN(6) {
	case 0:
		req.Model = "m"
	case 1:
		req.Model = "other"
	}
	req.Explain = rng.IntN(4) == 0
	return req
}

// writeValue writes v to h whole: floats as their bits, strings with
// their length, slices with theirs, every field of a struct.
func writeValue(h hash.Hash, v reflect.Value) {
	switch v.Kind() {
	case reflect.Float64:
		fmt.Fprintf(h, "f%x;", math.Float64bits(v.Float()))
	case reflect.String:
		fmt.Fprintf(h, "s%d:%s;", v.Len(), v.String())
	case reflect.Bool:
		fmt.Fprintf(h, "b%t;", v.Bool())
	case reflect.Int:
		fmt.Fprintf(h, "i%d;", v.Int())
	case reflect.Slice:
		fmt.Fprintf(h, "[%d;", v.Len())
		for i := range v.Len() {
			writeValue(h, v.Index(i))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			writeValue(h, v.Field(i))
		}
	default:
		panic("writeValue: " + v.Kind().String())
	}
}
