package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"time"
)

// Fault hooks for chaos scenarios. Each acts on one pod and returns once the
// processes are in the new state (killed ones reaped, restarted ones ready).

// Kill SIGKILLs pod i's simulator and sidecar, as a node failure or an
// OOM kill of the pod would. Killing a dead pod is not an error.
func (c *Cluster) Kill(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	sim, sc := c.procs(i)
	for _, pr := range []*proc{sc, sim} {
		if pr != nil {
			pr.kill()
		}
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s killed\n", c.cfg.pod(i).Name)
	return nil
}

// KillSidecar SIGKILLs pod i's sidecar only: its vLLM keeps serving, the
// mesh must notice the member is gone.
func (c *Cluster) KillSidecar(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if _, sc := c.procs(i); sc != nil {
		sc.kill()
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sidecar killed\n", c.cfg.pod(i).Name)
	return nil
}

// Restart stops pod i's processes (gracefully if they still run), starts
// them again and waits until the pod is ready and, with sidecars, every
// sidecar sees the full mesh again. The new simulator has a fresh cache, a
// new hash seed and event sequence numbers from 0, as a restarted vLLM.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	sim, sc := c.procs(i)
	for _, pr := range []*proc{sc, sim} {
		if pr != nil {
			_ = pr.signal(syscall.SIGCONT) // a paused process must run to exit
			pr.stop()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	if err := c.startSim(i); err != nil {
		return err
	}
	if err := c.waitSim(ctx, i); err != nil {
		return err
	}
	if !c.cfg.Sidecars {
		fmt.Fprintf(c.cfg.Progress, "chaos: %s restarted\n", c.cfg.pod(i).Name)
		return nil
	}
	return c.RestartSidecar(ctx, i)
}

// RestartSidecar starts pod i's sidecar again (stopping it first if it
// runs) and waits until every sidecar sees the full mesh.
func (c *Cluster) RestartSidecar(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !c.cfg.Sidecars {
		return fmt.Errorf("restart sidecar: %w: cluster runs without sidecars", ErrConfig)
	}
	if _, sc := c.procs(i); sc != nil {
		sc.stop()
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	if err := c.startSidecar(i); err != nil {
		return err
	}
	for j := range c.cfg.Pods {
		if _, sc := c.procs(j); sc == nil || sc.exited() {
			continue // a pod the scenario killed does not rejoin
		}
		if err := c.waitSidecar(ctx, j); err != nil {
			return err
		}
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s restarted\n", c.cfg.pod(i).Name)
	return nil
}

// PauseSim SIGSTOPs pod i's simulator: it holds its sockets but answers
// nothing, like a vLLM stuck in a long GC or a CUDA hang.
func (c *Cluster) PauseSim(i int) error {
	return c.signalSim(i, syscall.SIGSTOP, "paused")
}

// ResumeSim SIGCONTs a simulator PauseSim stopped.
func (c *Cluster) ResumeSim(i int) error {
	return c.signalSim(i, syscall.SIGCONT, "resumed")
}

func (c *Cluster) signalSim(i int, sig syscall.Signal, what string) error {
	if err := c.check(i); err != nil {
		return err
	}
	sim, _ := c.procs(i)
	if sim == nil {
		return fmt.Errorf("%s sim: not started", c.cfg.pod(i).Name)
	}
	if err := sim.signal(sig); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sim %s\n", c.cfg.pod(i).Name, what)
	return nil
}

// check validates i and that the cluster still runs.
func (c *Cluster) check(i int) error {
	if i < 0 || i >= c.cfg.Pods {
		return fmt.Errorf("%w: pod %d of %d", ErrConfig, i, c.cfg.Pods)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	return nil
}

// CachedBlock is one physical block in a simulator's KV cache, as its
// GET /sim/cache reports it (ground truth for tests).
type CachedBlock struct {
	Hash   uint64   `json:"hash"`
	Parent *uint64  `json:"parent"`
	Tokens []uint32 `json:"tokens"`
	LoRA   string   `json:"lora"`
	Copies int      `json:"copies"`
}

// SimCache is a simulator's whole cache.
type SimCache struct {
	BlockSize int           `json:"block_size"`
	Blocks    []CachedBlock `json:"blocks"`
}

// SimCache reads pod i's simulator cache from GET /sim/cache.
func (c *Cluster) SimCache(ctx context.Context, i int) (SimCache, error) {
	if i < 0 || i >= c.cfg.Pods {
		return SimCache{}, fmt.Errorf("%w: pod %d of %d", ErrConfig, i, c.cfg.Pods)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.pod(i).SimURL+"/sim/cache", nil)
	if err != nil {
		return SimCache{}, err
	}
	// A big cache takes longer than the polling client's timeout to render.
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return SimCache{}, fmt.Errorf("sim cache: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return SimCache{}, fmt.Errorf("sim cache: status %d", resp.StatusCode)
	}
	var sc SimCache
	if err := json.NewDecoder(resp.Body).Decode(&sc); err != nil {
		return SimCache{}, fmt.Errorf("sim cache: %w", err)
	}
	return sc, nil
}
