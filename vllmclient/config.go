package vllmclient

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config configures a Subscriber. Every field has a usable default in
// DefaultConfig; a zero Config is not valid.
type Config struct {
	// Endpoint is vLLM's KV-event PUB address as seen from the sidecar.
	// Default "tcp://127.0.0.1:5557": vLLM binds tcp://*:5557 by default
	// and the sidecar dials it over pod loopback.
	Endpoint string
	// Bind makes the SUB socket bind Endpoint instead of connecting, for a
	// vLLM configured to connect out (an endpoint without "*"; see
	// docs/reference/vllm-interface.md §1.2). Default false.
	Bind bool
	// Topic is the subscription prefix; "" (default) receives every topic.
	// Replay replies from vLLM <= v0.25 carry no topic: batches replayed at
	// start-up are attributed to Topic, so set it to vLLM's exact topic when
	// replay is on (gap replays use the topic of the stream that asked).
	Topic string
	// ReplayEndpoint is vLLM's replay ROUTER (kv_events_config
	// replay_endpoint, always bound by vLLM); "" (default) disables replay.
	// With replay on, the subscriber replays from seq 0 at start-up and
	// repairs gaps; without it, gaps are reported as Gap items. Replay
	// assumes one publisher per rank (vLLM binds; Bind false).
	ReplayEndpoint string
	// DPRanks is the number of data-parallel ranks (default 1). vLLM offsets
	// both endpoints per rank: rank r uses port+r for tcp:// and name_dp<r>
	// for ipc:// and inproc:// (docs/reference/vllm-interface.md §1.2). One SUB (and DEALER)
	// is opened per rank; items carry the rank in Stream.Rank. The ranks of
	// one vLLM restart together: a restart is reported once, by the rank
	// that shows it first, and the others start afresh at their own next
	// seq that goes back.
	DPRanks int
	// RcvHWM is the SUB receive high-water mark in messages (default
	// 100000, matching vLLM's PUB hwm). Past it libzmq drops silently and a
	// Gap follows; higher costs memory only while the loop falls behind.
	RcvHWM int
	// ReconnectIvl and ReconnectIvlMax bound libzmq's reconnect backoff
	// (defaults 100ms and 5s): short enough to catch a restarted vLLM before
	// it publishes much, long enough not to spin while it loads a model.
	ReconnectIvl    time.Duration
	ReconnectIvlMax time.Duration
	// Heartbeat is the ZMTP heartbeat interval (default 5s); the connection
	// is dropped after 3 missed heartbeats, which detects a half-open peer.
	// 0 disables heartbeats.
	Heartbeat time.Duration
	// HandoffDepth is the capacity, in items, of the channel between the
	// socket loops and the consumer (default 4096). When it is full items
	// are dropped and counted (Stats.Dropped) rather than blocking the
	// socket loop, and the stream's next delivered batch is preceded by a
	// Gap covering what was dropped.
	HandoffDepth int
	// ReplayTimeout is how long a replay may go without a reply before it is
	// abandoned (default 2s). Live batches of the stream are held meanwhile,
	// so it bounds the extra latency a dead replay socket can add.
	ReplayTimeout time.Duration
	// ReplayHoldBatches bounds the live batches held while a replay runs
	// (default 10000, vLLM's buffer_steps). Past it the replay is abandoned
	// and the remaining hole is reported as a Gap.
	ReplayHoldBatches int
	// PollInterval is the longest a socket loop waits before it checks for
	// cancellation (default 250ms). Shorter stops faster and wakes more.
	PollInterval time.Duration
}

// DefaultConfig returns the settings for a sidecar next to one vLLM that
// binds its default endpoint.
func DefaultConfig() Config {
	return Config{
		Endpoint:          "tcp://127.0.0.1:5557",
		DPRanks:           1,
		RcvHWM:            100_000,
		ReconnectIvl:      100 * time.Millisecond,
		ReconnectIvlMax:   5 * time.Second,
		Heartbeat:         5 * time.Second,
		HandoffDepth:      4096,
		ReplayTimeout:     2 * time.Second,
		ReplayHoldBatches: 10_000,
		PollInterval:      250 * time.Millisecond,
	}
}

// LocalConfig returns DefaultConfig with short intervals for tests, the
// simulator and chaos runs on one machine.
func LocalConfig() Config {
	c := DefaultConfig()
	c.ReconnectIvl = 10 * time.Millisecond
	c.ReconnectIvlMax = 100 * time.Millisecond
	c.Heartbeat = 0
	c.ReplayTimeout = 500 * time.Millisecond
	c.PollInterval = 20 * time.Millisecond
	return c
}

func (c Config) validate() error {
	switch {
	case c.Endpoint == "":
		return fmt.Errorf("config: empty endpoint")
	case c.DPRanks < 1:
		return fmt.Errorf("config: dp ranks %d < 1", c.DPRanks)
	case c.HandoffDepth < 1:
		return fmt.Errorf("config: handoff depth %d < 1", c.HandoffDepth)
	case c.PollInterval <= 0:
		return fmt.Errorf("config: poll interval %v <= 0", c.PollInterval)
	case c.ReplayEndpoint != "" && c.ReplayTimeout <= 0:
		return fmt.Errorf("config: replay timeout %v <= 0", c.ReplayTimeout)
	}
	return nil
}

// RankEndpoint returns the endpoint vLLM uses for data-parallel rank r
// (vLLM offset_endpoint_port): tcp ports are offset by r, ipc and inproc
// names get the suffix _dp<r>. Rank 0 is the endpoint unchanged.
func RankEndpoint(ep string, r int) (string, error) {
	if r == 0 {
		return ep, nil
	}
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok {
		return "", fmt.Errorf("endpoint %q: no scheme", ep)
	}
	switch scheme {
	case "ipc", "inproc":
		return fmt.Sprintf("%s_dp%d", ep, r), nil
	case "tcp":
		i := strings.LastIndexByte(addr, ':')
		if i < 0 {
			return "", fmt.Errorf("endpoint %q: no port", ep)
		}
		port, err := strconv.Atoi(addr[i+1:])
		if err != nil || port <= 0 || port+r > 65535 {
			return "", fmt.Errorf("endpoint %q: port cannot be offset for rank %d", ep, r)
		}
		return fmt.Sprintf("tcp://%s:%d", addr[:i], port+r), nil
	}
	return "", fmt.Errorf("endpoint %q: unsupported scheme %q", ep, scheme)
}
