package main

import (
	"io"
	"testing"
)

// envOf is a getenv with one variable set.
func envOf(name, v string, set bool) func(string) (string, bool) {
	return func(k string) (string, bool) {
		if k == name {
			return v, set
		}
		return "", false
	}
}

func TestParseRuntimeLoRAEnv(t *testing.T) {
	for _, tt := range []struct {
		v    string
		set  bool
		want bool
	}{{"", false, false}, {"1", true, true}, {"True", true, true}, {" true ", true, true}, {"0", true, false}, {"yes", true, false}} {
		o, err := parseFlags(nil, envOf("VLLM_ALLOW_RUNTIME_LORA_UPDATING", tt.v, tt.set), io.Discard, io.Discard)
		if err != nil || o.RuntimeLoRA != tt.want {
			t.Errorf("VLLM_ALLOW_RUNTIME_LORA_UPDATING=%q: RuntimeLoRA = %v, %v; want %v", tt.v, o.RuntimeLoRA, err, tt.want)
		}
	}
}

// The render endpoints are on with --enable-scale-out or
// VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1, the store with
// VLLM_ENABLE_RESPONSES_API_STORE=1; vLLM reads both variables as
// integers and fails to start on anything else.
func TestParseScaleOutAndStoreEnv(t *testing.T) {
	for _, tt := range []struct {
		args         []string
		env, v       string
		set          bool
		scale, store bool
		err          bool
	}{
		{nil, "", "", false, false, false, false},
		{[]string{"--enable-scale-out"}, "", "", false, true, false, false},
		{nil, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "1", true, true, false, false},
		{nil, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "0", true, false, false, false},
		{[]string{"--enable-scale-out"}, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "0", true, true, false, false},
		{nil, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "yes", true, false, false, true},
		{nil, "VLLM_ENABLE_RESPONSES_API_STORE", "1", true, false, true, false},
		{nil, "VLLM_ENABLE_RESPONSES_API_STORE", " 0 ", true, false, false, false},
		{nil, "VLLM_ENABLE_RESPONSES_API_STORE", "true", true, false, false, true},
	} {
		o, err := parseFlags(tt.args, envOf(tt.env, tt.v, tt.set), io.Discard, io.Discard)
		if (err != nil) != tt.err || err == nil && (o.ScaleOut != tt.scale || o.ResponsesStore != tt.store) {
			t.Errorf("%v %s=%q: ScaleOut %v ResponsesStore %v err %v; want %v %v err %v", tt.args, tt.env, tt.v, o.ScaleOut, o.ResponsesStore, err, tt.scale, tt.store, tt.err)
		}
	}
	if _, err := parseFlags([]string{"--sim-responses-store-limit", "0"}, noEnv, io.Discard, io.Discard); err == nil {
		t.Error("--sim-responses-store-limit 0: no error")
	}
	o, err := parseFlags(nil, noEnv, io.Discard, io.Discard)
	if c := serverConfig(o, 100, nil); err != nil || c.StoreLimit != 10000 || c.ScaleOut || c.ResponsesStore || c.MaxModelLen != 100 {
		t.Errorf("serverConfig(defaults) = %+v, %v", c, err)
	}
}
