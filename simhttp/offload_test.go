package simhttp

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// TestOffloadCachedTokens: a prompt pushed out of the GPU cache into the
// CPU tier comes back as cached_tokens (vLLM counts connector loads in
// num_cached_tokens) and in vllm:external_prefix_cache_hits; without the
// tier it is recomputed.
func TestOffloadCachedTokens(t *testing.T) {
	ids := func(from, n int) string {
		b, _ := json.Marshal(func() []int {
			out := make([]int, n)
			for i := range out {
				out[i] = from + i
			}
			return out
		}())
		return string(b)
	}
	a, b := ids(1000, 100), ids(5000, 120) // b needs all 8 GPU blocks
	for _, tt := range []struct {
		name    string
		offload vllmsim.Offload
		cached  int
	}{
		{"native", vllmsim.Offload{Backend: vllmsim.OffloadNative, Blocks: 64}, 96},
		{"lmcache", vllmsim.Offload{Backend: vllmsim.OffloadLMCache, Blocks: 64}, 96},
		{"no tier", vllmsim.Offload{}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testEngineConfig()
			cfg.NumGPUBlocks, cfg.Offload = 8, tt.offload
			env := newTestEnv(t, cfg, nil)
			var cached int
			for _, p := range []string{a, b, a} {
				code, body := env.do(t, "POST", "/v1/completions", `{"prompt":`+p+`,"max_tokens":1}`)
				if code != 200 {
					t.Fatalf("status %d: %s", code, body)
				}
				var r completionResponse
				mustJSON(t, body, &r)
				cached = r.Usage.PromptTokensDetails.CachedTokens
			}
			if cached != tt.cached {
				t.Errorf("cached_tokens of the evicted prompt = %d; want %d ((100-1)/16 blocks loaded)", cached, tt.cached)
			}
			_, m := env.do(t, "GET", "/metrics", "")
			labels := `{engine="0",model_name="` + testModel + `"}`
			if want := fmt.Sprintf("vllm:external_prefix_cache_hits_total%s %d\n", labels, tt.cached); !strings.Contains(string(m), want) {
				t.Errorf("metrics lack %q", want)
			}
			if s := env.eng.Stats(); (s.CPUBlocks > 0) != (tt.offload.Backend != "") {
				t.Errorf("CPU tier holds %d blocks with offload %+v", s.CPUBlocks, tt.offload)
			}
		})
	}
}

// FuzzDPRank: the X-data-parallel-rank header is outside input; any value
// is either a rank that reads back as itself, absent (-1), or a 400.
func FuzzDPRank(f *testing.F) {
	for _, s := range []string{"", "0", "1", "-1", "01", "+2", "x", "9999999999999999999999", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c, _ := gin.CreateTestContext(httptest.NewRecorder())
		c.Request = httptest.NewRequest("POST", "/v1/completions", nil)
		c.Request.Header["X-Data-Parallel-Rank"] = []string{v}
		r, aerr := dpRank(c)
		switch {
		case aerr != nil:
			if aerr.Status != 400 || aerr.Type != "BadRequestError" {
				t.Fatalf("%q: error %+v; want a 400 BadRequestError", v, aerr)
			}
		case v == "":
			if r != -1 {
				t.Fatalf("empty header: rank %d; want -1", r)
			}
		default:
			if n, err := strconv.Atoi(v); r < 0 || err != nil || n != r {
				t.Fatalf("%q: rank %d accepted; Atoi says %d, %v", v, r, n, err)
			}
		}
	})
}
