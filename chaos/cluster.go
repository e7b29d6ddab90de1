package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Cluster is a running local cluster. Its methods are safe for concurrent
// use; fault hooks on one pod are serialised.
type Cluster struct {
	cfg    ClusterConfig
	bin    string
	env    []string
	client *http.Client

	mu      sync.Mutex
	pods    []*podProcs
	info    []PodInfo // current addresses; a replaced pod gets new ones
	gen     []int     // replacements per pod
	sidecar []string  // per pod: the sidecar binary (SidecarBins; UpgradeSidecar)
	next    int       // host number of the next replacement pod
	stopped bool

	net        *Netns // nil in loopback mode
	guardDrops int64
	guardErr   error
}

// podProcs are the processes of one pod; nil when not running.
type podProcs struct {
	sim, sidecar *proc
}

// ErrStopped reports a call on a cluster after Stop.
var ErrStopped = errors.New("cluster stopped")

// Start builds what it needs, starts every pod and waits until every
// simulator is healthy and, with Sidecars, every sidecar is ready and sees
// all pods in its mesh, or ReadyTimeout passes. On error it stops whatever
// it started. ctx bounds the start-up only: the processes run until Stop.
func Start(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	names := []string{SimBinary}
	if cfg.Sidecars {
		names = append(names, SidecarBinary)
	}
	bin, err := ensureBinaries(ctx, cfg.BinDir, names, func(need []string) {
		fmt.Fprintf(cfg.Progress, "chaos: building %v\n", need)
	})
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"sock", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
	}
	c := &Cluster{
		cfg:     cfg,
		bin:     bin,
		env:     childEnv(os.Environ()),
		client:  &http.Client{Timeout: 2 * time.Second},
		pods:    make([]*podProcs, cfg.Pods),
		gen:     make([]int, cfg.Pods),
		sidecar: make([]string, cfg.Pods),
		next:    cfg.Pods + 2,
	}
	for i := range cfg.Pods {
		c.info = append(c.info, cfg.pod(i))
		c.sidecar[i] = filepath.Join(bin, SidecarBinary)
		if n := len(cfg.SidecarBins); n > 0 && cfg.SidecarBins[i%n] != "" {
			c.sidecar[i] = cfg.SidecarBins[i%n]
		}
	}
	if cfg.Netns {
		n, err := SetupNetns(ctx, cfg.NetnsPrefix, cfg.Subnet)
		if err != nil {
			return nil, err
		}
		c.net = n
		for i := range cfg.Pods {
			if _, err := n.AddPod(ctx, c.info[i].Name, c.info[i].Host); err != nil {
				c.Stop()
				return nil, err
			}
		}
		fmt.Fprintf(cfg.Progress, "chaos: netns mode: bridge %s on %s.1/24, %d namespaces %s-*, egress guard %s\n",
			bridgeName(cfg.NetnsPrefix), cfg.Subnet, cfg.Pods, cfg.NetnsPrefix, guardChain(cfg.NetnsPrefix))
	} else if err := checkFree(cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	for i := range cfg.Pods {
		if err := c.startSim(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for i := range cfg.Pods {
		if err := c.waitSim(ctx, i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if cfg.Sidecars {
		for i := range cfg.Pods {
			if err := c.startSidecar(i); err != nil {
				c.Stop()
				return nil, err
			}
		}
		for i := range cfg.Pods {
			if err := c.waitSidecar(ctx, i); err != nil {
				c.Stop()
				return nil, err
			}
		}
	}
	fmt.Fprintf(cfg.Progress, "chaos: cluster of %d pods ready in %v (logs in %s)\n",
		cfg.Pods, time.Since(begin).Round(time.Millisecond), filepath.Join(cfg.Dir, "logs"))
	return c, nil
}

// childEnv is the harness's environment without PYTHONHASHSEED (every
// simulator must pick its own hash seed, as vLLM does) and without
// KVROUTE_* (the sidecars' env twins would override the flags).
func childEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "PYTHONHASHSEED=") || strings.HasPrefix(kv, "KVROUTE_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// checkFree fails early, with the address in the message, when a pod's TCP
// port is taken (another cluster on the same subnet, or a stale process).
func checkFree(cfg ClusterConfig) error {
	for i := range cfg.Pods {
		p := cfg.pod(i)
		addrs := []string{p.SimAddr}
		if cfg.Sidecars {
			addrs = append(addrs, p.API, p.Admin, p.Gossip)
		}
		for _, a := range addrs {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				return fmt.Errorf("start: %s: address in use? %w", a, err)
			}
			ln.Close()
		}
	}
	return nil
}

// Config returns the configuration with defaults filled in.
func (c *Cluster) Config() ClusterConfig { return c.cfg }

// Len returns the number of pods.
func (c *Cluster) Len() int { return c.cfg.Pods }

// Pod returns pod i's addresses. It panics on an index out of range, like a
// slice would: that is a bug in the caller, not bad input.
func (c *Cluster) Pod(i int) PodInfo {
	if i < 0 || i >= c.cfg.Pods {
		panic(fmt.Sprintf("chaos: pod %d of %d", i, c.cfg.Pods))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info[i]
}

// Pods returns every pod's addresses in index order.
func (c *Cluster) Pods() []PodInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.info)
}

// APIAddrs returns the sidecars' API addresses: the kvroute Service's
// endpoints.
func (c *Cluster) APIAddrs() []string {
	var out []string
	for _, p := range c.Pods() {
		out = append(out, p.API)
	}
	return out
}

// SimAddrs returns the simulators' addresses: the endpoints of a Service
// straight to vLLM, and of the baseline proxy.
func (c *Cluster) SimAddrs() []string {
	var out []string
	for _, p := range c.Pods() {
		out = append(out, p.SimAddr)
	}
	return out
}

// ServiceAddr returns Subnet.1:port, the address reserved for the Service
// or a central proxy in front of this cluster.
func (c *Cluster) ServiceAddr(port int) string {
	return net.JoinHostPort(c.cfg.Subnet+".1", fmt.Sprint(port))
}

// LogPath returns the log file of pod i's component ("sim" or "sidecar").
func (c *Cluster) LogPath(i int, component string) string {
	return filepath.Join(c.cfg.Dir, "logs", c.Pod(i).Name+"-"+component+".log")
}

// command prefixes a pod's command line with what puts it in the pod's
// network namespace (nothing in loopback mode).
func (c *Cluster) command(p PodInfo, bin string, args []string) (string, []string, error) {
	if c.net == nil {
		return bin, args, nil
	}
	pre, err := c.net.Exec(p.Name)
	if err != nil {
		return "", nil, err
	}
	return pre[0], append(append(pre[1:], bin), args...), nil
}

func (c *Cluster) startSim(i int) error {
	p := c.Pod(i)
	removeSockets(p)
	bin, args := Pinned(c.cfg.podCPUs(i), filepath.Join(c.bin, SimBinary), c.cfg.simArgs(p))
	bin, args, err := c.command(p, bin, args)
	if err != nil {
		return err
	}
	env := append(slices.Clip(c.env), c.cfg.SimEnv...)
	pr, err := startProc(p.Name+"-sim", bin, args, env, c.LogPath(i, "sim"), c.cfg.StopGrace)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pods[i] == nil {
		c.pods[i] = &podProcs{}
	}
	c.pods[i].sim = pr
	return nil
}

func (c *Cluster) startSidecar(i int) error {
	p := c.Pod(i)
	var seeds []string
	for j := 0; j < c.cfg.Pods && j < 2; j++ {
		seeds = append(seeds, c.Pod(j).Gossip)
	}
	c.mu.Lock()
	sidecar := c.sidecar[i]
	c.mu.Unlock()
	bin, args := Pinned(c.cfg.SidecarCPUsOf(i), sidecar, c.cfg.sidecarArgsJoin(p, seeds))
	bin, args, err := c.command(p, bin, args)
	if err != nil {
		return err
	}
	env := append(slices.Clip(c.env), c.cfg.SidecarEnv...)
	pr, err := startProc(p.Name+"-sidecar", bin, args, env, c.LogPath(i, "sidecar"), c.cfg.StopGrace)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pods[i] == nil {
		c.pods[i] = &podProcs{}
	}
	c.pods[i].sidecar = pr
	return nil
}

// removeSockets deletes a pod's ipc socket files; a missing file is fine.
func removeSockets(p PodInfo) {
	for _, e := range []string{p.Events, p.Replay} {
		_ = os.Remove(e[len("ipc://"):]) // absent after a clean exit
	}
}

// procs returns pod i's processes (either may be nil).
func (c *Cluster) procs(i int) (sim, sidecar *proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pp := c.pods[i]; pp != nil {
		return pp.sim, pp.sidecar
	}
	return nil, nil
}

// Stop ends every process (SIGTERM, then SIGKILL after StopGrace), reaps
// them and removes the sockets. It is idempotent and safe after any fault.
func (c *Cluster) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	pods := c.pods
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, pp := range pods {
		if pp == nil {
			continue
		}
		for _, pr := range []*proc{pp.sidecar, pp.sim} {
			if pr == nil {
				continue
			}
			// A paused process cannot act on SIGTERM until it runs again.
			_ = pr.signal(syscall.SIGCONT)
			wg.Go(pr.stop)
		}
	}
	wg.Wait()
	for _, p := range c.Pods() {
		removeSockets(p)
	}
	if c.net != nil {
		drops, err := c.net.Close(context.Background())
		c.mu.Lock()
		c.guardDrops, c.guardErr = drops, err
		c.mu.Unlock()
		fmt.Fprintf(c.cfg.Progress, "chaos: netns removed; egress guard dropped %d packets\n", drops)
	}
	fmt.Fprintf(c.cfg.Progress, "chaos: cluster stopped\n")
}

// GuardDrops returns the egress guard's final packet count, valid after
// Stop in netns mode; err says why it could not be read (or the teardown
// failed).
func (c *Cluster) GuardDrops() (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.guardDrops, c.guardErr
}

// Netns reports whether the pods run in network namespaces.
func (c *Cluster) Netns() bool { return c.net != nil }

// Running reports whether pod i's simulator and sidecar processes are alive
// (sidecar is false in a simulator-only cluster).
func (c *Cluster) Running(i int) (sim, sidecar bool) {
	s, sc := c.procs(i)
	return s != nil && !s.exited(), sc != nil && !sc.exited()
}
