//go:build integration

package vllmclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

// TestSidecarEventsTool runs `sidecar events` against the simulator, as an
// operator debugging a pod would, and checks every line it prints against
// the simulator's cache.
func TestSidecarEventsTool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	bin := binary(t, chaos.SidecarBinary)
	// Big enough that nothing the test sends is evicted: every hash printed
	// must still be cached at the end.
	s := startSim(t, simOptions{Encoding: "map", Blocks: 2048})
	const count = 20
	cmd := exec.Command(bin, "events", "--endpoint", s.events, "--count", strconv.Itoa(count))
	cmd.SysProcAttr = sysProcAttr()
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{}) // closed once waitErr is set
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
	})

	// The tool subscribes without replay, so requests sent before its
	// subscription reaches the PUB socket go unseen: keep sending small
	// unique requests (4 full blocks, one BlockStored each) until it has
	// printed count events and exited.
	sent := 0
send:
	for ; ; sent++ {
		select {
		case <-exited:
			break send
		case <-ctx.Done():
			t.Fatalf("sidecar events did not exit after %d requests; stdout:\n%s\nstderr:\n%s", sent, stdout.String(), stderr.String())
		default:
		}
		if sent == 400 { // 1600 blocks: still below capacity
			t.Fatalf("sidecar events still running after %d requests; stdout:\n%s\nstderr:\n%s", sent, stdout.String(), stderr.String())
		}
		prompt := make([]uint32, 4*16+1)
		for i := range prompt {
			prompt[i] = uint32(100_000 + sent*128 + i)
		}
		if err := s.complete(ctx, prompt, 1); err != nil {
			t.Fatal(err)
		}
	}
	if waitErr != nil {
		t.Fatalf("sidecar events: %v\nstderr:\n%s", waitErr, stderr.String())
	}

	cached := make(map[uint64]bool)
	sc := s.cache(ctx)
	for _, b := range sc.Blocks {
		cached[b.Hash] = true
	}
	events, hashes := 0, 0
	var lastSeq uint64
	sn := bufio.NewScanner(bytes.NewReader([]byte(stdout.String())))
	for sn.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sn.Bytes()))
		dec.UseNumber() // hashes are 64-bit: a float64 would round them
		var l map[string]any
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %q: %v", sn.Text(), err)
		}
		if l["kind"] != "event" {
			t.Errorf("line %q: kind %v; want only events from a lossless stream", sn.Text(), l["kind"])
			continue
		}
		events++
		if l["topic"] != s.topic {
			t.Errorf("line %q: topic %v; want %q", sn.Text(), l["topic"], s.topic)
		}
		seq := number(t, l["seq"])
		if events > 1 && seq < lastSeq {
			t.Errorf("line %q: seq %d after %d", sn.Text(), seq, lastSeq)
		}
		lastSeq = seq
		if l["type"] != "BlockStored" {
			t.Errorf("line %q: type %v; want BlockStored (nothing is evicted or cleared)", sn.Text(), l["type"])
			continue
		}
		hs, _ := l["block_hashes"].([]any)
		toks, _ := l["token_ids"].([]any)
		bs := number(t, l["block_size"])
		if len(hs) == 0 || bs != 16 || len(toks) != len(hs)*int(bs) {
			t.Errorf("line %q: %d hashes, %d token ids, block_size %d; want token ids = hashes x 16", sn.Text(), len(hs), len(toks), bs)
		}
		for _, h := range hs {
			hashes++
			if v := number(t, h); !cached[v] {
				t.Errorf("printed hash %d is not in /sim/cache", v)
			}
		}
		if p := l["parent_block_hash"]; p != nil && !cached[number(t, p)] {
			t.Errorf("printed parent %v is not in /sim/cache", p)
		}
	}
	if events != count {
		t.Errorf("printed %d events; want --count %d", events, count)
	}
	t.Logf("sidecar events: %d requests sent, %d events printed with %d hashes, all in /sim/cache", sent, events, hashes)
}

// number reads a JSON number that must be an unsigned 64-bit integer.
func number(t *testing.T, v any) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a JSON number", v, v)
	}
	u, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		t.Fatalf("%s is not a uint64: %v", n, err)
	}
	return u
}
