package main

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/vllmclient"
)

// modelLister is the local vLLM as the watcher needs it; *vllmclient.Client
// satisfies it.
type modelLister interface {
	Models(ctx context.Context) ([]vllmclient.Model, error)
}

// modelSetter is where the served models are advertised; *gossip.Mesh
// satisfies it.
type modelSetter interface {
	SetModels(models []string)
}

// modelWatcher keeps the advertised model list equal to what the local
// vLLM serves: its base model, the other names it is served under, and
// every LoRA adapter, whether from --lora-modules or loaded at run time.
// Peers route a request for an adapter only to pods that list it (route's
// eligibility), so a list that lags costs that adapter its routing.
type modelWatcher struct {
	bases  atomic.Pointer[[]string] // the base model's served names; nil until read
	vllm   modelLister
	mesh   modelSetter
	base   string
	every  time.Duration
	kick   chan struct{}
	errors prometheus.Counter
	log    zerolog.Logger
}

func newModelWatcher(vllm modelLister, mesh modelSetter, base string, every time.Duration, reg prometheus.Registerer, log zerolog.Logger) *modelWatcher {
	w := &modelWatcher{vllm: vllm, mesh: mesh, base: base, every: every, kick: make(chan struct{}, 1), log: log,
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "vllm_models_errors_total",
			Help: "Failed reads of the local vLLM's /v1/models; the last list read stays advertised."})}
	reg.MustRegister(w.errors)
	return w
}

// retryAfterError is how soon a failed read is retried: the engine is
// probably restarting, and a restarted vLLM has lost the adapters loaded at
// run time, so its new list should be advertised as soon as it answers.
const retryAfterError = 500 * time.Millisecond

// run refreshes at once, then every interval (sooner after a failure) and
// whenever Kick is called; it exits when ctx is done.
func (w *modelWatcher) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
			t.Stop()
		}
		wait := w.every
		if !w.refresh(ctx) {
			wait = min(wait, retryAfterError)
		}
		t.Reset(wait)
	}
}

// Kick asks for a refresh now; it never blocks.
func (w *modelWatcher) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// refresh reads /v1/models and advertises it; false when the read failed.
func (w *modelWatcher) refresh(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, w.every)
	ms, err := w.vllm.Models(cctx)
	cancel()
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			w.errors.Inc()
			w.log.Debug().Err(err).Msg("local vLLM /v1/models failed; keeping the advertised models")
		}
		return false
	}
	var bases []string
	for _, m := range ms {
		if m.Parent == "" {
			bases = append(bases, m.ID)
		}
	}
	w.bases.Store(&bases)
	w.mesh.SetModels(advertised(w.base, ms))
	return true
}

// IsAdapter reports whether model, a name other than the configured base
// model, is a LoRA adapter rather than another name vLLM serves the base
// model under; until /v1/models has been read, every other name is taken
// for an adapter. It is safe for concurrent use.
func (w *modelWatcher) IsAdapter(model string) bool {
	b := w.bases.Load()
	return b == nil || !slices.Contains(*b, model)
}

// advertised orders what vLLM lists for the node meta, which may truncate
// the tail: the configured base model first (block keys are seeded with
// it, and every peer serves it), its other served names next, adapters
// last, each once.
func advertised(base string, ms []vllmclient.Model) []string {
	out := []string{base}
	for _, adapters := range []bool{false, true} {
		for _, m := range ms {
			if (m.Parent != "") == adapters && !slices.Contains(out, m.ID) {
				out = append(out, m.ID)
			}
		}
	}
	return out
}

// adapterPaths are vLLM's runtime LoRA endpoints
// (VLLM_ALLOW_RUNTIME_LORA_UPDATING); a success changes /v1/models.
var adapterPaths = []string{"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}

// watch wraps the handler that passes requests through to the local vLLM:
// after it proxies a successful adapter load or unload, the watcher
// refreshes at once, so peers learn of it within a meta update rather than
// at the next periodic refresh.
func (w *modelWatcher) watch(next gin.HandlerFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		next(c)
		if c.Request.Method == http.MethodPost && c.Writer.Status() == http.StatusOK &&
			slices.Contains(adapterPaths, c.Request.URL.Path) {
			w.Kick()
		}
	}
}

// discoverModel asks the local vLLM which base model it serves, waiting for
// it to come up (a model can take minutes to load).
func discoverModel(ctx context.Context, base string, log zerolog.Logger) (string, error) {
	vc := vllmclient.New(vllmclient.ClientConfig{BaseURL: base})
	for {
		m, err := baseModel(ctx, vc)
		if err == nil {
			return m, nil
		}
		log.Info().Err(err).Msg("waiting for the local vLLM to list its model (or pass --model)")
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// baseModel is the first model vLLM lists that is not an adapter.
func baseModel(ctx context.Context, vllm modelLister) (string, error) {
	ms, err := vllm.Models(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Parent == "" {
			return m.ID, nil
		}
	}
	return "", errors.New("/v1/models lists no base model")
}

// promptTokenizer is what forward tokenizes with; the sidecar's vLLM
// client adapter (tokenizer) satisfies it.
type promptTokenizer interface {
	Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error)
}

// adapterFallback tokenizes a request for an adapter that the local vLLM
// does not serve (its /tokenize answers 404: "The model ... does not
// exist") as the base model's. LoRA adapters share the base model's
// tokenizer and chat template unless they ship their own, and the request
// will be served by a pod that has the adapter: its keys must still find
// that pod's blocks, or it is routed by load alone.
type adapterFallback struct{ next promptTokenizer }

func (a adapterFallback) Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error) {
	ids, err := a.next.Tokenize(ctx, p)
	var he *vllmclient.HTTPError
	if p.Model == "" || !errors.As(err, &he) || he.Status != http.StatusNotFound {
		return ids, err
	}
	p.Model = "" // vLLM's base model
	return a.next.Tokenize(ctx, p)
}
