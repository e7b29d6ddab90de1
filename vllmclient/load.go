package vllmclient

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Load is vLLM's current load as its /metrics report it. Gauges are summed
// over their label sets (one per engine and model), except KVUsage.
type Load struct {
	// Running and Waiting are vllm:num_requests_running and _waiting.
	Running, Waiting float64
	// KVUsage is vllm:kv_cache_usage_perc (or, from vLLM before #29330,
	// vllm:gpu_cache_usage_perc), 0..1, averaged over engines: a sum of
	// fractions of different caches would not be a fraction.
	KVUsage float64
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info's labels;
	// 0 when absent.
	BlockSize, NumGPUBlocks int
	// PromptTokens is vllm:prompt_tokens_total, summed. A counter that goes
	// down means a new engine process, and so does a new StartTime
	// (process_start_time_seconds, 0 when absent).
	PromptTokens, StartTime float64
	// Engines is how many engines the gauges name (the distinct values of
	// their "engine" label: one per data-parallel rank); 0 when they name
	// none.
	Engines int
}

// ErrNoLoadMetrics reports a /metrics answer without any of vLLM's load
// gauges: probably not a vLLM.
var ErrNoLoadMetrics = errors.New("no vllm load metrics")

const (
	metricRunning    = "vllm:num_requests_running"
	metricWaiting    = "vllm:num_requests_waiting"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
	metricCacheInfo  = "vllm:cache_config_info"
	metricPrompt     = "vllm:prompt_tokens_total"
	metricStartTime  = "process_start_time_seconds"
)

func parseLoad(r io.Reader) (Load, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Load{}, fmt.Errorf("parse metrics: %w", err)
	}
	var l Load
	running, okR := sum(fams[metricRunning])
	waiting, okW := sum(fams[metricWaiting])
	usage, okU := mean(fams[metricKVUsage], fams[metricKVUsageOld])
	if !okR && !okW && !okU {
		return Load{}, ErrNoLoadMetrics
	}
	l.Running, l.Waiting, l.KVUsage = running, waiting, usage
	l.Engines = engines(fams[metricRunning], fams[metricWaiting])
	l.PromptTokens, _ = sum(fams[metricPrompt])
	l.StartTime, _ = sum(fams[metricStartTime])
	if f := fams[metricCacheInfo]; f != nil {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				v, err := strconv.Atoi(lp.GetValue())
				if err != nil {
					continue // a label vLLM renders differently is no reason to fail
				}
				switch lp.GetName() {
				case "block_size":
					l.BlockSize = v
				case "num_gpu_blocks":
					l.NumGPUBlocks = v
				}
			}
		}
	}
	return l, nil
}

// sum adds a family's samples; ok is false when the family has none.
func sum(f *dto.MetricFamily) (total float64, ok bool) {
	for _, m := range f.GetMetric() {
		total += value(m)
		ok = true
	}
	return total, ok
}

// engines counts the distinct "engine" label values of fs' samples.
func engines(fs ...*dto.MetricFamily) int {
	seen := map[string]bool{}
	for _, f := range fs {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "engine" {
					seen[lp.GetValue()] = true
				}
			}
		}
	}
	return len(seen)
}

// mean averages the first family that has samples.
func mean(fs ...*dto.MetricFamily) (float64, bool) {
	for _, f := range fs {
		if s, ok := sum(f); ok {
			return s / float64(len(f.GetMetric())), true
		}
	}
	return 0, false
}

// value reads a gauge, counter or untyped sample (text without # TYPE).
func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
