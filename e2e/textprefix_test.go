//go:build integration

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// A chat's next turn, entering the other sidecar, is routed on the first
// turn's prefix (learned at the first sidecar and shared by gossip) and
// learned from its own answer's prompt token ids, with no second
// tokenization; the client sees the ids only when it asked for them.
func TestChatPrefixLearnedFromTheAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 1, secret: true, timeScale: 1000, progress: testProgress{t},
		args: []string{"--text-prefix-from-answer=true"}}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{}
	rng := seeded(t.Name())
	sys := words(rng, 1500)
	type conv struct{ u1, a1, u2, holder string }
	convs := make([]*conv, 2)
	for i := range convs {
		c := &conv{u1: words(rng, 30), a1: words(rng, 40), u2: words(rng, 30)}
		r, err := postChat(ctx, hc, f.c.Pod(0).API, chatBody(sys, c.u1))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(r.Body, []byte(`"prompt_token_ids":null`)) {
			t.Fatalf("the client got token ids it did not ask for: %.300s", r.Body)
		}
		c.holder, convs[i] = r.ServedBy, c
	}
	metric := func(name string) float64 { return metricValue(f.metrics(t, 1), name) }
	waitFor(t, 20*time.Second, "pod 2's sidecar holds the first turns' prefixes", func(context.Context) (bool, string) {
		n := metric(`kvroute_textprefix_learned_total{result="shared"}`)
		return n >= 3, fmt.Sprintf("%v shared entries", n)
	})
	learned := func() float64 {
		return metric(`kvroute_textprefix_learned_total{result="answer"}`) + metric(`kvroute_textprefix_learned_total{result="stored"}`)
	}
	// The first follow-up teaches pod 2's sidecar how long the generation
	// prompt is (one tokenization per rendering context); the second is
	// learned from its answer alone.
	for i, c := range convs {
		calls := metric(`kvroute_textprefix_tokenize_duration_seconds_count{path="learn"}`)
		was := learned()
		r, err := postChat(ctx, hc, f.c.Pod(1).API, chatBody(sys, c.u1, c.a1, c.u2))
		if err != nil {
			t.Fatal(err)
		}
		if r.ServedBy != c.holder {
			t.Errorf("follow-up %d was served by %s (%s); want %s, which holds its prefix", i+1, r.ServedBy, r.Decision, c.holder)
		}
		waitFor(t, 20*time.Second, "pod 2's sidecar learns the follow-up", func(context.Context) (bool, string) {
			n := learned() - was
			return n >= 1, fmt.Sprintf("%v learned", n)
		})
		if d := metric(`kvroute_textprefix_tokenize_duration_seconds_count{path="learn"}`) - calls; i == 1 && d != 0 {
			t.Errorf("%v tokenize calls to learn the second follow-up; want 0", d)
		}
	}
	if got := metric(`kvroute_textprefix_learned_total{result="answer"}`); got < 1 {
		t.Errorf("%v entries learned from an answer; want at least 1", got)
	}
	if got := metric(`kvroute_textprefix_requests_total{path="prefix"}`); got != 2 {
		t.Errorf("pod 2 routed %v requests on a prefix; want 2", got)
	}
	if right, wrong := metric(`kvroute_textprefix_guesses_total{result="right"}`), metric(`kvroute_textprefix_guesses_total{result="wrong"}`); right != 2 || wrong != 0 {
		t.Errorf("guesses right %v wrong %v; want 2 and 0", right, wrong)
	}

	// A client that asks gets the ids.
	asked := bytes.Replace(chatBody(sys, words(rng, 20)), []byte(`{`), []byte(`{"return_token_ids":true,`), 1)
	r3, err := postChat(ctx, hc, f.c.Pod(1).API, asked)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(r3.Body, []byte(`"prompt_token_ids":[`)) {
		t.Errorf("a client that asked for token ids got none: %.300s", r3.Body)
	}
}

// A conversation whose turns alternate between the two sidecars (the
// default learning mode): every follow-up is routed to the pod that holds
// its prefix and hits it there, each turn is learned by tokenizing only
// its new messages (after the first checks, which tokenize it whole and
// agree), and no answer carries token ids.
//
// It runs under the simulator's ChatML template and under its Llama 3.1
// template with conversations that have no system message (that template
// renders a system block first anyway, the stand-in turn included).
func TestChatPrefixComposed(t *testing.T) {
	t.Run("chatml", func(t *testing.T) { composedConversation(t, nil, true) })
	t.Run("llama3 without a system message", func(t *testing.T) {
		composedConversation(t, []string{"--sim-chat-template", "llama3"}, false)
	})
}

func composedConversation(t *testing.T, simArgs []string, system bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 1, secret: true, timeScale: 1000, progress: testProgress{t},
		simArgs: simArgs}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{}
	rng := seeded(t.Name())
	sys := words(rng, 3000)
	turns := []string{words(rng, 30)}
	body := func(turns []string) []byte {
		if system {
			return chatBody(sys, turns...)
		}
		return userChatBody(append([]string{sys + " " + turns[0]}, turns[1:]...))
	}
	first, err := postChat(ctx, hc, f.c.Pod(0).API, body(turns))
	if err != nil {
		t.Fatal(err)
	}
	holder := first.ServedBy
	sum := func(name string) float64 {
		return metricValue(f.metrics(t, 0), name) + metricValue(f.metrics(t, 1), name)
	}
	learned := func() float64 {
		return sum(`kvroute_textprefix_learned_total{result="composed"}`) + sum(`kvroute_textprefix_learned_total{result="stored"}`) +
			sum(`kvroute_textprefix_learned_total{result="request"}`)
	}
	const followUps = 12 // 6 per sidecar: past the first checks (4 per sidecar)
	prev := 0
	for i := range followUps {
		// Wait until the last turn is learned and shared: the next one
		// enters the other sidecar.
		want := float64(1 + i) // the first turn teaches itself (and its system prompt alone)
		if system {
			want++
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("turn %d learned", i+1), func(context.Context) (bool, string) {
			n, shared := learned(), sum(`kvroute_textprefix_learned_total{result="shared"}`)
			return n >= want && shared >= want, fmt.Sprintf("%v learned, %v shared; want %v", n, shared, want)
		})
		turns = append(turns, words(rng, 40), words(rng, 30))
		r, err := postChat(ctx, hc, f.c.Pod((i+1)%2).API, body(turns))
		if err != nil {
			t.Fatal(err)
		}
		if r.ServedBy != holder || bytes.Contains(r.Body, []byte("prompt_token_ids")) {
			t.Fatalf("follow-up %d entering pod %d: served by %s (%s), want %s; token ids in the answer: %v", i+1, (i+1)%2+1, r.ServedBy, r.Decision, holder,
				bytes.Contains(r.Body, []byte("prompt_token_ids")))
		}
		if c := r.cached(); c < prev {
			t.Errorf("follow-up %d: %d cached tokens; the turn before had at least %d", i+1, c, prev)
		}
		prev = r.cached()
	}
	if got := sum(`kvroute_textprefix_requests_total{path="prefix"}`); got != followUps {
		t.Errorf("%v follow-ups routed on a prefix; want %d", got, followUps)
	}
	composed := sum(`kvroute_textprefix_learned_total{result="composed"}`)
	right, wrong := sum(`kvroute_textprefix_compose_checks_total{result="right"}`), sum(`kvroute_textprefix_compose_checks_total{result="wrong"}`)
	if composed < 1 || right < 1 || wrong != 0 || sum(`kvroute_textprefix_guesses_total{result="wrong"}`) != 0 {
		t.Errorf("composed %v, checked right %v wrong %v, wrong guesses %v; want some composed, checks right, none wrong", composed, right, wrong,
			sum(`kvroute_textprefix_guesses_total{result="wrong"}`))
	}
	// What the tokenizers saw to compose is a small part of the
	// conversations they learned.
	if c, whole := sum(`kvroute_textprefix_tokenized_tokens_total{path="compose"}`), float64(prev); c <= 0 || c > whole {
		t.Errorf("composing tokenized %v tokens; the last turn alone is %v", c, whole)
	}
}

// userChatBody is a chat request without a system message: user first,
// then alternating assistant and user messages.
func userChatBody(turns []string) []byte { return conversationBody(nil, turns) }
