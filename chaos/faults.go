package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// Fault hooks for chaos scenarios. Each acts on one pod and returns once the
// processes are in the new state (killed ones reaped, restarted ones ready).

// Kill SIGKILLs pod i's simulator and sidecar, as a node failure or an
// OOM kill of the pod would. Killing a dead pod is not an error.
func (c *Cluster) Kill(i int) error { return c.kill(i, true, true, "") }

// KillSidecar SIGKILLs pod i's sidecar only: its vLLM keeps serving, the
// mesh must notice the member is gone.
func (c *Cluster) KillSidecar(i int) error { return c.kill(i, false, true, " sidecar") }

// KillSim SIGKILLs pod i's simulator only, as an OOM kill or a crash of the
// vLLM container would: the sidecar keeps running and must notice.
func (c *Cluster) KillSim(i int) error { return c.kill(i, true, false, " sim") }

func (c *Cluster) kill(i int, simToo, sidecarToo bool, what string) error {
	if err := c.check(i); err != nil {
		return err
	}
	sim, sc := c.procs(i)
	if sc != nil && sidecarToo {
		sc.kill()
	}
	if sim != nil && simToo {
		sim.kill()
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s%s killed\n", c.Pod(i).Name, what)
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
	c.stopPod(i)
	return c.startPod(ctx, i)
}

// stopPod ends pod i's processes: SIGTERM, SIGKILL after StopGrace.
func (c *Cluster) stopPod(i int) {
	sim, sc := c.procs(i)
	for _, pr := range []*proc{sc, sim} {
		if pr != nil {
			_ = pr.signal(syscall.SIGCONT) // a paused process must run to exit
			pr.stop()
		}
	}
}

// startPod starts pod i's simulator and sidecar and waits as Restart does.
func (c *Cluster) startPod(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	if err := c.startSim(i); err != nil {
		return err
	}
	if err := c.waitSim(ctx, i); err != nil {
		return err
	}
	if !c.cfg.Sidecars {
		fmt.Fprintf(c.cfg.Progress, "chaos: %s restarted\n", c.Pod(i).Name)
		return nil
	}
	return c.RestartSidecar(ctx, i)
}

// RestartSidecar starts pod i's sidecar again (stopping it first if it
// runs) and waits until every sidecar sees the full mesh.
func (c *Cluster) RestartSidecar(ctx context.Context, i int) error {
	if err := c.StopSidecar(i); err != nil {
		return fmt.Errorf("restart: %w", err)
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
	fmt.Fprintf(c.cfg.Progress, "chaos: %s restarted\n", c.Pod(i).Name)
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
		return fmt.Errorf("%s sim: not started", c.Pod(i).Name)
	}
	if err := sim.signal(sig); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sim %s\n", c.Pod(i).Name, what)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Pod(i).SimURL+"/sim/cache", nil)
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

// ErrNeedNetns reports a fault that only netns mode can inject.
var ErrNeedNetns = errors.New("needs netns mode (root; --netns)")

// Replace kills pod i (SIGKILL, as a node loss) and starts a new pod in
// its place (Renew). It returns once the new pod is ready and every live
// sidecar sees it.
func (c *Cluster) Replace(ctx context.Context, i int) error {
	if err := c.Kill(i); err != nil {
		return err
	}
	return c.Renew(ctx, i)
}

// Renew ends pod i's processes (SIGTERM, SIGKILL after StopGrace; a killed
// pod has none left) and starts a new pod in its place under a new name
// ("pod<i+1>-r<n>") at a new address, with an empty cache, as a
// Deployment's replacement pod. In netns mode the old address disappears
// from the network with its namespace. It returns once the new pod is
// ready and every live sidecar sees it.
func (c *Cluster) Renew(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	c.stopPod(i)
	old := c.Pod(i)
	if c.net != nil {
		if err := c.net.RemovePod(ctx, old.Name); err != nil {
			return err
		}
	}
	removeSockets(old)
	c.mu.Lock()
	c.gen[i]++
	host := c.next
	c.next++
	name := fmt.Sprintf("pod%d-r%d", i+1, c.gen[i])
	c.mu.Unlock()
	if host > 254 {
		return fmt.Errorf("renew %s: subnet %s has no address left", old.Name, c.cfg.Subnet)
	}
	p := c.cfg.podAt(i, host, name)
	if c.net != nil {
		if _, err := c.net.AddPod(ctx, p.Name, p.Host); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.info[i] = p
	c.mu.Unlock()
	fmt.Fprintf(c.cfg.Progress, "chaos: %s replaced by %s at %s\n", old.Name, p.Name, p.Host)
	return c.startPod(ctx, i)
}

// Partition cuts pod i from the other pods (gossip and forwards) while the
// Service and the harness still reach it; on=false heals.
func (c *Cluster) Partition(ctx context.Context, i int, on bool) error {
	if err := c.check(i); err != nil {
		return err
	}
	if c.net == nil {
		return fmt.Errorf("partition: %w", ErrNeedNetns)
	}
	if err := c.net.Partition(ctx, c.Pod(i).Name, on); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s partition %v\n", c.Pod(i).Name, on)
	return nil
}

// GossipLoss drops percent of pod i's outgoing gossip packets (0 clears).
func (c *Cluster) GossipLoss(ctx context.Context, i int, percent float64) error {
	if err := c.check(i); err != nil {
		return err
	}
	if c.net == nil {
		return fmt.Errorf("gossip-loss: %w", ErrNeedNetns)
	}
	return c.net.GossipLoss(ctx, c.Pod(i).Name, c.cfg.Ports.Gossip, percent)
}

// GossipDelay delays pod i's outgoing gossip packets by d (0 clears).
func (c *Cluster) GossipDelay(ctx context.Context, i int, d time.Duration) error {
	if err := c.check(i); err != nil {
		return err
	}
	if c.net == nil {
		return fmt.Errorf("gossip-delay: %w", ErrNeedNetns)
	}
	return c.net.GossipDelay(ctx, c.Pod(i).Name, c.cfg.Ports.Gossip, d)
}

// SetDropRate makes pod i's simulator drop that fraction of its live
// KV-event batches (still replayable), through POST /sim/drop-rate.
func (c *Cluster) SetDropRate(ctx context.Context, i int, rate float64) error {
	if err := c.check(i); err != nil {
		return err
	}
	body := fmt.Sprintf(`{"drop_rate":%g}`, rate)
	st, b, err := c.post(ctx, c.Pod(i).SimURL+"/sim/drop-rate", body)
	if err != nil {
		return fmt.Errorf("drop rate %s: %w", c.Pod(i).Name, err)
	}
	if st != http.StatusOK {
		return fmt.Errorf("drop rate %s: status %d: %s", c.Pod(i).Name, st, b)
	}
	return nil
}

// Drain asks pod i's sidecar to drain (POST /drain: leave the mesh, refuse
// forwards, wait for requests in flight), as a preStop hook does.
func (c *Cluster) Drain(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	st, b, err := c.post(ctx, "http://"+c.Pod(i).Admin+"/drain", "")
	if err != nil {
		return fmt.Errorf("drain %s: %w", c.Pod(i).Name, err)
	}
	if st != http.StatusOK {
		return fmt.Errorf("drain %s: status %d: %s", c.Pod(i).Name, st, b)
	}
	return nil
}

// post sends body to url with a client that waits as long as ctx allows
// (a drain waits for requests in flight).
func (c *Cluster) post(ctx context.Context, url, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, b, err
}
