package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/forward"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/route"
)

// config is everything `sidecar serve` needs, from flags with
// KVROUTE_<NAME> environment twins (flag wins over env, env over default).
type config struct {
	Listen        string
	AdminListen   string
	VLLMURL       string
	Model         string
	NodeName      string
	AdvertiseAddr string
	// EngineAdvertiseAddr is where peers may reach the local vLLM itself
	// (engineAdvertise); "none" advertises nothing.
	EngineAdvertiseAddr string
	GossipPort          int
	Join                []string
	SecretFile          string
	ClusterLabel        string

	EventsEndpoint       string
	EventsBind           bool
	EventsTopic          string
	EventsReplayEndpoint string
	DPRanks              int
	PlaceRanks           bool

	BlockSize      int
	RoutingStride  int
	CapacityBlocks int
	FPRate         float64

	MaxBodyBytes    int64
	MaxQueue        int           // requests waiting at a pod at which it is full; 0: off
	MaxQueueWait    time.Duration // queued prefill at --prefill-rate at which a pod is full; 0: off
	MaxPrefillShare float64       // prefill share at which a pod takes no long prompt; 0 or 1: off
	StepTokens      int           // the engine's --max-num-batched-tokens: a queue past it is the backlog the share refuses on
	ServeRetry      int           // a client's attempt (X-Stainless-Retry-Count) from which the prefill share does not refuse it; 0: off
	BodyTimeout     time.Duration // reading a client's body; 0: no bound
	WriteTimeout    time.Duration // each write of an answer to the client; 0: no bound
	TextPrefixKeys  int           // 0: chat prompts are tokenized on the request path
	TextPrefixIDs   bool          // learn chat prefixes from the answer's prompt token ids
	// Shortlist makes a choice among many peers read the few that can win
	// it (forward.Config.NoShortlist's opposite).
	Shortlist bool
	// TextPrefixCompose learns a prefix that extends a known one from its
	// new messages alone; one in TextPrefixVerify is tokenized whole too.
	TextPrefixCompose bool
	TextPrefixVerify  int
	DrainTimeout      time.Duration
	LoadInterval      time.Duration
	DigestInterval    time.Duration
	LoadPushDelay     time.Duration
	LoadPushInterval  time.Duration
	ClaimPushInterval time.Duration
	ModelsInterval    time.Duration
	// RouteLoad is how peers' load is weighed: "work" (queued prefill
	// tokens and requests) or "requests" (the count alone).
	RouteLoad   string
	PrefillRate float64 // the engine's prefill tokens per second
	// Slack and MinHeadroom are route.Config's load bound.
	Slack, MinHeadroom float64
	// KVWeight is route.Config's: the load, in requests, of a full KV
	// cache.
	KVWeight float64
	// IdleSlack and IdleHeadroom are route.Config's bound while a pod
	// idles.
	IdleSlack, IdleHeadroom float64
	// IdleLoadTokens is route.Config's price of load while a pod idles.
	IdleLoadTokens float64
	// CPULoadRate and DiskLoadRate are how fast the engine loads a
	// token's KV back from its CPU and disk tiers, tokens per second.
	CPULoadRate  float64
	TierStride   int // routing keys a lower-tier digest entry stands for
	DiskLoadRate float64

	HealthInterval time.Duration
	HealthTimeout  time.Duration
	HungAfter      int
	HungQuiet      time.Duration
	SilenceWindow  time.Duration
	LogLevel       string
	LogFormat      string
	Procs          int
}

// envName is a flag's environment twin: --kv-events-endpoint →
// KVROUTE_KV_EVENTS_ENDPOINT.
func envName(flagName string) string {
	return "KVROUTE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseServe parses the serve flags. A flag not given on the command line
// takes its KVROUTE_<NAME> environment twin when that is set.
func parseServe(args []string, getenv func(string) string, stdout, stderr io.Writer) (config, error) {
	var c config
	var join string
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", ":8000", "address of the OpenAI API, for clients (via the Service) and for peer sidecars; gossip binds on its host too")
	fs.StringVar(&c.AdminListen, "admin-listen", ":9090", "address of /metrics, /debug/*, /readyz, /livez and the drain endpoints: GET /drain reports, POST /drain drains (and stays drained), POST /undrain serves again, GET /drain/prestop drains for a preStop hook")
	fs.StringVar(&c.VLLMURL, "vllm-url", "http://127.0.0.1:8001", "base URL of the local vLLM server")
	fs.StringVar(&c.Model, "model", "", "base model name that block keys are seeded with (default: the local vLLM's first /v1/models entry)")
	fs.StringVar(&c.NodeName, "node-name", "", "unique node name in the mesh; sidecars sharing a host each need their own (default: $POD_NAME, else the hostname)")
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", getenv("POD_IP"), "IP that peers use to reach this pod (default: $POD_IP)")
	fs.StringVar(&c.EngineAdvertiseAddr, "engine-advertise-addr", "", "host:port where peer sidecars may reach the local vLLM itself, only to ask it about a stored response (previous_response_id, GET, cancel) while this sidecar is away: restarting or dead, with vLLM alive. Peers rely on a refused connection (the store is gone) only where they once reached it. Default: --vllm-url with a loopback host replaced by --advertise-addr; none: advertise nothing")
	fs.IntVar(&c.GossipPort, "gossip-port", 7946, "memberlist port (UDP and TCP), bound on --listen's host (every interface when it names none)")
	fs.StringVar(&join, "join", "", "comma-separated seeds (host:port or DNS names, re-resolved periodically), e.g. the headless Service")
	fs.StringVar(&c.SecretFile, "cluster-secret-file", "", "file holding the cluster secret; the gossip and hop-authentication keys derive from it (without it: unauthenticated, for local use only)")
	fs.StringVar(&c.ClusterLabel, "cluster-label", "kvroute", "memberlist label; members with another label are rejected")
	fs.StringVar(&c.EventsEndpoint, "kv-events-endpoint", "tcp://127.0.0.1:5557", "vLLM's KV-event PUB endpoint. Exactly one side binds: vLLM binds for tcp://*:PORT and ipc:// endpoints (connect to it here) and connects for tcp://HOST:PORT (then pass --kv-events-bind)")
	fs.BoolVar(&c.EventsBind, "kv-events-bind", false, "bind the SUB socket at --kv-events-endpoint (for a vLLM whose endpoint names a host, which makes it connect out)")
	fs.StringVar(&c.EventsTopic, "kv-events-topic", "", "topic prefix to subscribe to; must match vLLM's kv_events_config topic (empty: every topic)")
	fs.StringVar(&c.EventsReplayEndpoint, "kv-events-replay-endpoint", "", "vLLM's replay ROUTER endpoint; enables exact recovery after lost events")
	fs.IntVar(&c.DPRanks, "kv-events-dp-ranks", 1, "data-parallel ranks of the local vLLM (its --data-parallel-size); rank r publishes on port+r")
	fs.BoolVar(&c.PlaceRanks, "dp-place-ranks", true, "with several --kv-events-dp-ranks, name the rank of every request sent to the local vLLM that its client did not pin (X-data-parallel-rank): the rank holding its prefix unless the work queued there costs more than the prefix saves, else the rank with the least work; false: only the mesh's prefix pin, vLLM balances the rest")
	fs.IntVar(&c.BlockSize, "block-size", 16, "vLLM's block size in tokens (events carry it too)")
	fs.IntVar(&c.RoutingStride, "routing-stride", blockkey.DefaultScheme().Stride, "routing granularity in vLLM blocks (one digest key per stride x block-size tokens)")
	fs.IntVar(&c.CapacityBlocks, "capacity-blocks", 0, "KV capacity in blocks, for digest sizing (default: vLLM's num_gpu_blocks from /metrics, else 100000)")
	fs.Float64Var(&c.FPRate, "digest-fp-rate", 0.01, "target Bloom false-positive rate of the digest at capacity")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", 32<<20, "largest request body accepted (413 above)")
	fd := forward.DefaultConfig()
	fs.IntVar(&c.MaxQueue, "max-queue", fd.MaxQueue, "requests waiting at a pod's engine (not yet scheduled: vllm:num_requests_waiting, or the requests its sidecar has there beyond the scraped running ones, plus those sent it since its last report) at which the pod is full; when every pod that could serve a request is full, it is refused at once with 429 and Retry-After: 1 in its API's error shape; 0: off")
	fs.Float64Var(&c.MaxPrefillShare, "max-prefill-share", fd.MaxPrefillShare, "share of the last few seconds (an average over 5 s) in which a pod's engine had prompt tokens queued for prefill, at which the pod takes no new request of over 1024 uncached tokens: under a sustained backlog every engine step carries a prefill chunk, and the answers it decodes get a token per step at prefill speed. 0.9 leaves a tenth of the engine's time to prefill-free steps; only while the request would leave more than --max-num-batched-tokens queued for prefill there; 0 or 1: off")
	fs.IntVar(&c.StepTokens, "max-num-batched-tokens", fd.StepTokens, "the engine's token budget per step, as vLLM's own --max-num-batched-tokens: --max-prefill-share refuses a long prompt only where, with it, more than this is queued for prefill (every step then a full prefill chunk); a queue within one step leaves the answers their pace. 0: any queue")
	fs.IntVar(&c.ServeRetry, "serve-retry", fd.ServeRetry, "a client's attempt from which --max-prefill-share does not refuse its request, by the X-Stainless-Retry-Count header the OpenAI and Anthropic SDKs send (0 on the first attempt; they give up after attempt 2 by default): refused there, the request is lost. --max-queue and --max-queue-wait still refuse it. 0: off")
	fs.DurationVar(&c.MaxQueueWait, "max-queue-wait", fd.MaxQueueWait, "queued prefill (the prompt tokens a pod must compute before its requests' first tokens, at --prefill-rate) at which the pod is full, as --max-queue; 8 s drains within the 10 s a burst's TTFT should recover in; 0: off")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", fd.BodyTimeout, "how long a client has to send its request body, from its headers; a slower body is cut off with 408 in its API's error shape (32 MiB at 3.2 MB/s at the default); 0: no bound")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", fd.WriteTimeout, "how long one write of an answer to a client may block; a client that reads a stream slower is cut off and its engine request canceled, freeing the slot; 0: no bound")
	fs.IntVar(&c.TextPrefixKeys, "text-prefix-keys", 1<<20, "memory of learned chat prefixes, in routing keys of 8 bytes (each entry also counts ~200 bytes; unused ones go after 3 min); chats whose leading messages were seen are routed without a /tokenize call; 0: off")
	fs.BoolVar(&c.TextPrefixIDs, "text-prefix-from-answer", false, "learn a chat's whole conversation from the prompt token ids its answer carries (the sidecar sets vLLM's return_token_ids, vLLM >= 0.10.2, and gives the client null there, as vLLM does unasked); the default composes it from the known prefix and the new messages' tokens, which costs less: ~190 KB of ids cross both sidecars per 32k-token answer")
	fs.BoolVar(&c.TextPrefixCompose, "text-prefix-compose", true, "learn a chat prefix that extends a known one by tokenizing only its new messages (behind a short stand-in turn) and continuing the known one's keys; false: tokenize every learned prefix whole")
	fs.IntVar(&c.TextPrefixVerify, "text-prefix-verify-every", 16, "tokenize one composed prefix in this many whole as well, and compare (and the first few of every chat-template context); a template whose compositions are wrong composes no more")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 60*time.Second, "how long a drain (POST /drain, GET /drain/prestop, SIGTERM) waits for in-flight requests")
	fs.DurationVar(&c.LoadInterval, "load-interval", 250*time.Millisecond, "how often the local vLLM's load is scraped and advertised to peers (each advertisement is one memberlist alive broadcast)")
	fs.DurationVar(&c.ModelsInterval, "models-interval", 5*time.Second, "how often the local vLLM's /v1/models (base model and LoRA adapters) is read and advertised; a load or unload of an adapter through the sidecar is advertised at once")
	fs.DurationVar(&c.DigestInterval, "digest-interval", 100*time.Millisecond, "how often digest changes are sent to peers")
	fs.DurationVar(&c.LoadPushInterval, "load-push-interval", gossip.DefaultConfig().LoadPushInterval, "the least time between two load reports this pod pushes to every peer (one UDP packet each): a change waits at most this long, so independent sidecars see a request land within it; each pod sends at most peers ÷ interval packets a second")
	fs.DurationVar(&c.ClaimPushInterval, "claim-push-interval", claimPushDefault(), "the least time between a load report and the next when that one carries a new claim (where this front just sent a request's prefix), at most --load-push-interval: the other fronts then send the request's siblings (an agent's parallel calls) after it sooner; 0 (the default): at once")
	fs.DurationVar(&c.LoadPushDelay, "load-push-delay", gossip.DefaultConfig().LoadPushDelay, "how long a change of this pod's load or a claim (a request landing, leaving or sent on) waits before it is pushed to peers, so the request that made it is on its way first; changes meanwhile go in one push (the engine's state goes at once); 0: at once")
	fs.DurationVar(&c.HealthInterval, "health-interval", 250*time.Millisecond, "how often the local vLLM's /health is probed; a refused probe or request makes the engine down at once")
	ed := engine.DefaultConfig()
	fs.DurationVar(&c.HealthTimeout, "health-timeout", ed.ProbeTimeout, "a /health probe without an answer by then counts as a timeout")
	fs.IntVar(&c.HungAfter, "health-hung-after", ed.HungAfter, "probe timeouts in a row after which the engine counts as hung (down), if it also published no KV event for --health-hung-quiet")
	fs.DurationVar(&c.HungQuiet, "health-hung-quiet", ed.QuietFor, "how long an engine whose probes time out must also have published no KV event to count as hung: a saturated vLLM answers /health late but keeps computing")
	fs.DurationVar(&c.SilenceWindow, "kv-events-silence-window", 10*time.Second, "warn (log, metric, /readyz body) when vLLM serves this long with no KV event ever arriving")
	fs.StringVar(&c.RouteLoad, "route-load", "work", "how a peer's load is weighed in the choice: work (the prompt tokens it must still prefill, plus its requests), requests (the count alone, as kvroute weighed it before; for comparison) or lmetric (LMetric's uncached tokens × (requests + 1); for comparison)")
	fs.Float64Var(&c.PrefillRate, "prefill-rate", route.DefaultConfig().PrefillTokensPerSecond, "the engine's prefill throughput in tokens per second, which turns /debug/route's costs into expected times to first token (default: the simulator's Llama-3.1-8B on one H100)")
	rd := route.DefaultConfig()
	fs.Float64Var(&c.Slack, "route-slack", rd.Slack, "the load bound's slack: a pod whose requests would exceed max(m*(1+slack), m+min-headroom), m the mean counting this request, is passed over for one within it, holder or not. Caps max/mean requests per pod near 1+slack under pressure; larger favours cache hits, smaller balance")
	fs.Float64Var(&c.MinHeadroom, "route-min-headroom", rd.MinHeadroom, "the load bound's headroom in requests (--route-slack): a lightly loaded cluster keeps a prefix at its holder for this much imbalance")
	fs.Float64Var(&c.IdleSlack, "route-idle-slack", rd.IdleSlack, "while some pod is idle, a pod with requests waiting for their first token is over max(m*(1+idle-slack), m+idle-headroom): the few pods holding the prefixes every session starts from (agents' system prompts) do not queue while others idle; 0.5 with --route-idle-headroom 2 was measured; a pod whose match reaches further by what was just sent there (a burst) is spared; both 0: off (most of a burst reaches other sidecars before its claim, and is spread)")
	fs.Float64Var(&c.IdleHeadroom, "route-idle-headroom", rd.IdleHeadroom, "the idle bound's headroom in requests (--route-idle-slack)")
	fs.Float64Var(&c.IdleLoadTokens, "route-idle-load-tokens", rd.IdleLoadTokens, "while some pod is idle, the price in prefill tokens of a request of load at a pod with two or more requests waiting, when the choice weighs a cached prefix against its queue (64 otherwise): a queued holder of a short shared prefix yields new requests to the idle pod; 0: off")
	fs.BoolVar(&c.Shortlist, "route-shortlist", true, fmt.Sprintf("among %d peers or more, read the views of only the peers that can win a request (its best matches and scores, the lightest, the failover order's next) and sum the rest, which decides the same: at a thousand peers under half the time, a quarter where every peer holds claims; false: read every peer's view", route.ShortlistMin))
	fs.Float64Var(&c.KVWeight, "route-kv-weight", rd.KVWeight, "the load, in requests, that a peer's full KV cache adds (from 0 at 80% usage): a pod near full evicts what its sessions will ask for next, so a larger weight sends new prefixes to pods with room sooner")
	fs.Float64Var(&c.CPULoadRate, "cpu-load-rate", route.DefaultCPULoadTokensPerSecond, "how fast the engine loads a token's KV from its CPU tier (vLLM's native offloading, LMCache) back to the GPU, in tokens per second; a CPU-cached token is credited 1 - prefill-rate/cpu-load-rate of a GPU-cached one. The default is Llama-3.1-8B's 128 KiB per token over PCIe Gen5 x16 at 50 GB/s, the simulator's rate; 0: CPU copies are not credited")
	fs.IntVar(&c.TierStride, "tier-stride", kvindex.DefaultTierStride, "routing keys one lower-tier (CPU, disk) digest entry stands for: 1, 2, 4, 8 or 16. Larger sends peers fewer entries for a CPU tier several times the GPU cache (upkeep) and matches lower tiers more coarsely; 8 is 512 tokens at the default scheme")
	fs.Float64Var(&c.DiskLoadRate, "disk-load-rate", route.DefaultDiskLoadTokensPerSecond, "as --cpu-load-rate, for the disk tier (and shared storage). The default is the same model at 5 GB/s, one NVMe drive; 0: disk copies are not credited")
	fs.IntVar(&c.Procs, "procs", 1, "Go scheduler threads (GOMAXPROCS; a GOMAXPROCS variable wins); 0 keeps Go's default, one per CPU the container may use")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "json", "json or console")
	cli.Usage(fs, "sidecar [serve] [flags]\n       sidecar events [flags]   (print a KV-event stream; sidecar events --help)",
		"The kvroute sidecar: serves the OpenAI API in front of the local vLLM and routes each request\n"+
			"to the pod that holds the longest cached prefix of its prompt.\n"+
			"Every flag has an environment twin KVROUTE_<NAME> (e.g. --vllm-url: KVROUTE_VLLM_URL);\n"+
			"a flag on the command line wins over its twin.")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" && !set[f.Name] && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if c.NodeName == "" {
		host, _ := os.Hostname()
		c.NodeName = firstNonEmpty(getenv("POD_NAME"), host)
	}
	for _, s := range strings.Split(join, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.Join = append(c.Join, s)
		}
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("--node-name is empty and no hostname is known")
	case c.BlockSize <= 0 || c.RoutingStride <= 0:
		return errors.New("--block-size and --routing-stride must be positive")
	case c.FPRate <= 0 || c.FPRate >= 1:
		return errors.New("--digest-fp-rate must be in (0, 1)")
	case c.RouteLoad != "work" && c.RouteLoad != "requests" && c.RouteLoad != "lmetric":
		return fmt.Errorf("--route-load %q: want work, requests or lmetric", c.RouteLoad)
	case c.PrefillRate < 0:
		return errors.New("--prefill-rate must not be negative")
	case c.CPULoadRate < 0 || c.DiskLoadRate < 0:
		return errors.New("--cpu-load-rate and --disk-load-rate must not be negative (0: that tier is not credited)")
	case !bloom.TierStrideOK(c.TierStride):
		return fmt.Errorf("--tier-stride %d: want 1, 2, 4, 8 or 16", c.TierStride)
	case c.DPRanks < 1 || c.DPRanks > bloom.MaxRanks:
		return fmt.Errorf("--kv-events-dp-ranks must be in 1..%d", bloom.MaxRanks)
	case c.TextPrefixKeys < 0:
		return errors.New("--text-prefix-keys must not be negative")
	case c.TextPrefixVerify < 1:
		return errors.New("--text-prefix-verify-every must be at least 1")
	case c.ModelsInterval <= 0:
		return errors.New("--models-interval must be positive")
	case c.LoadPushInterval <= 0:
		return errors.New("--load-push-interval must be positive")
	case c.ClaimPushInterval < 0:
		return errors.New("--claim-push-interval must not be negative (0: at once)")
	case c.LoadPushDelay < 0:
		return errors.New("--load-push-delay must not be negative")
	case c.MaxBodyBytes <= 0:
		return errors.New("--max-body-bytes must be positive")
	case c.MaxQueue < 0 || c.MaxQueueWait < 0:
		return errors.New("--max-queue and --max-queue-wait must not be negative (0: off)")
	case c.StepTokens < 0:
		return errors.New("--max-num-batched-tokens must be at least 0")
	case c.ServeRetry < 0:
		return errors.New("--serve-retry must not be negative (0: off)")
	case !(c.MaxPrefillShare >= 0 && c.MaxPrefillShare <= 1):
		return errors.New("--max-prefill-share must be within 0..1 (0 or 1: off)")
	case c.BodyTimeout < 0 || c.WriteTimeout < 0:
		return errors.New("--body-timeout and --write-timeout must not be negative (0: no bound)")
	case c.HealthInterval <= 0 || c.HealthTimeout <= 0 || c.HungAfter < 1 || c.HungQuiet <= 0:
		return errors.New("--health-interval, --health-timeout and --health-hung-quiet must be positive, --health-hung-after at least 1")
	case c.KVWeight < 0 || math.IsNaN(c.KVWeight):
		return errors.New("--route-kv-weight must be at least 0")
	case c.IdleLoadTokens < 0 || math.IsNaN(c.IdleLoadTokens):
		return errors.New("--route-idle-load-tokens must be at least 0")
	case c.IdleSlack < 0 || c.IdleHeadroom < 0 || math.IsNaN(c.IdleSlack) || math.IsNaN(c.IdleHeadroom):
		return errors.New("--route-idle-slack and --route-idle-headroom must be at least 0")
	}
	return nil
}

// claimPushDefault is --claim-push-interval's default, gossip's in the
// flag's terms: its negative (at once) is the flag's 0.
func claimPushDefault() time.Duration {
	return max(gossip.DefaultConfig().ClaimPushInterval, 0)
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
