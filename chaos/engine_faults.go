package chaos

import (
	"context"
	"fmt"
)

// StartSim starts pod i's simulator again after KillSim, with an empty
// cache, a new hash seed and event sequence numbers from 0, and waits until
// it answers /health. The sidecar is left alone: the kubelet restarts only
// the crashed container.
func (c *Cluster) StartSim(ctx context.Context, i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if sim, _ := c.procs(i); sim != nil && !sim.exited() {
		return fmt.Errorf("%s sim: still running", c.Pod(i).Name)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	if err := c.startSim(i); err != nil {
		return err
	}
	if err := c.waitSim(ctx, i); err != nil {
		return err
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sim restarted\n", c.Pod(i).Name)
	return nil
}
