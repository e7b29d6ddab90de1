package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// waitSim polls pod i's simulator /health until 200, ctx ends or the
// process exits.
func (c *Cluster) waitSim(ctx context.Context, i int) error {
	p := c.Pod(i)
	begin := time.Now()
	sim, _ := c.procs(i)
	err := c.poll(ctx, sim, func(ctx context.Context) (bool, string) {
		st, _, err := c.get(ctx, p.SimURL+"/health")
		if err != nil {
			return false, err.Error()
		}
		return st == http.StatusOK, fmt.Sprintf("status %d", st)
	})
	if err != nil {
		return fmt.Errorf("%s sim not healthy (see %s): %w", p.Name, c.LogPath(i, "sim"), err)
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sim healthy at %s in %v\n", p.Name, p.SimAddr, time.Since(begin).Round(time.Millisecond))
	return nil
}

// waitSidecar polls pod i's sidecar until /readyz answers 200 and
// /debug/peers lists every pod whose sidecar runs.
func (c *Cluster) waitSidecar(ctx context.Context, i int) error {
	p := c.Pod(i)
	begin := time.Now()
	_, sc := c.procs(i)
	// Pods a scenario killed are not expected back in the mesh.
	var want []string
	for j := range c.cfg.Pods {
		if _, sc := c.procs(j); sc != nil && !sc.exited() {
			want = append(want, c.Pod(j).Name)
		}
	}
	err := c.poll(ctx, sc, func(ctx context.Context) (bool, string) {
		st, _, err := c.get(ctx, "http://"+p.Admin+"/readyz")
		if err != nil {
			return false, err.Error()
		}
		if st != http.StatusOK {
			return false, fmt.Sprintf("readyz %d", st)
		}
		st, body, err := c.get(ctx, "http://"+p.Admin+"/debug/peers")
		if err != nil {
			return false, err.Error()
		}
		if st != http.StatusOK {
			return false, fmt.Sprintf("debug/peers %d", st)
		}
		seen, err := peerIDs(body, p.Name)
		if err != nil {
			return false, err.Error()
		}
		missing := missingPeers(want, seen)
		return len(missing) == 0, fmt.Sprintf("mesh misses %v", missing)
	})
	if err != nil {
		return fmt.Errorf("%s sidecar not ready (see %s): %w", p.Name, c.LogPath(i, "sidecar"), err)
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: %s sidecar ready at %s, sees %d peers, in %v\n",
		p.Name, p.API, len(want), time.Since(begin).Round(time.Millisecond))
	return nil
}

// peerIDs reads the "id" of every entry of the sidecar's /debug/peers
// array; the entry marked local counts as self, whatever its id.
func peerIDs(body []byte, self string) ([]string, error) {
	var peers []struct {
		ID    string `json:"id"`
		Local bool   `json:"local"`
	}
	if err := json.Unmarshal(body, &peers); err != nil {
		return nil, fmt.Errorf("debug/peers: %w", err)
	}
	ids := make([]string, 0, len(peers))
	for _, p := range peers {
		if p.Local {
			p.ID = self
		}
		ids = append(ids, p.ID)
	}
	return ids, nil
}

// missingPeers returns the names in want that are not in seen.
func missingPeers(want, seen []string) []string {
	have := make(map[string]bool, len(seen))
	for _, s := range seen {
		have[s] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}

// errExited reports that a process died while the harness waited for it.
var errExited = errors.New("process exited")

// poll calls check every PollInterval until it reports true, ctx ends, or
// pr exits. The error names the last reason check gave.
func (c *Cluster) poll(ctx context.Context, pr *proc, check func(context.Context) (bool, string)) error {
	t := time.NewTicker(c.cfg.PollInterval)
	defer t.Stop()
	last := "not polled yet"
	var exited <-chan struct{}
	if pr != nil {
		exited = pr.done
	}
	for {
		ok, why := check(ctx)
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %s)", ctx.Err(), last)
		case <-exited:
			return fmt.Errorf("%w: %v (last: %s)", errExited, pr.err, last)
		case <-t.C:
		}
	}
}

// get fetches url and returns the status and at most 1 MiB of body.
func (c *Cluster) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}
