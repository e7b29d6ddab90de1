package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/vllmclient"
)

func TestAdvertised(t *testing.T) {
	tests := []struct {
		name string
		base string
		ms   []vllmclient.Model
		want []string
	}{
		{"base only", "m", []vllmclient.Model{{ID: "m"}}, []string{"m"}},
		{"adapters after every base name", "m",
			[]vllmclient.Model{{ID: "m"}, {ID: "alice", Parent: "m"}, {ID: "alias"}, {ID: "bob", Parent: "m"}},
			[]string{"m", "alias", "alice", "bob"}},
		{"configured base first even when listed later", "m",
			[]vllmclient.Model{{ID: "alias"}, {ID: "m"}}, []string{"m", "alias"}},
		{"configured base not listed", "m", []vllmclient.Model{{ID: "other"}}, []string{"m", "other"}},
		{"duplicates once", "m", []vllmclient.Model{{ID: "m"}, {ID: "a", Parent: "m"}, {ID: "a", Parent: "m"}}, []string{"m", "a"}},
		{"nothing listed", "m", nil, []string{"m"}},
	}
	for _, tt := range tests {
		if got := advertised(tt.base, tt.ms); !slices.Equal(got, tt.want) {
			t.Errorf("%s: advertised = %v; want %v", tt.name, got, tt.want)
		}
	}
}

type fakeModels struct {
	mu    sync.Mutex
	list  []vllmclient.Model
	err   error
	calls int
}

func (f *fakeModels) Models(context.Context) ([]vllmclient.Model, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return slices.Clone(f.list), f.err
}

func (f *fakeModels) set(list []vllmclient.Model, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.err = list, err
}

type fakeMesh struct {
	mu     sync.Mutex
	models []string
	sets   chan []string
}

func (f *fakeMesh) SetModels(ms []string) {
	f.mu.Lock()
	f.models = slices.Clone(ms)
	f.mu.Unlock()
	f.sets <- slices.Clone(ms)
}

func next(t *testing.T, sets chan []string) []string {
	t.Helper()
	select {
	case ms := <-sets:
		return ms
	case <-time.After(5 * time.Second):
		t.Fatal("no SetModels within 5s")
		return nil
	}
}

// The watcher advertises at start, keeps the last list when vLLM fails
// (counting the failure) and retries soon, and refreshes at once on Kick
// even with an hour between periodic refreshes.
func TestModelWatcher(t *testing.T) {
	vllm := &fakeModels{list: []vllmclient.Model{{ID: "m"}, {ID: "alice", Parent: "m"}}}
	mesh := &fakeMesh{sets: make(chan []string, 8)}
	reg := prometheus.NewRegistry()
	w := newModelWatcher(vllm, mesh, "m", time.Hour, reg, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	if !w.IsAdapter("alias") {
		t.Error("IsAdapter(alias) before /v1/models was read = false; want true (every other name)")
	}
	if got := next(t, mesh.sets); !slices.Equal(got, []string{"m", "alice"}) {
		t.Errorf("first advertisement = %v; want [m alice]", got)
	}
	vllm.set(nil, errors.New("connection refused"))
	w.Kick()
	deadline := time.Now().Add(5 * time.Second)
	for counterValue(w.errors) < 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := counterValue(w.errors); n < 1 {
		t.Fatalf("errors = %v after a failed refresh; want >= 1", n)
	}
	// A failed read is retried soon, not an interval (an hour) later: the
	// restarted engine's list is advertised without a Kick.
	vllm.set([]vllmclient.Model{{ID: "m"}}, nil)
	if got := next(t, mesh.sets); !slices.Equal(got, []string{"m"}) {
		t.Errorf("after the engine answered again = %v; want [m]", got)
	}
	vllm.set([]vllmclient.Model{{ID: "m"}, {ID: "alias"}, {ID: "alice", Parent: "m"}, {ID: "bob", Parent: "m"}}, nil)
	w.Kick()
	if got := next(t, mesh.sets); !slices.Equal(got, []string{"m", "alias", "alice", "bob"}) {
		t.Errorf("after kick = %v; want [m alias alice bob]", got)
	}
	for name, want := range map[string]bool{"alias": false, "alice": true, "bob": true, "unknown": true} {
		if got := w.IsAdapter(name); got != want {
			t.Errorf("IsAdapter(%s) = %v; want %v", name, got, want)
		}
	}
	select {
	case ms := <-mesh.sets:
		t.Errorf("unexpected SetModels(%v): nothing changed", ms)
	default:
	}
}

// Only a successful POST to vLLM's adapter endpoints kicks the watcher.
func TestWatchKicksOnAdapterChange(t *testing.T) {
	w := &modelWatcher{kick: make(chan struct{}, 1)}
	status := http.StatusOK
	h := w.watch(func(c *gin.Context) { c.Status(status) })
	tests := []struct {
		method, path string
		status       int
		kick         bool
	}{
		{"POST", "/v1/load_lora_adapter", 200, true},
		{"POST", "/v1/unload_lora_adapter", 200, true},
		{"POST", "/v1/load_lora_adapter", 400, false},
		{"POST", "/v1/unload_lora_adapter", 404, false},
		{"GET", "/v1/load_lora_adapter", 200, false},
		{"POST", "/v1/models", 200, false},
		{"POST", "/v1/load_lora_adapter/x", 200, false},
	}
	for _, tt := range tests {
		status = tt.status
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest(tt.method, tt.path, nil)
		h(c)
		var kicked bool
		select {
		case <-w.kick:
			kicked = true
		default:
		}
		if kicked != tt.kick {
			t.Errorf("%s %s -> %d: kicked %v; want %v", tt.method, tt.path, tt.status, kicked, tt.kick)
		}
	}
}

func TestBaseModel(t *testing.T) {
	vllm := &fakeModels{list: []vllmclient.Model{{ID: "alice", Parent: "m"}, {ID: "m"}}}
	if got, err := baseModel(context.Background(), vllm); got != "m" || err != nil {
		t.Errorf("baseModel = %q, %v; want m", got, err)
	}
	vllm.set([]vllmclient.Model{{ID: "alice", Parent: "m"}}, nil)
	if _, err := baseModel(context.Background(), vllm); err == nil {
		t.Error("baseModel with only adapters: no error")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

type fakeTokenizer struct{ models []string }

func (f *fakeTokenizer) Tokenize(_ context.Context, p prompt.Prompt) ([]uint32, error) {
	f.models = append(f.models, p.Model)
	switch p.Model {
	case "", "m", "alice":
		return []uint32{uint32(len(p.Text))}, nil
	case "broken":
		return nil, &vllmclient.HTTPError{Status: http.StatusInternalServerError}
	}
	return nil, &vllmclient.HTTPError{Status: http.StatusNotFound, Body: "The model does not exist."}
}

// A request for an adapter the local vLLM does not serve is tokenized as
// the base model's; other failures are not retried.
func TestAdapterFallbackTokenizes(t *testing.T) {
	tests := []struct {
		model   string
		wantErr bool
		calls   []string
	}{
		{"alice", false, []string{"alice"}},
		{"carol", false, []string{"carol", ""}},
		{"", false, []string{""}},
		{"broken", true, []string{"broken"}},
	}
	for _, tt := range tests {
		f := &fakeTokenizer{}
		ids, err := adapterFallback{f}.Tokenize(context.Background(), prompt.Prompt{Model: tt.model, Text: "abc"})
		if (err != nil) != tt.wantErr || (err == nil && !slices.Equal(ids, []uint32{3})) || !slices.Equal(f.models, tt.calls) {
			t.Errorf("Tokenize(model %q) = %v, %v after calls %q; want error %v after %q", tt.model, ids, err, f.models, tt.wantErr, tt.calls)
		}
	}
}
