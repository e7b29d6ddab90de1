package vllmsim

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestTokenizeCostChargesPerToken(t *testing.T) {
	c := NewTokenizeCost(10*time.Microsecond, 1)
	start := time.Now()
	if err := c.Run(context.Background(), func() int { return 2000 }); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got < 20*time.Millisecond {
		t.Fatalf("2000 tokens at 10us took %v, want at least 20ms", got)
	}
}

// One worker: the second call's tokenizer starts only after the first
// call's charge has passed, as on vLLM's single tokenizer thread.
func TestTokenizeCostQueuesOnItsPool(t *testing.T) {
	for _, workers := range []int{1, 2} {
		c := NewTokenizeCost(10*time.Microsecond, workers)
		var mu sync.Mutex
		var starts []time.Time
		var wg sync.WaitGroup
		release := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Run(context.Background(), func() int {
					mu.Lock()
					starts = append(starts, time.Now())
					n := len(starts)
					mu.Unlock()
					if n == 1 && workers == 2 {
						<-release // the second call must start while this one runs
					}
					return 1000
				})
			}()
		}
		if workers == 2 {
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := len(starts)
				mu.Unlock()
				if n == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("2 workers: the second call never started while the first ran")
				}
				time.Sleep(time.Millisecond)
			}
			close(release)
		}
		wg.Wait()
		st := c.Stats()
		if st.Calls != 2 || st.Busy < 20*time.Millisecond {
			t.Fatalf("%d workers: stats %+v; want 2 calls holding workers at least 2 x 10ms", workers, st)
		}
		if workers == 1 {
			if gap := starts[1].Sub(starts[0]); gap < 10*time.Millisecond {
				t.Fatalf("1 worker: second call started %v after the first, want at least its 10ms charge", gap)
			}
		}
	}
}

func TestTokenizeCostCanceledWhileQueued(t *testing.T) {
	c := NewTokenizeCost(time.Millisecond, 1)
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		c.Run(context.Background(), func() int { close(held); <-done; return 0 })
	}()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := c.Run(ctx, func() int { ran = true; return 1 }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("canceled while queued: err %v, ran %v; want context.Canceled and not run", err, ran)
	}
	close(done)
}

func TestTokenizeCostNilRunsFree(t *testing.T) {
	var c *TokenizeCost
	ran := false
	if err := c.Run(context.Background(), func() int { ran = true; return 1 << 30 }); err != nil || !ran {
		t.Fatalf("nil cost: err %v, ran %v", err, ran)
	}
}
