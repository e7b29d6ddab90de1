package main

import (
	"io"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/forward"
	"github.com/kvroute/kvroute/route"
)

func TestParseServeEnvTwins(t *testing.T) {
	env := map[string]string{
		"KVROUTE_VLLM_URL":        "http://127.0.0.1:9999",
		"KVROUTE_KV_EVENTS_BIND":  "true",
		"KVROUTE_JOIN":            "a:7946, b:7946",
		"KVROUTE_LISTEN":          ":7000", // overridden by the flag below
		"KVROUTE_LOAD_PUSH_DELAY": "0s",
		"KVROUTE_MAX_QUEUE":       "12",
		"KVROUTE_MAX_QUEUE_WAIT":  "3s",
		"KVROUTE_BODY_TIMEOUT":    "0s",
		"KVROUTE_WRITE_TIMEOUT":   "20s",
		"KVROUTE_CPU_LOAD_RATE":   "250000",
		"KVROUTE_DISK_LOAD_RATE":  "0",
		"POD_NAME":                "pod-1",
		"POD_IP":                  "10.0.0.7",
	}
	c, err := parseServe([]string{"--listen", ":8080"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.VLLMURL != "http://127.0.0.1:9999" || !c.EventsBind || c.Listen != ":8080" ||
		c.NodeName != "pod-1" || c.AdvertiseAddr != "10.0.0.7" || len(c.Join) != 2 || c.Join[1] != "b:7946" || c.LoadPushDelay != 0 ||
		c.MaxQueue != 12 || c.MaxQueueWait != 3*time.Second || c.BodyTimeout != 0 || c.WriteTimeout != 20*time.Second ||
		c.CPULoadRate != 250000 || c.DiskLoadRate != 0 {
		t.Errorf("parseServe = %+v", c)
	}
}

func TestParseServeErrors(t *testing.T) {
	none := func(string) string { return "" }
	for _, args := range [][]string{
		{"--block-size", "0"},
		{"--digest-fp-rate", "1.5"},
		{"--load-push-delay", "-1ms"},
		{"--load-push-interval", "0"},
		{"--claim-push-interval", "-1ms"},
		{"--serve-retry", "-1"},
		{"--max-queue", "-1"},
		{"--max-queue-wait", "-1s"},
		{"--max-prefill-share", "1.5"},
		{"--max-prefill-share", "-0.1"},
		{"--max-prefill-share", "NaN"},
		{"--body-timeout", "-1s"},
		{"--write-timeout", "-1s"},
		{"--cpu-load-rate", "-1"},
		{"--disk-load-rate", "-1"},
		{"--kv-events-dp-ranks", "0"},
		{"--kv-events-dp-ranks", "257"},
		{"--tier-stride", "3"},
		{"--tier-stride", "0"},
		{"--route-kv-weight", "-1"},
		{"--route-kv-weight", "NaN"},
		{"--route-idle-slack", "-0.5"},
		{"--route-idle-headroom", "-1"},
		{"--nope"},
		{"extra"},
	} {
		if _, err := parseServe(args, none, io.Discard, io.Discard); err == nil {
			t.Errorf("parseServe(%q) succeeded; want error", args)
		}
	}
	bad := func(k string) string {
		if k == "KVROUTE_GOSSIP_PORT" {
			return "x"
		}
		return ""
	}
	if _, err := parseServe(nil, bad, io.Discard, io.Discard); err == nil {
		t.Error("parseServe with KVROUTE_GOSSIP_PORT=x succeeded; want error")
	}
}

func TestSetProcs(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	for _, tc := range []struct {
		procs int
		env   string
		start int
		want  int
	}{
		{procs: 1, start: 3, want: 1},
		{procs: 2, start: 1, want: 2},
		{procs: 0, start: 3, want: 3},           // 0 keeps what Go chose
		{procs: 1, env: "3", start: 3, want: 3}, // GOMAXPROCS wins
	} {
		runtime.GOMAXPROCS(tc.start)
		if got := setProcs(tc.procs, tc.env); got != tc.want || runtime.GOMAXPROCS(0) != tc.want {
			t.Errorf("setProcs(%d, %q) from %d = %d (runtime %d); want %d", tc.procs, tc.env, tc.start, got, runtime.GOMAXPROCS(0), tc.want)
		}
	}
}

// TestOverloadDefaults checks the overload flags' defaults are the front's
// documented ones, so the flag help and forward.Config cannot drift.
func TestOverloadDefaults(t *testing.T) {
	c, err := parseServe(nil, func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d := forward.DefaultConfig()
	if c.MaxQueue != d.MaxQueue || c.MaxQueueWait != d.MaxQueueWait || c.BodyTimeout != d.BodyTimeout || c.WriteTimeout != d.WriteTimeout ||
		c.MaxPrefillShare != d.MaxPrefillShare || !(c.MaxPrefillShare > 0 && c.MaxPrefillShare < 1) ||
		c.MaxQueue <= 0 || c.MaxQueueWait <= 0 || c.BodyTimeout <= 0 || c.WriteTimeout <= 0 {
		t.Errorf("defaults: max-queue %d, max-queue-wait %v, body-timeout %v, write-timeout %v; want forward.DefaultConfig's %+v, all on",
			c.MaxQueue, c.MaxQueueWait, c.BodyTimeout, c.WriteTimeout, d)
	}
}

// TestTierRateDefaults: the load-rate flags default to route's rates, so
// the flag help and route.Config cannot drift.
func TestTierRateDefaults(t *testing.T) {
	c, err := parseServe(nil, func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d := route.DefaultConfig()
	if c.CPULoadRate != d.CPULoadTokensPerSecond || c.DiskLoadRate != d.DiskLoadTokensPerSecond || c.CPULoadRate <= 0 {
		t.Errorf("--cpu-load-rate %v, --disk-load-rate %v; want route.DefaultConfig's %v, %v",
			c.CPULoadRate, c.DiskLoadRate, d.CPULoadTokensPerSecond, d.DiskLoadTokensPerSecond)
	}
}

func TestEngineAdvertise(t *testing.T) {
	for _, tc := range []struct{ flag, vllm, advertise, want string }{
		{"", "http://127.0.0.1:8001", "10.0.0.5", "10.0.0.5:8001"},
		{"", "http://localhost:8001", "10.0.0.5", "10.0.0.5:8001"},
		{"", "http://[::1]:8001", "fd00::5", "[fd00::5]:8001"},
		{"", "http://127.0.0.1:8001", "", ""}, // nothing peers could use
		{"", "http://vllm.local:9000", "10.0.0.5", "vllm.local:9000"},
		{"", "http://10.0.0.9", "10.0.0.5", "10.0.0.9:80"},
		{"", "https://127.0.0.1:8443", "10.0.0.5", ""},
		{"", "https://vllm.local", "10.0.0.5", ""}, // peers ask over plain HTTP
		{"none", "http://127.0.0.1:8001", "10.0.0.5", ""},
		{"10.0.0.5:18001", "http://127.0.0.1:8001", "10.0.0.5", "10.0.0.5:18001"},
	} {
		u, err := url.Parse(tc.vllm)
		if err != nil {
			t.Fatal(err)
		}
		if got := engineAdvertise(tc.flag, u, tc.advertise); got != tc.want {
			t.Errorf("engineAdvertise(%q, %s, %q) = %q; want %q", tc.flag, tc.vllm, tc.advertise, got, tc.want)
		}
	}
}
