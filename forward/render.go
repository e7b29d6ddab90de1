package forward

import (
	"context"
	"sync"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
)

// Renderer is the local vLLM's render endpoints as the front needs them;
// cmd/sidecar adapts *vllmclient.Client. Render posts the client's raw
// body to path and returns each engine request it renders to (one, or
// one per prompt of a batch); present is false when the engine has no
// such endpoint (404 or 405: vLLM v0.30 without --enable-scale-out, or a
// version before the API's render).
type Renderer interface {
	Render(ctx context.Context, path string, body []byte) (out []Rendered, present bool, err error)
}

// Rendered is one engine request as render gives it.
type Rendered struct {
	Tokens []uint32
	MM     []blockkey.MM
}

// SetRenderer makes the front render prompts whose tokens only the engine
// can give exactly (images: render alone says how vLLM identifies each and
// where its placeholders are). Call before serving.
func (h *Handler) SetRenderer(r Renderer) {
	h.render = &renderer{r: r, timeout: h.cfg.TokenizeTimeout, now: h.now, absent: map[prompt.API]time.Time{}}
}

// renderer remembers which APIs the engine cannot render, so a request
// pays for a probe once per reprobe interval, not every time (llm-d probes
// once and caches the answer; a rolling engine upgrade may add the
// endpoint, hence the re-probe).
type renderer struct {
	r       Renderer
	timeout time.Duration
	now     func() time.Time

	mu     sync.Mutex
	absent map[prompt.API]time.Time // when the engine was found without the endpoint
}

// reprobe is how long an absent endpoint is believed absent.
const reprobe = time.Minute

// errAbsent is a render the engine does not offer (recently probed).
type errAbsent struct{}

func (errAbsent) Error() string { return "the engine has no render endpoint for this API" }

func (rd *renderer) render(ctx context.Context, api prompt.API, body []byte) ([]Rendered, error) {
	rd.mu.Lock()
	at, known := rd.absent[api]
	rd.mu.Unlock()
	if known && rd.now().Sub(at) < reprobe {
		return nil, errAbsent{}
	}
	ctx, cancel := context.WithTimeout(ctx, rd.timeout)
	defer cancel()
	out, present, err := rd.r.Render(ctx, renderPath(api), body)
	rd.mu.Lock()
	if present {
		delete(rd.absent, api)
	} else {
		rd.absent[api] = rd.now()
	}
	rd.mu.Unlock()
	if !present {
		return nil, errAbsent{}
	}
	return out, err
}
