//go:build integration

package baseline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

// TestCentralPreciseFollowsEvents runs the in-process proxy against three
// real simulators: the index must fill from their KV events, and a prompt
// extending a cached one must go to the pod holding it even after the
// speculative entries expired.
func TestCentralPreciseFollowsEvents(t *testing.T) {
	dir, err := os.MkdirTemp("", "bl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cfg := chaos.LocalConfig()
	cfg.Dir = dir
	cfg.Subnet = fmt.Sprintf("127.%d.250", 100+os.Getpid()%100)
	cfg.Sim.NumGPUBlocks = 2000
	cfg.Sim.TimeScale = 50
	cfg.StopGrace = 2 * time.Second
	c, err := chaos.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	pc := DefaultPreciseConfig(cfg.Model)
	pc.Recent = nil // only the events may explain the routing
	var backends []Backend
	for _, p := range c.Pods() {
		backends = append(backends, Backend{Name: p.Name, URL: p.SimURL, Events: p.Events, Replay: p.Replay, Topic: p.Topic})
	}
	p, err := New(Config{Policy: NameCentralPrecise, Model: cfg.Model, Backends: backends, Precise: pc})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	send := func(url, prompt string) string {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, cfg.Model, prompt)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get(ServedByHeader)
	}
	// Each pod k gets its own long prompt straight from a client, past the
	// proxy: only its KV events can tell the proxy where that prefix is.
	// Rendezvous alone would match all three placements with chance 1/27.
	shared := func(k int) string {
		return strings.Repeat(fmt.Sprintf("system prompt number %d of the precise router test. ", k), 30)
	}
	for k, pod := range c.Pods() {
		send(pod.SimURL, shared(k))
	}
	for k := range c.Pods() {
		// Wait for pod k's events to reach its index.
		for p.Stats()[k].IndexKeys == 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("index of pod %d never filled from events: %+v", k, p.Stats())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	for k, pod := range c.Pods() {
		for i := range 2 {
			if got := send(srv.URL, shared(k)+fmt.Sprintf(" question %d", i)); got != pod.Name {
				t.Errorf("follow-up %d of prompt %d served by %s; want %s, whose events show the prefix", i, k, got, pod.Name)
			}
		}
	}
}
