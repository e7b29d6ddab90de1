package chaos

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Proxy is a running cmd/kvproxy in front of the cluster's simulators.
type Proxy struct {
	Policy string
	Addr   string // host:port
	proc   *proc
}

// URL returns the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.Addr }

// Stop ends the proxy (SIGTERM, SIGKILL after the grace period) and reaps it.
func (p *Proxy) Stop() { p.proc.stop() }

// StartProxy builds (if needed) and starts cmd/kvproxy with the given
// baseline policy on addr (e.g. c.ServiceAddr(8000)), in front of every
// simulator, with their event endpoints, and waits for its /health. Its log
// is Dir/logs/kvproxy-<policy>.log. Stop it before starting another proxy on
// the same address; Cluster.Stop does not know about it.
func (c *Cluster) StartProxy(ctx context.Context, policy, addr string, seed uint64) (*Proxy, error) {
	bin, err := ensureBinaries(ctx, c.cfg.BinDir, []string{ProxyBinary}, nil)
	if err != nil {
		return nil, err
	}
	args := c.proxyArgs(policy, addr, seed)
	logPath := filepath.Join(c.cfg.Dir, "logs", "kvproxy-"+policy+".log")
	pr, err := startProc("kvproxy-"+policy, filepath.Join(bin, ProxyBinary), args, c.env, logPath, c.cfg.StopGrace)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	err = c.poll(ctx, pr, func(ctx context.Context) (bool, string) {
		st, _, err := c.get(ctx, "http://"+addr+"/health")
		if err != nil {
			return false, err.Error()
		}
		return st == http.StatusOK, fmt.Sprintf("status %d", st)
	})
	if err != nil {
		pr.stop()
		return nil, fmt.Errorf("kvproxy %s not healthy (see %s): %w", policy, logPath, err)
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: kvproxy %s ready at %s\n", policy, addr)
	return &Proxy{Policy: policy, Addr: addr, proc: pr}, nil
}

// proxyArgs is kvproxy's command line for this cluster.
func (c *Cluster) proxyArgs(policy, addr string, seed uint64) []string {
	var urls, names, events, replay, topics []string
	for _, p := range c.Pods() {
		urls = append(urls, p.SimURL)
		names = append(names, p.Name)
		events = append(events, p.Events)
		replay = append(replay, p.Replay)
		topics = append(topics, p.Topic)
	}
	return []string{
		"--listen", addr,
		"--policy", policy,
		"--model", c.cfg.Model,
		"--block-size", strconv.Itoa(c.cfg.Sim.BlockSize),
		"--seed", strconv.FormatUint(seed, 10),
		"--backends", strings.Join(urls, ","),
		"--names", strings.Join(names, ","),
		"--events", strings.Join(events, ","),
		"--replay", strings.Join(replay, ","),
		"--topics", strings.Join(topics, ","),
		"--shutdown-timeout", (c.cfg.StopGrace / 2).Round(time.Millisecond).String(),
	}
}
