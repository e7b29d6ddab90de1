package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scenario is a chaos run as a JSON file describes it:
//
//	{"name": "kill-every-20s", "pods": 8, "duration": "180s", "rate": 20,
//	 "workload": "multi-turn-chat",
//	 "faults": [{"at": "20s", "fault": "kill-pod", "pod": 3},
//	            {"at": "30s", "fault": "kill-engine", "pod": 1, "for": "15s"},
//	            {"at": "50s", "fault": "partition", "pod": "random", "for": "20s"}]}
//
// Pods are numbered from 1, as their names (pod1, pod2, ...) are.
type Scenario struct {
	Name     string   `json:"name,omitempty"`
	Pods     int      `json:"pods,omitempty"`
	Duration Duration `json:"duration,omitempty"`
	Rate     float64  `json:"rate,omitempty"`
	Workload string   `json:"workload,omitempty"`
	// ClientRetry makes the clients retry as the SDKs do (RunConfig's
	// ClientRetry, which the command's --client-retry also sets): a
	// scenario whose answers include a retryable 503 by design (a stored
	// response's pod briefly unreachable) is measured by whether an SDK
	// client gets through.
	ClientRetry bool `json:"client_retry,omitempty"`
	// SidecarFrom is a commit (PreviousRelease for the release before
	// this tree's) whose sidecar every pod starts with, built once and
	// kept under out/ (BuildSidecarAt); upgrade-sidecar moves a pod to
	// this tree's. Empty: every pod runs this tree's.
	SidecarFrom string `json:"sidecar_from,omitempty"`
	// BlocksPerPod is every simulator's KV capacity in blocks of 16 tokens
	// (RunConfig's; default 2048, a 32k-token cache, which one 32k-token
	// chat would fill).
	BlocksPerPod int `json:"blocks_per_pod,omitempty"`
	// Burst is an overload phase on top of the workload (nil: none).
	Burst  *Burst  `json:"burst,omitempty"`
	Faults []Fault `json:"faults"`
}

// Fault is one scheduled fault. For undoes it after that long (restart,
// resume, heal, clear); without For a kill stays, a partition stays, and so
// on to the end of the run.
type Fault struct {
	At    Duration `json:"at"`
	Fault string   `json:"fault"`
	// Pod is a 1-based pod number, "random" (a pod no other fault holds)
	// or "all" (gossip and event faults only).
	Pod PodRef   `json:"pod"`
	For Duration `json:"for,omitempty"`
	// MS is gossip-delay's delay, Percent gossip-loss's loss, Rate
	// drop-events' fraction of KV-event batches dropped.
	MS      int     `json:"ms,omitempty"`
	Percent float64 `json:"percent,omitempty"`
	Rate    float64 `json:"rate,omitempty"`
}

// Fault names.
const (
	FaultKillPod        = "kill-pod"        // SIGKILL sim and sidecar; For: restart in place, empty
	FaultReplacePod     = "replace-pod"     // kill; after For, a new pod (new name, address, empty cache)
	FaultKillEngine     = "kill-engine"     // SIGKILL the sim; For: restart it empty, sequence from 0
	FaultHangEngine     = "hang-engine"     // SIGSTOP the sim; For: SIGCONT
	FaultKillSidecar    = "kill-sidecar"    // SIGKILL the sidecar; For: restart it
	FaultRestartSidecar = "restart-sidecar" // SIGTERM the sidecar (it leaves the mesh), start it again after For
	FaultPartition      = "partition"       // cut from the other pods, the Service still reaches it; For: heal
	FaultGossipDelay    = "gossip-delay"    // delay gossip by MS; For: clear
	FaultGossipLoss     = "gossip-loss"     // drop Percent of gossip packets; For: clear
	FaultDropEvents     = "drop-events"     // the sim drops Rate of its live KV-event batches; For: clear
	FaultRollingRestart = "rolling-restart" // every pod in turn: unready, /drain, stop, new pod, ready
	FaultUpgradeSidecar = "upgrade-sidecar" // unready, /drain, stop the sidecar, start this tree's beside the same engine, ready
)

// FaultNames lists every fault a scenario may name.
var FaultNames = []string{FaultKillPod, FaultReplacePod, FaultKillEngine, FaultHangEngine, FaultKillSidecar,
	FaultRestartSidecar, FaultPartition, FaultGossipDelay, FaultGossipLoss, FaultDropEvents, FaultRollingRestart,
	FaultUpgradeSidecar}

// needsNetns are the faults only network namespaces can inject.
func needsNetns(name string) bool {
	return name == FaultPartition || name == FaultGossipDelay || name == FaultGossipLoss
}

// podFault: faults that break one pod (detection is measured for them).
func podFault(name string) bool {
	switch name {
	case FaultKillPod, FaultReplacePod, FaultKillEngine, FaultHangEngine, FaultKillSidecar, FaultRestartSidecar,
		FaultPartition, FaultUpgradeSidecar:
		return true
	}
	return false
}

// PodRef is a fault's target: a pod number, random or all.
type PodRef struct {
	N      int // 1-based; 0 with Random or All
	Random bool
	All    bool
}

func (p PodRef) String() string {
	switch {
	case p.Random:
		return "random"
	case p.All:
		return "all"
	case p.N == 0:
		return "-"
	}
	return strconv.Itoa(p.N)
}

// MarshalJSON writes a number, "random" or "all".
func (p PodRef) MarshalJSON() ([]byte, error) {
	if p.Random || p.All {
		return json.Marshal(p.String())
	}
	return json.Marshal(p.N)
}

// UnmarshalJSON accepts a number, "random", "all", or a number in a string.
func (p *PodRef) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		*p = PodRef{N: n}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("pod: want a number, \"random\" or \"all\", got %s", b)
	}
	switch s {
	case "random":
		*p = PodRef{Random: true}
	case "all":
		*p = PodRef{All: true}
	default:
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("pod: want a number, \"random\" or \"all\", got %q", s)
		}
		*p = PodRef{N: n}
	}
	return nil
}

// Duration is a time.Duration as a JSON string ("20s", "1m30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"20s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// ParseScenario decodes a scenario file strictly (unknown fields are
// errors: a misspelt "for" must not silently leave a pod dead) and
// validates it against the defaults it will run with.
func ParseScenario(b []byte) (Scenario, error) {
	var s Scenario
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("scenario: %w", err)
	}
	if dec.More() {
		return s, fmt.Errorf("scenario: trailing data after the object")
	}
	return s, nil
}

// Validate checks s for a cluster of pods pods running for d (the
// scenario's own values win when set).
func (s Scenario) Validate(pods int, d time.Duration) error {
	if s.Pods > 0 {
		pods = s.Pods
	}
	if s.Duration > 0 {
		d = s.Duration.D()
	}
	if pods < 1 || pods > 200 {
		return fmt.Errorf("scenario: pods %d not in 1..200", pods)
	}
	if d <= 0 {
		return fmt.Errorf("scenario: duration must be positive")
	}
	if s.Rate < 0 {
		return fmt.Errorf("scenario: rate %v is negative", s.Rate)
	}
	if s.BlocksPerPod < 0 {
		return fmt.Errorf("scenario: blocks_per_pod %d is negative", s.BlocksPerPod)
	}
	if s.Burst != nil {
		if err := s.Burst.validate(d); err != nil {
			return err
		}
	}
	if s.SidecarFrom != "" && !commitRef.MatchString(s.SidecarFrom) {
		return fmt.Errorf("scenario: sidecar_from %q is not a commit hash (7 to 40 lower-case hex digits)", s.SidecarFrom)
	}
	for k, f := range s.Faults {
		where := fmt.Sprintf("scenario: fault %d (%s at %v)", k+1, f.Fault, f.At.D())
		switch {
		case !slices.Contains(FaultNames, f.Fault):
			return fmt.Errorf("%s: unknown fault; want one of %s", where, strings.Join(FaultNames, ", "))
		case f.At < 0 || f.At.D() >= d:
			return fmt.Errorf("%s: at must be in [0, duration %v)", where, d)
		case f.For < 0:
			return fmt.Errorf("%s: for must not be negative", where)
		case f.Fault == FaultRollingRestart && (f.Pod != PodRef{}):
			return fmt.Errorf("%s: a rolling restart takes every pod; leave pod out", where)
		case f.Fault != FaultRollingRestart && f.Pod == PodRef{}:
			return fmt.Errorf("%s: pod is required (1..%d, \"random\" or \"all\")", where, pods)
		case f.Pod.N < 0 || f.Pod.N > pods:
			return fmt.Errorf("%s: pod %d not in 1..%d", where, f.Pod.N, pods)
		case f.Pod.All && podFault(f.Fault):
			return fmt.Errorf("%s: pod \"all\" only for gossip and event faults", where)
		case f.Fault == FaultGossipDelay && (f.MS <= 0 || f.MS > 60000):
			return fmt.Errorf("%s: ms must be in 1..60000", where)
		case f.Fault == FaultGossipLoss && (f.Percent <= 0 || f.Percent > 100):
			return fmt.Errorf("%s: percent must be in (0, 100]", where)
		case f.Fault == FaultDropEvents && (f.Rate <= 0 || f.Rate > 1):
			return fmt.Errorf("%s: rate must be in (0, 1]", where)
		}
	}
	return nil
}

// NeedsNetns reports whether any fault of s needs netns mode.
func (s Scenario) NeedsNetns() bool {
	return slices.ContainsFunc(s.Faults, func(f Fault) bool { return needsNetns(f.Fault) })
}
