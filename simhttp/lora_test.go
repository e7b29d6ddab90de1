package simhttp

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/kvevent"
)

// Without VLLM_ALLOW_RUNTIME_LORA_UPDATING vLLM registers no load/unload
// routes: FastAPI's 404.
func TestRuntimeLoRARoutesNeedTheEnvironment(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	for _, path := range []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} {
		code, b := env.do(t, "POST", path, `{"lora_name":"x","lora_path":"/x"}`)
		if code != 404 || string(b) != `{"detail":"Not Found"}` {
			t.Errorf("POST %s = %d %s; want 404 {\"detail\":\"Not Found\"}", path, code, b)
		}
	}
}

// The load and unload endpoints answer as vLLM's serving_models does, and
// /v1/models and generation follow them at once.
func TestLoadUnloadLoRA(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.RuntimeLoRA = true })
	gen := func(model string) int {
		code, _ := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":1}`, model))
		return code
	}
	if code := gen("fresh"); code != 404 {
		t.Errorf("completion for an unloaded adapter = %d; want 404", code)
	}
	steps := []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"fresh","lora_path":"/loras/f"}`, 200, `Success: LoRA adapter 'fresh' added successfully.`},
		{"/v1/load_lora_adapter", `{"lora_name":"fresh","lora_path":"/loras/f"}`, 400,
			`{"error":{"message":"The lora adapter 'fresh' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.","type":"InvalidUserInput","param":null,"code":400}}`},
		{"/v1/load_lora_adapter", `{"lora_name":"fresh","lora_path":"/loras/f2","load_inplace":true}`, 200, `Success: LoRA adapter 'fresh' added successfully.`},
		{"/v1/load_lora_adapter", `{"lora_name":"nopath"}`, 400,
			`{"error":{"message":"Both 'lora_name' and 'lora_path' must be provided.","type":"InvalidUserInput","param":null,"code":400}}`},
		{"/v1/load_lora_adapter", `[1]`, 400,
			`{"error":{"message":"invalid JSON body: expected an object","type":"BadRequestError","param":null,"code":400}}`},
		{"/v1/unload_lora_adapter", `{}`, 400,
			`{"error":{"message":"'lora_name' needs to be provided to unload a LoRA adapter.","type":"InvalidUserInput","param":null,"code":400}}`},
		{"/v1/unload_lora_adapter", `{"lora_name":"ghost"}`, 404,
			`{"error":{"message":"The lora adapter 'ghost' cannot be found.","type":"NotFoundError","param":null,"code":404}}`},
	}
	for _, s := range steps {
		code, b := env.do(t, "POST", s.path, s.body)
		if code != s.code || string(b) != s.want {
			t.Errorf("POST %s %s = %d %s; want %d %s", s.path, s.body, code, b, s.code, s.want)
		}
	}
	if got, want := modelIDs(t, env), []string{testModel, "alias", "adapter", "fresh"}; !cmp.Equal(got, want) {
		t.Errorf("/v1/models after load = %v; want %v", got, want)
	}
	if code := gen("fresh"); code != 200 {
		t.Errorf("completion for the loaded adapter = %d; want 200", code)
	}
	// A --lora-modules adapter unloads like any other.
	for _, name := range []string{"fresh", "adapter"} {
		if code, b := env.do(t, "POST", "/v1/unload_lora_adapter", fmt.Sprintf(`{"lora_name":%q}`, name)); code != 200 ||
			string(b) != fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", name) {
			t.Errorf("unload %s = %d %s", name, code, b)
		}
	}
	if got, want := modelIDs(t, env), []string{testModel, "alias"}; !cmp.Equal(got, want) {
		t.Errorf("/v1/models after unload = %v; want %v", got, want)
	}
	if code := gen("fresh"); code != 404 {
		t.Errorf("completion for an unloaded adapter = %d; want 404", code)
	}
}

func modelIDs(t *testing.T, env *testEnv) []string {
	t.Helper()
	code, b := env.do(t, "GET", "/v1/models", "")
	if code != 200 {
		t.Fatalf("/v1/models = %d", code)
	}
	var l modelList
	mustJSON(t, b, &l)
	var ids []string
	for _, c := range l.Data {
		ids = append(ids, c.ID)
	}
	return ids
}

// BlockStored of an adapter request carries the adapter's name (which
// enters the hash) and its int id, as vLLM's block pool sets them; a base
// request carries neither. A reload under the same name gets a new id.
func TestAdapterEventsCarryLoRA(t *testing.T) {
	var mu sync.Mutex
	var stored []kvevent.Event
	cfg := testEngineConfig()
	cfg.EventSink = func(_ float64, evs []kvevent.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			if e.Kind == kvevent.BlockStored {
				stored = append(stored, e)
			}
		}
	}
	env := newTestEnv(t, cfg, func(c *Config) { c.RuntimeLoRA = true })
	type tag struct {
		Name *string
		ID   *int64
	}
	run := func(model string) tag {
		t.Helper()
		mu.Lock()
		stored = nil
		mu.Unlock()
		if code, b := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, longPrompt)); code != 200 {
			t.Fatalf("%s: status %d: %s", model, code, b)
		}
		var got tag
		waitUntil(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(stored) == 0 {
				return false
			}
			got = tag{stored[0].LoRAName, stored[0].LoRAID}
			return true
		})
		return got
	}
	if got := run(testModel); got.Name != nil || got.ID != nil {
		t.Errorf("base request: lora_name %v lora_id %v; want nil, nil", got.Name, got.ID)
	}
	if got := run("adapter"); got.Name == nil || *got.Name != "adapter" || got.ID == nil || *got.ID != 1 {
		t.Errorf("static adapter: lora %+v; want name adapter, id 1", got)
	}
	env.do(t, "POST", "/v1/load_lora_adapter", `{"lora_name":"late","lora_path":"/l"}`)
	if got := run("late"); got.Name == nil || *got.Name != "late" || got.ID == nil || *got.ID != 2 {
		t.Errorf("runtime adapter: lora %+v; want name late, id 2", got)
	}
}

// waitUntil polls cond every millisecond for up to 5 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A restarted vLLM has only its --lora-modules: adapters loaded at run time
// are gone.
func TestRestartForgetsRuntimeAdapters(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.RuntimeLoRA = true })
	env.do(t, "POST", "/v1/load_lora_adapter", `{"lora_name":"late","lora_path":"/l"}`)
	if got := modelIDs(t, env); !cmp.Equal(got, []string{testModel, "alias", "adapter", "late"}) {
		t.Fatalf("/v1/models after load = %v", got)
	}
	if code, b := env.do(t, "POST", "/sim/restart", ""); code != 200 {
		t.Fatalf("restart: %d %s", code, b)
	}
	if got, want := modelIDs(t, env), []string{testModel, "alias", "adapter"}; !cmp.Equal(got, want) {
		t.Errorf("/v1/models after restart = %v; want %v", got, want)
	}
	if l, _ := env.srv.loras.find("adapter"); l.ID != 1 {
		t.Errorf("static adapter id after restart = %d; want 1", l.ID)
	}
}
