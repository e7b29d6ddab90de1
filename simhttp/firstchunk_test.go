package simhttp

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A stream's first chunk (chat's role chunk, Messages' message_start)
// comes with the engine's first output, as vLLM's does: a request still
// waiting for a slot writes nothing. A sidecar ends a request's queued
// prefill at that first byte, so one written on arrival hides the queue.
func TestFirstChunkWaitsForOutput(t *testing.T) {
	for _, api := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}`},
		{"/v1/messages", `{"model":"m","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"stream":true}`},
	} {
		t.Run(api.path, func(t *testing.T) {
			cfg := testEngineConfig()
			cfg.MaxNumSeqs = 1 // the second request waits for the first
			cfg.TimeScale = 1
			env := newTestEnv(t, cfg, func(c *Config) { c.Models = []string{"m"} })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			open := func(ctx context.Context, text string, maxTokens int) *http.Response {
				body := fmt.Sprintf(api.body, text, maxTokens)
				req, _ := http.NewRequestWithContext(ctx, "POST", env.url+api.path, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("POST %s: %v %v", api.path, err, resp)
					return &http.Response{Body: http.NoBody}
				}
				return resp
			}
			actx, stopA := context.WithCancel(ctx)
			a := open(actx, "occupy the only slot", 1500)
			ar := bufio.NewReader(a.Body)
			if _, err := ar.ReadString('\n'); err != nil { // a is running
				t.Fatal(err)
			}
			// The simulator writes the headers with the first byte, so the
			// client's Do returns with it.
			got := make(chan struct{}, 1)
			go func() {
				b := open(ctx, "wait behind it", 4)
				defer b.Body.Close()
				one := make([]byte, 1)
				if _, err := b.Body.Read(one); err == nil {
					got <- struct{}{}
				}
			}()
			waitUntil(t, func() bool { return env.eng.Stats().Waiting == 1 })
			// Let a produce more output, time for b's first byte had it been written on arrival.
			for range 20 {
				if _, err := ar.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-got:
				t.Fatal("the waiting request's stream wrote before the engine scheduled it")
			default:
			}
			stopA()
			a.Body.Close()
			select {
			case <-got:
			case <-ctx.Done():
				t.Fatal("no first byte once the slot was free")
			}
		})
	}
}
