package main

import (
	"io"
	"testing"
)

func TestParseServeEnvTwins(t *testing.T) {
	env := map[string]string{
		"KVROUTE_VLLM_URL":       "http://127.0.0.1:9999",
		"KVROUTE_KV_EVENTS_BIND": "true",
		"KVROUTE_JOIN":           "a:7946, b:7946",
		"KVROUTE_LISTEN":         ":7000", // overridden by the flag below
		"POD_NAME":               "pod-1",
		"POD_IP":                 "10.0.0.7",
	}
	c, err := parseServe([]string{"--listen", ":8080"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.VLLMURL != "http://127.0.0.1:9999" || !c.EventsBind || c.Listen != ":8080" ||
		c.NodeName != "pod-1" || c.AdvertiseAddr != "10.0.0.7" || len(c.Join) != 2 || c.Join[1] != "b:7946" {
		t.Errorf("parseServe = %+v", c)
	}
}

func TestParseServeErrors(t *testing.T) {
	none := func(string) string { return "" }
	for _, args := range [][]string{
		{"--block-size", "0"},
		{"--digest-fp-rate", "1.5"},
		{"--nope"},
		{"extra"},
	} {
		if _, err := parseServe(args, none, io.Discard); err == nil {
			t.Errorf("parseServe(%q) succeeded; want error", args)
		}
	}
	bad := func(k string) string {
		if k == "KVROUTE_GOSSIP_PORT" {
			return "x"
		}
		return ""
	}
	if _, err := parseServe(nil, bad, io.Discard); err == nil {
		t.Error("parseServe with KVROUTE_GOSSIP_PORT=x succeeded; want error")
	}
}
