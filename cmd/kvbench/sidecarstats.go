package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

// sidecarSeries are the sidecar counters a run reports, summed over pods:
// predicted against actual cached tokens, and how chat prompts were keyed.
var sidecarSeries = []string{
	`kvroute_cached_tokens_total{kind="predicted"}`,
	`kvroute_cached_tokens_total{kind="actual"}`,
	`kvroute_textprefix_requests_total{path="prefix"}`,
	`kvroute_textprefix_requests_total{path="tokenized"}`,
	`kvroute_textprefix_requests_total{path="untokenized"}`,
	`kvroute_textprefix_checks_total{result="right"}`,
	`kvroute_textprefix_checks_total{result="wrong"}`,
	`kvroute_textprefix_guesses_total{result="right"}`,
	`kvroute_textprefix_guesses_total{result="wrong"}`,
	`kvroute_textprefix_guesses_total{result="unchecked"}`,
	`kvroute_textprefix_compose_checks_total{result="right"}`,
	`kvroute_textprefix_compose_checks_total{result="wrong"}`,
	`kvroute_textprefix_learned_total{result="request"}`,
	`kvroute_textprefix_learned_total{result="answer"}`,
	`kvroute_textprefix_learned_total{result="composed"}`,
	`kvroute_textprefix_learned_total{result="stored"}`,
	`kvroute_textprefix_learned_total{result="shared"}`,
	`kvroute_textprefix_learned_total{result="dropped"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="request"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="learn"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="verify"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="request"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="learn"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="compose"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="lead"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="verify"}`,
	`kvroute_tokenize_duration_seconds_count`,
}

// reportSidecars prints sidecarSeries summed over c's sidecars (best
// effort: a pod that does not answer is left out and said so).
func reportSidecars(ctx context.Context, c *chaos.Cluster, w io.Writer) {
	sum := make([]float64, len(sidecarSeries))
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, p := range c.Pods() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Admin+"/metrics", nil)
		resp, err := hc.Do(req)
		if err != nil {
			fmt.Fprintf(w, "kvbench: %s metrics: %v\n", p.Name, err)
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			for i, name := range sidecarSeries {
				if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
					if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
						sum[i] += v
					}
				}
			}
		}
		resp.Body.Close()
	}
	var b strings.Builder
	b.WriteString("kvbench: sidecars:")
	for i, name := range sidecarSeries {
		fmt.Fprintf(&b, " %s=%.0f", strings.TrimPrefix(name, "kvroute_"), sum[i])
	}
	fmt.Fprintln(w, b.String())
}
