//go:build integration

package simhttp

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConcurrentStreams holds 500 streaming requests open at once against
// the in-process server and requires every one to finish with [DONE].
func TestConcurrentStreams(t *testing.T) {
	const n, maxTokens = 500, 32
	cfg := testEngineConfig()
	cfg.NumGPUBlocks = 8192
	cfg.MaxModelLen = 4096
	env := newTestEnv(t, cfg, nil)
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Ten shared system prompts, so the cache sees hits as in a real mix.
			body := fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`,
				strings.Repeat(fmt.Sprintf("system prompt %d. ", i%10), 30), i, maxTokens)
			req, _ := http.NewRequestWithContext(ctx, "POST", env.url+"/v1/chat/completions", strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("request %d: status %d", i, resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			var last, usage string
			for sc.Scan() {
				if l := sc.Text(); l != "" {
					if strings.Contains(l, `"usage"`) {
						usage = l
					}
					last = l
				}
			}
			if last != "data: [DONE]" || !strings.Contains(usage, fmt.Sprintf(`"completion_tokens":%d`, maxTokens)) {
				errs <- fmt.Errorf("request %d: last %q usage %q err %v", i, last, usage, sc.Err())
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	close(errs)
	failed := 0
	for err := range errs {
		if failed < 5 {
			t.Error(err)
		}
		failed++
	}
	if failed > 0 {
		t.Fatalf("%d of %d streams failed", failed, n)
	}
	st := env.eng.Stats()
	t.Logf("%d concurrent streams x %d tokens: wall %v, %.0f req/s, %.0f streamed tokens/s; prefix hits %d of %d queried tokens",
		n, maxTokens, wall.Round(time.Millisecond), n/wall.Seconds(), float64(n*maxTokens)/wall.Seconds(), st.PrefixHitsTokens, st.PrefixQueriesTokens)
}
