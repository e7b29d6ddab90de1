package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/loadgen"
	"github.com/kvroute/kvroute/vllmsim"
)

// The scene everyone explains prefix-aware routing with: an agent's calls
// share one long system prompt. Through a plain Service they scatter over
// the pods and each new pod prefills the prompt again; through kvroute they
// meet on the pod that holds it and skip the prefill. The calls speak the
// APIs agents use, in turn: OpenAI chat, Anthropic Messages and OpenAI
// Responses. vLLM renders all three as the same chat, so a prefix one API
// cached is a hit for the others.
var storyKinds = []loadgen.Kind{loadgen.Chat, loadgen.Messages, loadgen.Responses}

// storyAPI names a call's API as the scene prints it.
func storyAPI(k loadgen.Kind) string {
	switch k {
	case loadgen.Messages:
		return "Anthropic Messages"
	case loadgen.Responses:
		return "OpenAI Responses"
	}
	return "OpenAI chat"
}

const (
	storyPods         = 3
	storyRequests     = 5
	storySystemTokens = 2048
	// storyGap spaces the calls as an agent's would be, a quarter second
	// apart, rather than as one burst.
	storyGap = 250 * time.Millisecond
)

// storyRound is one pass of the scene.
type storyRound struct {
	title string
	eps   []loadgen.Endpoint
	// system is the round's prompt; each round has its own, so the second
	// cannot hit blocks the first left in a pod's cache.
	system string
}

// storyResult is one call as printed.
type storyResult struct {
	api             string
	entered, served string
	cached, prompt  int
	ttft            time.Duration
}

// playStory starts a 3-pod cluster with sidecars, sends the scene's calls
// through the plain Service and then through kvroute, prints one line per
// call to out and returns the calls of both rounds.
func playStory(ctx context.Context, o options, out, progress io.Writer) ([2][]storyResult, error) {
	var all [2][]storyResult
	dir, err := clusterDir(o, "story")
	if err != nil {
		return all, err
	}
	cfg := chaos.LocalConfig()
	cfg.Pods, cfg.Dir, cfg.BinDir, cfg.Model, cfg.Subnet = storyPods, dir, o.BinDir, model, o.Subnet
	cfg.Sidecars = true
	cfg.Sim.NumGPUBlocks, cfg.Sim.BlockSize = o.BlocksPerPod, blockSize
	cfg.StopGrace = 2 * time.Second
	cfg.Progress = progress
	c, err := chaos.Start(ctx, cfg)
	if err != nil {
		return all, fmt.Errorf("story: start cluster: %w", err)
	}
	defer c.Stop()

	var plain, routed []loadgen.Endpoint
	for _, p := range c.Pods() {
		plain = append(plain, loadgen.Endpoint{URL: p.SimURL, Pod: p.Name})
		routed = append(routed, loadgen.Endpoint{URL: "http://" + p.API, Pod: p.Name})
	}
	rounds := []storyRound{
		{"through the plain Service (a random pod per request)", plain, systemPrompt("billing", storySystemTokens)},
		{"through kvroute (the same random pod, then its sidecar routes)", routed, systemPrompt("travel", storySystemTokens)},
	}
	fmt.Fprintf(out, "\n== The scene: %d requests share one %d-token system prompt, %d pods\n", storyRequests, storySystemTokens, storyPods)
	client := loadgen.NewClient(nil, model)
	rng := rand.New(rand.NewPCG(o.Seed, 0x73746f7279))
	var summary []string
	for ri, r := range rounds {
		fmt.Fprintf(out, "\n  %s\n", r.title)
		var res []storyResult
		for i := range storyRequests {
			ep := r.eps[rng.IntN(len(r.eps))]
			kind := storyKinds[i%len(storyKinds)]
			user := loadgen.Message{Role: "user", Content: fmt.Sprintf("Question %d: what does section %d say about refunds?", i+1, 3+i)}
			call := loadgen.Call{Kind: kind, MaxTokens: 16, Messages: []loadgen.Message{{Role: "system", Content: r.system}, user}}
			if kind != loadgen.Chat { // the system prompt is Messages' system, Responses' instructions
				call.System, call.Messages = r.system, []loadgen.Message{user}
			}
			rep, err := client.Do(ctx, ep, call)
			if err != nil {
				return all, fmt.Errorf("story: request %d (%s) to %s: %w", i+1, storyAPI(kind), ep.Pod, err)
			}
			sr := storyResult{api: storyAPI(kind), entered: ep.Pod, served: rep.Pod, cached: rep.CachedTokens, prompt: rep.PromptTokens, ttft: rep.WallTTFT}
			res = append(res, sr)
			fmt.Fprintf(out, "    %s\n", sr.line(i+1))
			if i < storyRequests-1 {
				select {
				case <-ctx.Done():
					return all, ctx.Err()
				case <-time.After(storyGap):
				}
			}
		}
		summary = append(summary, summarise(res))
		all[ri] = res
	}
	fmt.Fprintf(out, "\n  plain Service: %s\n  kvroute:       %s\n", summary[0], summary[1])
	return all, nil
}

// line is one call: where it went, what the pod's cache saved, TTFT.
func (r storyResult) line(n int) string {
	where := r.served
	if r.entered != r.served {
		where = r.entered + " → " + r.served
	}
	return fmt.Sprintf("request %d  %-18s  %-14s cached %4d of %4d prompt tokens   TTFT %4d ms",
		n, r.api, where, r.cached, r.prompt, r.ttft.Milliseconds())
}

// summarise counts the pods a round used and the calls that prefilled the
// system prompt again (less than half of it cached).
func summarise(res []storyResult) string {
	pods := map[string]bool{}
	recomputed := 0
	var ttft time.Duration
	for _, r := range res {
		pods[r.served] = true
		if r.cached < storySystemTokens/2 {
			recomputed++
		}
		ttft += r.ttft
	}
	served := "1 pod served"
	if len(pods) != 1 {
		served = fmt.Sprintf("%d pods served", len(pods))
	}
	return fmt.Sprintf("%s, the system prompt prefilled %d of %d times, mean TTFT %d ms",
		served, recomputed, len(res), (ttft / time.Duration(len(res))).Milliseconds())
}

// systemPrompt is a deterministic agent instruction of about tokens
// tokens in the simulator's tokenizer, about topic.
func systemPrompt(topic string, tokens int) string {
	tok := vllmsim.NewTokenizer()
	var b strings.Builder
	fmt.Fprintf(&b, "You are the %s assistant of an online shop. Follow every rule below.\n", topic)
	for i := 1; len(tok.Encode(b.String(), false)) < tokens; i++ {
		fmt.Fprintf(&b, "Rule %d of the %s policy: answer politely, cite section %d, never promise what the policy does not grant, "+
			"and ask for the order number before you look at any account.\n", i, topic, i)
	}
	return b.String()
}
