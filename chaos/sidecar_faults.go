package chaos

import "fmt"

// StopSidecar stops pod i's sidecar gracefully (SIGTERM, SIGKILL after
// StopGrace) and returns once it has exited: it leaves the mesh as a
// restarting container's sidecar does, while the pod's vLLM, and the
// responses it stores, keep running. RestartSidecar starts it again.
// Stopping a sidecar that is not running is not an error.
func (c *Cluster) StopSidecar(i int) error {
	if err := c.check(i); err != nil {
		return err
	}
	if !c.cfg.Sidecars {
		return fmt.Errorf("stop sidecar: %w: cluster runs without sidecars", ErrConfig)
	}
	if _, sc := c.procs(i); sc != nil {
		sc.stop()
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sidecar stopped\n", c.Pod(i).Name)
	return nil
}
