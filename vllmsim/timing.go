package vllmsim

import (
	"context"
	"fmt"
	"time"
)

// DefaultConfig models Llama-3.1-8B-Instruct in bf16 on one H100 80GB with
// vLLM's default scheduler limits. It is what cmd/vllm-sim runs with when
// no flag is given. The figures are estimates derived as follows.
//
// NumGPUBlocks 27000 (432k tokens): Llama-3.1-8B stores K and V for 32
// layers × 8 KV heads × 128 dims in bf16, 128 KiB per token. vLLM's default
// gpu_memory_utilization 0.9 of 79 GiB leaves ~71 GiB; minus ~15 GiB of
// weights and ~3 GiB of activations and CUDA graphs, ~53 GiB hold KV:
// 53 GiB / 128 KiB ≈ 434k tokens ≈ 27k blocks of 16 (estimate).
//
// Timing (see the Timing defaults below): decode of an 8B model is bound by
// reading the 16 GB of weights each step (H100 HBM3 3.35 TB/s → ~5 ms) plus
// launch overhead, hence StepOverhead 6 ms; each decoding sequence adds its
// KV reads and sampling, ~60 µs at 1–2k tokens of context, so a step of 64
// sequences takes ~10 ms and 256 sequences ~21 ms, i.e. ~12k output tok/s
// at full batch, in line with the ~12.5k tok/s published for Llama 3.1 8B on
// one H100 (https://www.morphllm.com/vllm-benchmarks) and with the Azure
// ND-H100-v5 study of Llama 3.1 8B on vLLM
// (https://techcommunity.microsoft.com/blog/azurehighperformancecomputingblog/performance-of-llama-3-1-8b-ai-inference-using-vllm-on-nd-h100-v5/4448355).
// Prefill is compute bound: 2 × 8e9 FLOP per token at ~40% of the H100's
// 989 dense bf16 TFLOP/s is ~40 µs per token; attention and the MLP
// kernels' lower efficiency at vLLM's default chunk bring measured prefill
// throughput to 10–20k tokens/s, so PrefillPerToken is 60 µs (~16.7k
// tokens/s; an 8k-token prompt alone gets its first token after ~0.5 s).
func DefaultConfig() Config {
	return Config{
		Model:               "meta-llama/Llama-3.1-8B-Instruct",
		BlockSize:           16,    // vLLM CacheConfig.DEFAULT_BLOCK_SIZE
		NumGPUBlocks:        27000, // see above
		MaxNumSeqs:          256,   // vLLM's long-standing max_num_seqs default
		MaxNumBatchedTokens: 8192,  // vLLM V1 default for online serving on H100
		MaxModelLen:         131072,
		HashAlgo:            HashSHA256CBOR,
		Timing:              DefaultTiming(),
		TimeScale:           1,
	}
}

// LocalConfig is DefaultConfig with a small cache (2048 blocks, 32k
// tokens) and context (32k), so that a laptop demo or a chaos scenario sees
// evictions, preemptions and queueing within a few requests.
func LocalConfig() Config {
	c := DefaultConfig()
	c.NumGPUBlocks = 2048
	c.MaxModelLen = 32768
	return c
}

// DefaultTiming is the cost model of DefaultConfig (derivation there).
func DefaultTiming() Timing {
	return Timing{
		StepOverhead:    6 * time.Millisecond,
		PrefillPerToken: 60 * time.Microsecond,
		DecodePerSeq:    60 * time.Microsecond,
		LoadPerToken:    LoadPerToken(KVBytesPerToken),
	}
}

// KVBytesPerToken is DefaultConfig's model's KV per token: Llama-3.1-8B,
// 32 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes (bf16).
const KVBytesPerToken = 32 * 8 * 128 * 2 * 2

// HostToDeviceBytesPerSec is the effective host-to-device copy rate of the
// CPU tier: PCIe Gen5 x16 (an H100 SXM's link) is 64 GB/s per direction
// raw (PCI-SIG, PCIe 5.0 specification: 32 GT/s × 16 lanes, 128b/130b);
// pinned-memory cudaMemcpy reaches ~80% of it, ~50 GB/s (NVIDIA's
// bandwidthTest on H100 reports 50–55 GB/s host to device).
const HostToDeviceBytesPerSec = 50e9

// LoadPerToken is the time to copy one token's KV of bytesPerToken from
// host memory at HostToDeviceBytesPerSec: ~2.6 µs for DefaultConfig's
// model, ~23× cheaper than computing it (PrefillPerToken 60 µs), inside
// the 2–22× TTFT gain vLLM's offloading blog reports for reloads once
// fixed costs are counted.
func LoadPerToken(bytesPerToken int) time.Duration {
	return time.Duration(float64(bytesPerToken) / HostToDeviceBytesPerSec * float64(time.Second))
}

// Duration is the simulated time of one step that computes prefillTokens
// uncached prompt tokens and decodes decodeSeqs sequences.
func (t Timing) Duration(prefillTokens, decodeSeqs int) time.Duration {
	return t.StepOverhead + time.Duration(prefillTokens)*t.PrefillPerToken +
		time.Duration(decodeSeqs)*t.DecodePerSeq
}

// validate checks c; a zero TimeScale means 1.
func (c *Config) validate() error {
	switch {
	case c.BlockSize < 1:
		return fmt.Errorf("config: block size %d < 1", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return fmt.Errorf("config: num gpu blocks %d < 1", c.NumGPUBlocks)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("config: max num seqs %d < 1", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("config: max num batched tokens %d < 1", c.MaxNumBatchedTokens)
	case c.MaxModelLen < 2:
		return fmt.Errorf("config: max model len %d < 2", c.MaxModelLen)
	case c.Timing.StepOverhead < 0 || c.Timing.PrefillPerToken < 0 || c.Timing.DecodePerSeq < 0 || c.Timing.LoadPerToken < 0:
		return fmt.Errorf("config: negative timing %+v", c.Timing)
	case c.TimeScale < 0 || c.TimeScale != c.TimeScale:
		return fmt.Errorf("config: time scale %v", c.TimeScale)
	case c.ImageTokens < 0:
		return fmt.Errorf("config: image tokens %d < 0", c.ImageTokens)
	}
	if err := c.Offload.validate(); err != nil {
		return err
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	return nil
}

// clock is the engine's view of real time: injectable so tests run the
// simulation without waiting (a fake whose sleep advances it instantly).
type clock interface {
	now() time.Time
	// sleep waits d or until ctx is done (then it returns ctx.Err()).
	sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) now() time.Time { return time.Now() }

func (wallClock) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
