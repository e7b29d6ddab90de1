//go:build integration

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkTextPrefix measures what a text chat prompt whose leading
// messages were seen before adds between the client and the engine, with
// the simulator charging for tokenization as vLLM does (its default,
// 1.15 us per token on one tokenizer thread per pod). Two clusters of two
// pods run side by side in one open loop, with Poisson arrivals
// (-e2e.arrivals fixed: 1/rate apart, under which a follow-up, sent
// between the ticks, alone met the others' bursts in the engines):
//
//   - today: sidecars with --text-prefix-keys 0, which tokenize every chat
//     on the request path (/tokenize at the entry pod's vLLM);
//   - new: sidecars with text prefixes on.
//
// For prompts of 1k, 8k and 32k tokens, each request enters pod 2's sidecar
// and is served on pod 1, which holds the prefix:
//
//   - direct: straight to pod 1's simulator (it tokenizes too: the baseline);
//   - today sys / new sys: a shared system prompt (seen at the entry sidecar
//     before) and a new question;
//   - new doc question: a document in a user message of its own (seen
//     before with another question), then a new question;
//   - new follow-up other: a conversation's second turn, whose first turn
//     entered pod 1's sidecar (pod 2's sidecar has the first turn's entry
//     from pod 1's, by gossip);
//   - new follow-up same: the second turn entering the sidecar the first
//     turn entered (-e2e.think, 300 ms, of think time after the first answer, plus a
//     random part of a pacing interval);
//   - direct ids / hop ids: a completions prompt of token ids of the same
//     length, straight and through the same hop: what moving a body this
//     size through two sidecars costs without any tokenization;
//   - bare two-hop sys: the shared-system-prompt chat through two bare
//     httputil.ReverseProxy processes in the sidecars' places and CPUs
//     (cmd/bareproxy: the first reads each body whole, as a router must;
//     the second streams it on, as the sidecars' hop does): what any design
//     that hops between pods costs on this machine, with no parsing or
//     routing.
//
// Two figures per series. "added" is the sidecars' own latency, request by
// request: the time to the first byte less the simulator's time from the
// body read to the first output (X-Sim-Service-Us), less the direct
// series' median of the same (the client's and loopback's part). Δ is a
// round's TTFB percentile minus the direct series' of the same size and
// prompt form in that round (medians over rounds): it also shows what a
// design costs inside the engine, such as tokenizer time that queues other
// requests. -e2e.text-today=false leaves today's cluster out,
// -e2e.text-sizes picks the sizes and -e2e.text-series the series (a
// regexp; the direct ones always run). It asserts only that every request was
// served by pod 1. Run:
//
//	go test -tags integration -run '^$' -bench TextPrefix -benchtime 1x ./e2e \
//	  -args -e2e.rounds 3 -e2e.duration 40s -e2e.rate 10
func BenchmarkTextPrefix(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(*rounds)*(*duration+time.Minute))
	defer cancel()
	if *arrivals != "poisson" && *arrivals != "fixed" {
		b.Fatalf("-e2e.arrivals %q: want poisson or fixed", *arrivals)
	}
	envs := strings.Fields(*sidecarEnv)
	var today *fixture
	if *textToday {
		var err error
		today, err = startCluster(ctx, clusterSpec{pods: 2, subnet: 1, secret: true, timeScale: 1000, cpus: *pinCPUs, podCPUs: strings.Fields(*podCPUs),
			simArgs: strings.Fields(*simArgsF), env: append(slices.Clone(envs), "KVROUTE_TEXT_PREFIX_KEYS=0"), progress: testProgress{b}}, b.Cleanup)
		if err != nil {
			b.Fatal(err)
		}
	}
	fresh, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 2, secret: true, timeScale: 1000, cpus: *pinCPUs, podCPUs: strings.Fields(*podCPUs),
		simArgs: strings.Fields(*simArgsF), env: envs, progress: testProgress{b}}, b.Cleanup)
	if err != nil {
		b.Fatal(err)
	}
	// The bare proxies sit where the sidecars do: pod 1's serves, pod 2's
	// is entered.
	cfg := fresh.c.Config()
	bareServe := startBareProxy(ctx, b, fresh.c.Pod(0).API, fresh.c.Pod(0).SimAddr, cfg.SidecarCPUsOf(0), "--stream")
	bareEntry := startBareProxy(ctx, b, fresh.c.Pod(1).API, bareServe, cfg.SidecarCPUsOf(1))
	rng := seeded(b.Name())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	var ss []*chatSeries
	var sizes []int
	for _, f := range strings.Split(*textSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 256 {
			b.Fatalf("-e2e.text-sizes: %q is not a size of at least 256 tokens", f)
		}
		sizes = append(sizes, n)
	}
	for _, size := range sizes {
		sys := words(rng, size-60)
		// Cache the system prompt on pod 1 of both clusters and teach pod 2's
		// sidecars that they route there.
		clusters := []*fixture{fresh}
		if today != nil {
			clusters = append(clusters, today)
		}
		for _, f := range clusters {
			if _, err := postChat(ctx, hc, f.c.Pod(0).SimAddr, chatBody(sys, words(rng, 30))); err != nil {
				b.Fatal(err)
			}
			f.waitRoute(b, 1, chatBody(sys, words(rng, 30)), f.c.Pod(0).Name, size/blockSize/2)
			routedToPod1(ctx, b, hc, f, size, func() []byte { return chatBody(sys, words(rng, 30)) })
		}
		q := func() []byte { return chatBody(sys, words(rng, 30)) }
		// A document in a message of its own under a short instruction,
		// asked a new question each time: cached on pod 1, and its
		// prefix learned at pod 2's sidecar from a first question.
		doc := words(rng, size-90)
		qd := func() []byte { return docBody(doc, words(rng, 30)) }
		if _, err := postChat(ctx, hc, fresh.c.Pod(0).SimAddr, qd()); err != nil {
			b.Fatal(err)
		}
		// Until pod 2's sidecar knows where the document is cached, a
		// question it tokenizes could be placed on its own pod.
		fresh.waitRoute(b, 1, qd(), fresh.c.Pod(0).Name, size/blockSize/2)
		routedToPod1(ctx, b, hc, fresh, size, qd)
		// A token-id prompt of the same length on the same path: what a hop
		// of a body this size costs on this machine with no tokenization
		// at all (today's fast path).
		ids := tokens(rng, size-30)
		if _, err := fresh.do(ctx, http.MethodPost, fresh.c.Pod(0).SimAddr, "/v1/completions", body(ids, 4, false), nil); err != nil {
			b.Fatal(err)
		}
		fresh.waitRoute(b, 1, body(join(ids, tokens(rng, 30)), 4, false), fresh.c.Pod(0).Name, size/blockSize/2)
		qi := func() []byte { return body(join(ids, tokens(rng, 30)), 4, false) }
		// Bodies are drawn per request (a question is never repeated);
		// the rng is not safe for concurrent use, so draw under a lock.
		ss = append(ss,
			&chatSeries{name: fmt.Sprintf("direct ids %dk", size/1024), size: size, path: "/v1/completions", addr: fresh.c.Pod(0).SimAddr, draw: qi},
			&chatSeries{name: fmt.Sprintf("hop ids %dk", size/1024), size: size, path: "/v1/completions", addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name, draw: qi},
			&chatSeries{name: fmt.Sprintf("direct %dk", size/1024), size: size, addr: fresh.c.Pod(0).SimAddr, draw: q},
			&chatSeries{name: fmt.Sprintf("new sys %dk", size/1024), size: size, addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name, draw: q},
			&chatSeries{name: fmt.Sprintf("bare two-hop sys %dk", size/1024), size: size, addr: bareEntry, draw: q},
			&chatSeries{name: fmt.Sprintf("new doc question %dk", size/1024), size: size, addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name, draw: qd},
		)
		if today != nil {
			ss = append(ss, &chatSeries{name: fmt.Sprintf("today sys %dk", size/1024), size: size, addr: today.c.Pod(1).API, servedBy: today.c.Pod(0).Name, draw: q})
		}
		// The agents' APIs on the same path: a known system prompt with a
		// new question, and a conversation's next turn whose first turn
		// entered pod 1's sidecar, each against its API's direct series.
		for _, a := range agentAPIs {
			qa := func() []byte { return a.body(sys, words(rng, 30)) }
			if _, _, err := timeChat(ctx, hc, fresh.c.Pod(0).SimAddr, a.path, qa()); err != nil {
				b.Fatal(err)
			}
			routedPath(ctx, b, hc, fresh, size, a.path, qa)
			follow := &chatSeries{name: fmt.Sprintf("new %s follow-up %dk", a.name, size/1024), size: size, path: a.path,
				addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name}
			follow.before = func(ctx context.Context) ([]byte, error) {
				lockRNG.Lock()
				u1, a1, u2 := words(rng, 30), words(rng, 50), words(rng, 30)
				think := *thinkTime + time.Duration(rng.Float64()*float64(time.Second)/(*rate))
				lockRNG.Unlock()
				if _, _, err := timeChat(ctx, hc, fresh.c.Pod(0).API, a.path, a.body(sys, u1)); err != nil {
					return nil, err
				}
				select {
				case <-time.After(think):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return a.body(sys, u1, a1, u2), nil
			}
			ss = append(ss,
				&chatSeries{name: fmt.Sprintf("direct %s %dk", a.name, size/1024), size: size, path: a.path, addr: fresh.c.Pod(0).SimAddr, draw: qa},
				&chatSeries{name: fmt.Sprintf("new %s sys %dk", a.name, size/1024), size: size, path: a.path, addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name, draw: qa},
				follow)
		}
		for _, same := range []bool{false, true} {
			first, name := fresh.c.Pod(0).API, "new follow-up other"
			if same {
				first, name = fresh.c.Pod(1).API, "new follow-up same"
			}
			s := &chatSeries{name: fmt.Sprintf("%s %dk", name, size/1024), size: size, addr: fresh.c.Pod(1).API, servedBy: fresh.c.Pod(0).Name}
			s.before = func(ctx context.Context) ([]byte, error) {
				lockRNG.Lock()
				u1, a1, u2 := words(rng, 30), words(rng, 50), words(rng, 30)
				// -e2e.think (300 ms) of think time and up to one pacing interval more:
				// a think time that is a multiple of the interval would land
				// every follow-up just behind the request the pacer launched
				// at that tick, in the serving pod's tokenizer queue.
				think := *thinkTime + time.Duration(rng.Float64()*float64(time.Second)/(*rate))
				lockRNG.Unlock()
				if _, err := postChat(ctx, hc, first, chatBody(sys, u1)); err != nil {
					return nil, err
				}
				select {
				case <-time.After(think):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return chatBody(sys, u1, a1, u2), nil
			}
			ss = append(ss, s)
		}
	}
	if *textSeries != "" {
		re, err := regexp.Compile(*textSeries)
		if err != nil {
			b.Fatalf("-e2e.text-series: %v", err)
		}
		// direct series stay: every Δ and "added" is taken against them.
		ss = slices.DeleteFunc(ss, func(s *chatSeries) bool { return !re.MatchString(s.name) && !strings.HasPrefix(s.name, "direct") })
	}
	chatLoop(ctx, hc, ss, *rate, time.Second, rng) // warm connections, unrecorded
	deltas := make([][2][]time.Duration, len(ss))
	pooled := make([][]time.Duration, len(ss))
	outside := make([][]time.Duration, len(ss))
	inside := make([][]time.Duration, len(ss))
	choosing := make([][]time.Duration, len(ss))
	serving := make([][]time.Duration, len(ss))
	send := make([][]time.Duration, len(ss))
	hopSend := make([][]time.Duration, len(ss))
	toEngine := make([][]time.Duration, len(ss))
	fromEngine := make([][]time.Duration, len(ss))
	b.ResetTimer()
	for round := range *rounds {
		for _, s := range ss {
			s.reset()
		}
		rctx, rcancel := context.WithTimeout(ctx, *duration+time.Minute)
		traced := make(chan error, 1)
		if *profile != "" && round == 0 {
			go func() { traced <- profileSidecars(rctx, fresh, *profile, *profileDir, 10*time.Second) }()
		} else {
			traced <- nil
		}
		chatLoop(rctx, hc, ss, *rate, *duration, rng)
		if err := <-traced; err != nil {
			b.Errorf("-e2e.profile: %v", err)
		}
		rcancel()
		base := map[string]*chatSeries{}
		for _, s := range ss {
			if strings.HasPrefix(s.name, "direct") {
				base[s.kind()] = s
			}
		}
		for i, s := range ss {
			d := base[s.kind()]
			deltas[i][0] = append(deltas[i][0], percentile(s.ttfb, 50)-percentile(d.ttfb, 50))
			deltas[i][1] = append(deltas[i][1], percentile(s.ttfb, 99)-percentile(d.ttfb, 99))
			pooled[i] = append(pooled[i], s.ttfb...)
			outside[i] = append(outside[i], s.outside...)
			inside[i] = append(inside[i], s.inside...)
			choosing[i] = append(choosing[i], s.choosing...)
			serving[i] = append(serving[i], s.serving...)
			send[i] = append(send[i], s.send...)
			hopSend[i] = append(hopSend[i], s.hopSend...)
			toEngine[i] = append(toEngine[i], s.toEngine...)
			fromEngine[i] = append(fromEngine[i], s.fromEngine...)
			if s.errs > 0 {
				b.Errorf("round %d: %s: %d of %d requests failed or went elsewhere; first: %v", round+1, s.name, s.errs, s.errs+len(s.ttfb), s.firstErr)
			}
		}
		var slow strings.Builder
		for _, s := range ss {
			for _, top := range []struct {
				what string
				xs   [][2]time.Duration
				of   string
			}{{"slowest", s.slowest, "engine"}, {"most outside", s.outsideTop, "engine"}, {"most inside", s.insideTop, "choosing"}, {"most in hop", s.hopTop, "engine's body read"}} {
				if len(top.xs) == 0 {
					continue
				}
				fmt.Fprintf(&slow, "\n  %-24s %-13s", s.name, top.what)
				for _, x := range top.xs {
					fmt.Fprintf(&slow, "  %s (%s %s)", us(x[0]), top.of, us(x[1]))
				}
			}
		}
		fmt.Printf("round %d of %d done; per series, the requests slowest to the first byte and those with the most time outside the engine (ttfb, engine's part):%s\n", round+1, *rounds, slow.String())
	}
	b.StopTimer()
	var tab strings.Builder
	fmt.Fprintf(&tab, "\nopen loop, %.0f req/s, %d round(s) of %v, %d series, sim time scale 1000, sim tokenize cost on (default)\n", *rate, *rounds, *duration, len(ss))
	// The direct series' time outside the engine is the client's and the
	// loopback's own; "added" is a series' less the direct one's median.
	// "p99 vs p99" is a series' p99 less the direct one's p99: the
	// machine's own tail (the client, the loopback, the scheduler) is in
	// both.
	direct, direct99 := map[string]time.Duration{}, map[string]time.Duration{}
	for i, s := range ss {
		if strings.HasPrefix(s.name, "direct") {
			direct[s.kind()], direct99[s.kind()] = percentile(outside[i], 50), percentile(outside[i], 99)
		}
	}
	fmt.Fprintf(&tab, "%-24s %5s  %9s %9s  %11s %11s  %10s %10s %11s  %10s %10s  %s\n", "series", "n", "ttfb p50", "ttfb p99", "Δp50 median", "Δp99 median", "added p50", "added p99", "p99 vs p99", "inside p50", "inside p99", "decisions (last round)")
	for i, s := range ss {
		dp50, dp99 := percentile(deltas[i][0], 50), percentile(deltas[i][1], 50)
		base := direct[s.kind()]
		ap50, ap99 := percentile(outside[i], 50)-base, percentile(outside[i], 99)-base
		vs99 := percentile(outside[i], 99) - direct99[s.kind()]
		ip50, ip99 := "-", "-"
		if len(inside[i]) > 0 {
			ip50, ip99 = us(percentile(inside[i], 50)), us(percentile(inside[i], 99))
		}
		fmt.Fprintf(&tab, "%-24s %5d  %9s %9s  %11s %11s  %10s %10s %11s  %10s %10s  %v\n", s.name, len(pooled[i]),
			us(percentile(pooled[i], 50)), us(percentile(pooled[i], 99)), us(dp50), us(dp99), us(ap50), us(ap99), us(vs99), ip50, ip99, s.decisions)
		if !strings.HasPrefix(s.name, "direct") {
			unit := strings.ReplaceAll(s.name, " ", "-")
			if len(inside[i]) > 0 {
				b.ReportMetric(float64(percentile(inside[i], 50).Microseconds()), unit+"-inside-p50-µs")
				b.ReportMetric(float64(percentile(inside[i], 99).Microseconds()), unit+"-inside-p99-µs")
			}
			b.ReportMetric(float64(dp50.Microseconds()), unit+"-Δp50-µs")
			b.ReportMetric(float64(dp99.Microseconds()), unit+"-Δp99-µs")
			b.ReportMetric(float64(ap50.Microseconds()), unit+"-added-p50-µs")
			b.ReportMetric(float64(ap99.Microseconds()), unit+"-added-p99-µs")
			b.ReportMetric(float64(vs99.Microseconds()), unit+"-p99-vs-p99-µs")
		}
	}
	fmt.Fprintf(&tab, "\ninside, p50 / p99 of its parts: the entry sidecar choosing (parse, keys, route), the serving sidecar from the request's headers to the answer's less the engine's time (the body streams through it to the engine: its send, until the last byte was written; after, until the answer's headers, less the engine's time), and the rest (the hop's connection both ways and the entry sidecar's copying)\n")
	fmt.Fprintf(&tab, "%-24s  %19s  %19s  %19s  %19s  %19s  %19s\n", "series", "choosing", "serving sidecar", "of it: its send", "of it: after", "rest", "of it: entry's send")
	for i, s := range ss {
		if len(inside[i]) == 0 || len(serving[i]) != len(inside[i]) {
			continue
		}
		rest := make([]time.Duration, len(inside[i]))
		for j := range rest {
			rest[j] = inside[i][j] - choosing[i][j] - serving[i][j]
		}
		pp := func(xs []time.Duration) string { return us(percentile(xs, 50)) + " / " + us(percentile(xs, 99)) }
		after := make([]time.Duration, len(serving[i])) // hopSend is appended with serving
		for j := range after {
			after[j] = serving[i][j] - hopSend[i][j]
		}
		fmt.Fprintf(&tab, "%-24s  %19s  %19s  %19s  %19s  %19s  %19s\n", s.name, pp(choosing[i]), pp(serving[i]), pp(hopSend[i]), pp(after), pp(rest), pp(send[i]))
	}
	fmt.Fprintf(&tab, "\nto and from the engine, p50 / p99 / p99.5: from the request leaving the client to the engine's handler starting, and from the engine's first output to the client's first byte (the simulator's wall clock against the client's)\n")
	fmt.Fprintf(&tab, "%-24s  %27s  %27s\n", "series", "to the engine", "from the engine")
	for i, s := range ss {
		if len(toEngine[i]) == 0 {
			continue
		}
		pp := func(xs []time.Duration) string {
			return us(percentile(xs, 50)) + " / " + us(percentile(xs, 99)) + " / " + us(percentile(xs, 99.5))
		}
		fmt.Fprintf(&tab, "%-24s  %27s  %27s\n", s.name, pp(toEngine[i]), pp(fromEngine[i]))
	}
	for _, f := range []struct {
		name string
		f    *fixture
	}{{"new", fresh}, {"today", today}} {
		if f.f == nil {
			continue
		}
		r, err := f.f.do(ctx, http.MethodGet, f.f.c.Pod(1).Admin, "/metrics", nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		m := string(r.Body)
		v := func(name, label string) float64 { return metricValue(m, "kvroute_textprefix_"+name+"{"+label+"}") }
		fmt.Fprintf(&tab, "%s pod 2 sidecar: textprefix requests prefix %.0f tokenized %.0f; guesses right %.0f wrong %.0f unchecked %.0f; "+
			"learned from the request %.0f, from answers %.0f, composed %.0f, by tokenizing %.0f, dropped %.0f; compositions checked right %.0f wrong %.0f; "+
			"tokens tokenized on the request path %.0f, whole prefixes %.0f, new messages %.0f, stand-ins %.0f, checks %.0f\n", f.name,
			v("requests_total", `path="prefix"`), v("requests_total", `path="tokenized"`),
			v("guesses_total", `result="right"`), v("guesses_total", `result="wrong"`), v("guesses_total", `result="unchecked"`),
			v("learned_total", `result="request"`), v("learned_total", `result="answer"`), v("learned_total", `result="composed"`),
			v("learned_total", `result="stored"`), v("learned_total", `result="dropped"`),
			v("compose_checks_total", `result="right"`), v("compose_checks_total", `result="wrong"`),
			v("tokenized_tokens_total", `path="request"`), v("tokenized_tokens_total", `path="learn"`), v("tokenized_tokens_total", `path="compose"`),
			v("tokenized_tokens_total", `path="lead"`), v("tokenized_tokens_total", `path="verify"`))
		for i := range 2 {
			r, err := f.f.do(ctx, http.MethodGet, f.f.c.Pod(i).SimAddr, "/metrics", nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			m := string(r.Body)
			fmt.Fprintf(&tab, "%s pod %d vLLM tokenizer: %.0f calls, busy %.1f s, calls waited %.1f s in all\n", f.name, i+1,
				metricValue(m, "vllm_sim_tokenize_calls_total"), metricValue(m, "vllm_sim_tokenize_busy_seconds_total"),
				metricValue(m, "vllm_sim_tokenize_wait_seconds_total"))
		}
	}
	fmt.Fprintf(&tab, "Δ = a round's TTFB percentile minus the direct series' (same size and prompt form) in that round; every routed request enters pod 2's sidecar and is served on pod 1\n")
	fmt.Fprintf(&tab, "p99 vs p99 = the same p99 less the direct series' p99 instead of its median: the machine's own tail is in both\n")
	fmt.Fprintf(&tab, "added = per request, TTFB less the simulator's own time from the body read to the first byte (X-Sim-Service-Us: tokenizing, queueing, prefill, encoding), pooled over rounds, less the direct series' median of the same\n")
	fmt.Fprintf(&tab, "inside = per request, the entry sidecar's own time from the last request byte read to the answer's headers (Server-Timing kvroute), less the simulator's own time: both sidecars, the hop and the engine's body read, without the client's part\n")
	fmt.Print(tab.String())
}

var lockRNG sync.Mutex

// chatSeries is one kind of chat request in the open loop.
type chatSeries struct {
	name     string
	size     int
	path     string // default /v1/chat/completions
	addr     string
	servedBy string
	draw     func() []byte
	// before, when set, runs first (unmeasured) and returns the body.
	before func(ctx context.Context) ([]byte, error)

	mu      sync.Mutex
	ttfb    []time.Duration
	outside []time.Duration // ttfb less the simulator's service time
	inside  []time.Duration // the entry sidecar's own time less the same
	// choosing is the entry sidecar's time to choose the target;
	// serving the serving sidecar's own time less the engine's.
	choosing, serving []time.Duration
	send              []time.Duration // the entry sidecar writing it out
	hopSend           []time.Duration // the serving sidecar streaming it to the engine
	// toEngine: from the request leaving the client to the engine's
	// handler starting; fromEngine: from its first output to the first
	// byte here (both on the machine's wall clock).
	toEngine, fromEngine []time.Duration
	// insideTop: the three largest inside (with the entry's choosing
	// time); hopTop: the three largest serving-sidecar parts (with the
	// engine's body read).
	insideTop, hopTop [][2]time.Duration
	slowest           [][2]time.Duration // the round's three slowest: ttfb, service
	// outsideTop: the three with the most time outside the engine.
	outsideTop [][2]time.Duration
	errs       int
	firstErr   error
	decisions  map[string]int
}

// kind is what its Δ is taken against: the direct series of its size and
// prompt form.
func (s *chatSeries) kind() string {
	return fmt.Sprint(s.size, s.path)
}

func (s *chatSeries) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ttfb, s.outside, s.inside, s.slowest, s.outsideTop, s.errs, s.firstErr, s.decisions = nil, nil, nil, nil, nil, 0, nil, nil
	s.insideTop, s.hopTop, s.choosing, s.serving, s.send, s.hopSend, s.toEngine, s.fromEngine = nil, nil, nil, nil, nil, nil, nil, nil
}

// chatLoop is openLoop for chat series.
func chatLoop(ctx context.Context, hc *http.Client, ss []*chatSeries, rate float64, d time.Duration, rng *rand.Rand) {
	var gap func() time.Duration
	if *arrivals == "poisson" {
		lockRNG.Lock()
		gap = poisson(rate, rng.Uint64())
		lockRNG.Unlock()
	}
	paced(ctx, rate, d, gap, func() func() {
		lockRNG.Lock()
		s := ss[rng.IntN(len(ss))]
		var body []byte
		if s.draw != nil {
			body = s.draw()
		}
		lockRNG.Unlock()
		return func() {
			if s.before != nil {
				var err error
				if body, err = s.before(ctx); err != nil {
					s.record(0, -1, "", err)
					return
				}
			}
			r, ttfb, err := timeChat(ctx, hc, s.addr, s.path, body)
			if err == nil && r.ServedBy != s.servedBy {
				err = fmt.Errorf("%s: served by %q (%s), want %q", s.name, r.ServedBy, r.Decision, s.servedBy)
			}
			s.record(ttfb, r.Service, r.Decision, err)
			if err == nil && r.ToEngine >= 0 {
				s.mu.Lock()
				s.toEngine, s.fromEngine = append(s.toEngine, r.ToEngine), append(s.fromEngine, r.FromEngine)
				s.mu.Unlock()
			}
			if err == nil && r.Service >= 0 && r.Inside >= 0 {
				s.mu.Lock()
				s.inside = append(s.inside, r.Inside-r.Service)
				s.choosing = append(s.choosing, r.Route)
				if r.Hop >= 0 && r.HopSend >= 0 {
					s.serving = append(s.serving, r.Hop-r.Service)
					s.hopSend = append(s.hopSend, r.HopSend)
				}
				if r.Send >= 0 {
					s.send = append(s.send, r.Send)
				}
				s.insideTop = top3(s.insideTop, [2]time.Duration{r.Inside - r.Service, r.Route}, byTTFB)
				if r.Hop >= 0 {
					s.hopTop = top3(s.hopTop, [2]time.Duration{r.Hop - r.Service, r.Read}, byTTFB)
				}
				s.mu.Unlock()
			}
		}
	})
}

// record keeps a request's time to the first byte and, when the simulator
// said how long it took (service >= 0), the rest: the time outside the
// engine, request by request, free of the engine's own queueing.
func (s *chatSeries) record(ttfb, service time.Duration, decision string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++
		if s.firstErr == nil {
			s.firstErr = err
		}
		return
	}
	s.ttfb = append(s.ttfb, ttfb)
	if service >= 0 {
		s.outside = append(s.outside, ttfb-service)
	}
	s.slowest = top3(s.slowest, [2]time.Duration{ttfb, service}, byTTFB)
	if service >= 0 {
		s.outsideTop = top3(s.outsideTop, [2]time.Duration{ttfb, service}, byOutside)
	}
	if s.servedBy != "" {
		if s.decisions == nil {
			s.decisions = map[string]int{}
		}
		s.decisions[decision]++
	}
}

// serverTiming returns the duration of the named Server-Timing metric,
// -1 when there is none.
func serverTiming(h http.Header, name string) time.Duration {
	for _, v := range h.Values("Server-Timing") {
		for _, m := range strings.Split(v, ",") {
			n, param, ok := strings.Cut(strings.TrimSpace(m), ";dur=")
			if ms, err := strconv.ParseFloat(param, 64); ok && err == nil && n == name {
				return time.Duration(ms * float64(time.Millisecond))
			}
		}
	}
	return -1
}

// timeChat posts a chat body and times its first response byte.
func timeChat(ctx context.Context, hc *http.Client, addr, path string, body []byte) (reply, time.Duration, error) {
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, strings.NewReader(string(body)))
	if err != nil {
		return reply{}, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return reply{}, 0, err
	}
	defer resp.Body.Close()
	var buf [1]byte
	n, rerr := resp.Body.Read(buf[:])
	ttfb := time.Since(start)
	if n == 0 && rerr != nil {
		return reply{}, 0, fmt.Errorf("empty body: %w", rerr)
	}
	rest, _ := io.ReadAll(resp.Body)
	r := reply{Status: resp.StatusCode, ServedBy: resp.Header.Get("X-Kvroute-Served-By"), Decision: resp.Header.Get("X-Kvroute-Decision"),
		Body: append(buf[:n:n], rest...), Service: -1,
		Inside: serverTiming(resp.Header, "kvroute"), Route: serverTiming(resp.Header, "kvroute-route"), Hop: serverTiming(resp.Header, "kvroute-hop"),
		Send: serverTiming(resp.Header, "kvroute-send"), HopSend: serverTiming(resp.Header, "kvroute-hop-send")}
	// vllm-sim's ServiceHeader: its own time, body read to first output.
	if us, err := strconv.ParseInt(resp.Header.Get("X-Sim-Service-Us"), 10, 64); err == nil {
		r.Service = time.Duration(us) * time.Microsecond
	}
	r.Read = -1
	if us, err := strconv.ParseInt(resp.Header.Get("X-Sim-Read-Us"), 10, 64); err == nil {
		r.Read = time.Duration(us) * time.Microsecond
	}
	// vllm-sim's StartHeader, on this machine's clock: the way to its
	// handler, and from its first output back to this client's first byte.
	r.ToEngine, r.FromEngine = -1, -1
	if at, err := strconv.ParseInt(resp.Header.Get("X-Sim-Start-Unix-Us"), 10, 64); err == nil && r.Service >= 0 && r.Read >= 0 {
		began := time.UnixMicro(at)
		r.ToEngine = began.Sub(start)
		r.FromEngine = start.Add(ttfb).Sub(began.Add(r.Read + r.Service))
	}
	if r.Status != http.StatusOK {
		return r, 0, fmt.Errorf("status %d: %s", r.Status, r.Body)
	}
	return r, ttfb, nil
}

func postChat(ctx context.Context, hc *http.Client, addr string, body []byte) (reply, error) {
	r, _, err := timeChat(ctx, hc, addr, "", body)
	return r, err
}

// routedToPod1 posts bodies drawn by draw to pod 2's sidecar until one is
// served by pod 1 (the prefix's holder), for at most 15 s.
func routedToPod1(ctx context.Context, b *testing.B, hc *http.Client, f *fixture, size int, draw func() []byte) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		lockRNG.Lock()
		body := draw()
		lockRNG.Unlock()
		r, err := postChat(ctx, hc, f.c.Pod(1).API, body)
		if err != nil {
			b.Fatal(err)
		}
		if r.ServedBy == f.c.Pod(0).Name {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d tokens: pod 2 never routed to pod 1 (last: %s, %s)", size, r.ServedBy, r.Decision)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// routedPath posts bodies of path drawn by draw to pod 2's sidecar until
// one is served by pod 1, for at most 15 s.
func routedPath(ctx context.Context, b *testing.B, hc *http.Client, f *fixture, size int, path string, draw func() []byte) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		lockRNG.Lock()
		body := draw()
		lockRNG.Unlock()
		r, _, err := timeChat(ctx, hc, f.c.Pod(1).API, path, body)
		if err != nil {
			b.Fatal(err)
		}
		if r.ServedBy == f.c.Pod(0).Name {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d tokens, %s: pod 2 never routed to pod 1 (last: %s, %s)", size, path, r.ServedBy, r.Decision)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agentAPIs are the agents' APIs BenchmarkTextPrefix runs beside chat:
// a body of a system prompt and alternating user and assistant turns.
var agentAPIs = []struct {
	name, path string
	body       func(system string, turns ...string) []byte
}{
	{"messages", "/v1/messages", func(system string, turns ...string) []byte {
		var msgs []map[string]string
		for i, t := range turns {
			msgs = append(msgs, map[string]string{"role": [2]string{"user", "assistant"}[i%2], "content": t})
		}
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "system": system, "messages": msgs})
		return b
	}},
	{"responses", "/v1/responses", func(system string, turns ...string) []byte {
		var items []map[string]any
		for i, t := range turns {
			if i%2 == 0 {
				items = append(items, map[string]any{"type": "message", "role": "user", "content": t})
				continue
			}
			items = append(items, map[string]any{"type": "message", "role": "assistant",
				"content": []map[string]any{{"type": "output_text", "text": t}}})
		}
		b, _ := json.Marshal(map[string]any{"model": model, "max_output_tokens": 4, "instructions": system, "input": items})
		return b
	}},
}

// docBody is a question about a document given in a message of its own.
func docBody(doc, question string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": "Answer from the document the user gives."},
		{"role": "user", "content": doc},
		{"role": "user", "content": question}}})
	return b
}

// chatBody is a chat request: a system prompt, then alternating user and
// assistant messages.
func chatBody(system string, turns ...string) []byte {
	return conversationBody([]map[string]string{{"role": "system", "content": system}}, turns)
}

// conversationBody is a chat request of msgs followed by turns, user and
// assistant in turn.
func conversationBody(msgs []map[string]string, turns []string) []byte {
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": msgs})
	return b
}

// benchWords are one token each with their leading space in the
// simulator's vocabulary, so n words are about n tokens.
var benchWords = strings.Fields("the of and to in is was for that on as with by he at from his it an were are which this be or has had first one their its new after who they two her she been other when there all during into school time may years more most only over city some world would where later up such used many can state about national out known university united then made also between since under through both these three being before while however until team part well")

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(benchWords[rng.IntN(len(benchWords))])
	}
	return b.String()
}

// top3 keeps the three (ttfb, service) pairs largest by by.
func top3(xs [][2]time.Duration, x [2]time.Duration, by func([2]time.Duration) time.Duration) [][2]time.Duration {
	xs = append(xs, x)
	slices.SortFunc(xs, func(a, b [2]time.Duration) int { return int(by(b) - by(a)) })
	return xs[:min(3, len(xs))]
}

func byTTFB(x [2]time.Duration) time.Duration    { return x[0] }
func byOutside(x [2]time.Duration) time.Duration { return x[0] - x[1] }

// recordSched records the machine's scheduler for d with perf (perf sched
// record, every CPU) into dir/sched.data and prints, per process name and
// CPU, how long woken tasks waited for a CPU (also in dir/sched.txt).
func recordSched(ctx context.Context, dir string, d time.Duration) error {
	data := filepath.Join(dir, "sched.data")
	rec := exec.CommandContext(ctx, "perf", "sched", "record", "-a", "-m", "32M", "-o", data, "--", "sleep", strconv.Itoa(int(d.Seconds())))
	if out, err := rec.CombinedOutput(); err != nil {
		return fmt.Errorf("perf sched record: %v: %s", err, out)
	}
	hist, err := exec.CommandContext(ctx, "perf", "sched", "timehist", "-i", data).Output()
	if err != nil {
		return fmt.Errorf("perf sched timehist: %v", err)
	}
	names, delays, err := schedDelays(bytes.NewReader(hist))
	if err != nil {
		return err
	}
	tab := fmt.Sprintf("scheduling delays over %v of round 1 (perf sched: from a task's wake-up until it ran):\n%s", d, schedTable(names, delays, 100))
	fmt.Print(tab)
	return os.WriteFile(filepath.Join(dir, "sched.txt"), []byte(tab), 0o644)
}

// profileSidecars writes a profile of d of every sidecar of f to dir:
// sidecar-N.cpu or sidecar-N.allocs (the allocations over d; go tool
// pprof), or sidecar-N.trace (go tool trace).
func profileSidecars(ctx context.Context, f *fixture, kind, dir string, d time.Duration) error {
	path := map[string]string{"cpu": "profile", "trace": "trace", "allocs": "allocs", "sched": "-"}[kind]
	if path == "" {
		return fmt.Errorf("unknown kind %q (cpu, trace, allocs or sched)", kind)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if kind == "sched" {
		return recordSched(ctx, dir, d)
	}
	var wg sync.WaitGroup
	errs := make([]error, f.c.Len())
	for i := range f.c.Len() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", f.c.Pod(i).Admin, path, int(d.Seconds()))
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				errs[i] = err
				return
			}
			r, err := http.DefaultClient.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Body.Close()
			if r.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("%s: %s", url, r.Status)
				return
			}
			out, err := os.Create(filepath.Join(dir, fmt.Sprintf("sidecar-%d.%s", i+1, kind)))
			if err != nil {
				errs[i] = err
				return
			}
			_, err = io.Copy(out, r.Body)
			errs[i] = errors.Join(err, out.Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
