// Command kvcluster runs a kvroute mesh on this machine and leaves it up to
// be tried by hand: N pods, each a vllm-sim plus a sidecar on its own
// loopback address, joined into one mesh, behind a Service that picks a
// random pod per connection as kube-proxy does.
//
//	kvcluster [--pods 3]           run in the foreground until Ctrl-C or SIGTERM
//	kvcluster --detach [flags]     start in the background, print the URLs, return
//	kvcluster down [--dir DIR]     stop a detached cluster
//
// It prints the Service URL, each pod's API, admin and vLLM URLs and where
// the logs are; the logs stay after it stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/cmd/internal/cli"
)

// Ports on the Service address (Subnet.1).
const (
	servicePort = 8000 // the kvroute Service: the sidecars
	plainPort   = 8001 // a plain Service straight to the simulators
	controlPort = 9000 // kill and restart pods
)

// Files in --dir besides chaos's sock/ and logs/.
const (
	pidFile  = "kvcluster.pid"
	infoFile = "cluster.txt"
	logFile  = "kvcluster.log" // a detached cluster's own output
)

type options struct {
	Pods         int
	Subnet       string
	Dir          string
	BinDir       string
	BlocksPerPod int
	Seed         uint64
	Detach       bool
	ReadyTimeout time.Duration
	// Store and ScaleOut run the simulators as an agent platform runs
	// vLLM: its Responses store on, its render endpoints served.
	Store, ScaleOut bool
}

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Stdout, os.Stderr))
}

// cmdMain is the program with its streams; it returns the exit status.
func cmdMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "down" {
		return exitStatus(runDown(args[1:], stdout, stderr), stderr)
	}
	o, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return cli.Fail("kvcluster", err, stderr)
	}
	if o.Detach {
		return exitStatus(detach(o, args, stdout), stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return exitStatus(up(ctx, o, stdout, stderr, "Stop: Ctrl-C here, or `make cluster-down` from another terminal."), stderr)
}

func exitStatus(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, cli.ErrDone) {
		return 0
	}
	if cli.Printed(err) {
		return 2
	}
	fmt.Fprintf(stderr, "kvcluster: %v\n", err)
	return 1
}

func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("kvcluster", flag.ContinueOnError)
	cli.Usage(fs, "kvcluster [flags]            run a local mesh until Ctrl-C or SIGTERM\n"+
		"       kvcluster --detach [flags]   start it in the background and return\n"+
		"       kvcluster down [--dir DIR]   stop a detached one",
		"Runs a kvroute mesh on this machine to try by hand: --pods pods, each a vllm-sim and a sidecar\n"+
			"on its own loopback address (SUBNET.2, .3, ...), joined into one mesh, behind a Service on\n"+
			"SUBNET.1:8000 that picks a random pod per connection. Prints every URL and where the logs\n"+
			"are (DIR/logs, kept after it stops). Uses the vllm-sim and sidecar binaries in --bin,\n"+
			"building them first when they are missing.")
	fs.IntVar(&o.Pods, "pods", 3, "simulated vLLM pods")
	fs.StringVar(&o.Subnet, "subnet", "127.0.90", "loopback /24 of the cluster (127.x.y): pods on .2.., the Services on .1")
	fs.StringVar(&o.Dir, "dir", "out/cluster", "directory of the logs, the event sockets and the pid file")
	fs.StringVar(&o.BinDir, "bin", "bin", "where the vllm-sim and sidecar binaries are")
	fs.IntVar(&o.BlocksPerPod, "blocks-per-pod", 2048, "KV cache blocks of 16 tokens per pod")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the Service's pod choice")
	fs.BoolVar(&o.Detach, "detach", false, "run in the background: print the URLs once the mesh is ready, then return")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", 60*time.Second, "how long the pods and the mesh may take to come up")
	fs.BoolVar(&o.Store, "responses-store", true, "the simulators keep stored Responses, as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1 (previous_response_id, GET /v1/responses/{id})")
	fs.BoolVar(&o.ScaleOut, "enable-scale-out", true, "the simulators serve vLLM's render endpoints, as vLLM v0.30 with --enable-scale-out")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Pods < 1 || o.Pods > 253 {
		return o, fmt.Errorf("--pods %d: want 1 to 253", o.Pods)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return o, err
	}
	o.Dir = dir
	return o, nil
}

// up starts the cluster and its Services, prints the URLs and serves until
// ctx ends; then it stops everything and keeps the logs.
func up(ctx context.Context, o options, stdout, stderr io.Writer, stopHint string) error {
	if pid, ok := running(o.Dir); ok {
		return fmt.Errorf("a cluster already runs from %s (pid %d); stop it with `make cluster-down`", o.Dir, pid)
	}
	for _, f := range []string{pidFile, infoFile} {
		os.Remove(filepath.Join(o.Dir, f)) // a stale file of a cluster that is gone
	}
	cfg := chaos.LocalConfig()
	cfg.Pods, cfg.Subnet, cfg.Dir, cfg.BinDir = o.Pods, o.Subnet, o.Dir, o.BinDir
	cfg.Sidecars = true
	cfg.Sim.NumGPUBlocks = o.BlocksPerPod
	if o.Store {
		cfg.SimEnv = append(cfg.SimEnv, "VLLM_ENABLE_RESPONSES_API_STORE=1")
	}
	if o.ScaleOut {
		cfg.Sim.ExtraArgs = append(cfg.Sim.ExtraArgs, "--enable-scale-out")
	}
	cfg.ReadyTimeout = o.ReadyTimeout
	cfg.StopGrace = 3 * time.Second
	cfg.Progress = stderr
	c, err := chaos.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		c.Stop()
		fmt.Fprintf(stderr, "kvcluster: stopped; logs kept in %s\n", filepath.Join(o.Dir, "logs"))
	}()
	svc, err := chaos.ListenService(chaos.ServiceConfig{Addr: c.ServiceAddr(servicePort), Backends: c.APIAddrs(), Seed: o.Seed})
	if err != nil {
		return fmt.Errorf("kvroute Service: %w", err)
	}
	defer svc.Close()
	plain, err := chaos.ListenService(chaos.ServiceConfig{Addr: c.ServiceAddr(plainPort), Backends: c.SimAddrs(), Seed: o.Seed})
	if err != nil {
		return fmt.Errorf("plain Service: %w", err)
	}
	defer plain.Close()
	ln, err := net.Listen("tcp", c.ServiceAddr(controlPort))
	if err != nil {
		return fmt.Errorf("control: %w", err)
	}
	ctl := &http.Server{Handler: control(ctx, c, svc, plain, stderr), ReadHeaderTimeout: 5 * time.Second}
	go ctl.Serve(ln) // returns when ctl is shut down below
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ctl.Shutdown(sctx)
	}()

	info := describe(c, svc.URL(), plain.URL(), "http://"+ln.Addr().String(), o.Dir)
	pidPath := filepath.Join(o.Dir, pidFile)
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidPath)
	// The info file is written last: a detaching parent waits for it.
	infoPath := filepath.Join(o.Dir, infoFile)
	if err := os.WriteFile(infoPath, []byte(info), 0o644); err != nil {
		return err
	}
	defer os.Remove(infoPath)
	fmt.Fprintf(stdout, "%s%s\n", info, stopHint)
	<-ctx.Done()
	fmt.Fprintln(stderr, "kvcluster: stopping")
	return nil
}

// describe is what a person needs to use the cluster.
func describe(c *chaos.Cluster, service, plain, ctl, dir string) string {
	var b strings.Builder
	cfg := c.Config()
	fmt.Fprintf(&b, "kvroute local cluster: %d pods (a vllm-sim and a sidecar each, one mesh), model %s\n\n", c.Len(), cfg.Model)
	fmt.Fprintf(&b, "  kvroute Service  %-26s a random pod per connection, as kube-proxy picks\n", service)
	fmt.Fprintf(&b, "  plain Service    %-26s the same, straight to the simulators (no kvroute), to compare\n", plain)
	fmt.Fprintf(&b, "  control          %-26s POST /pods/pod2/kill, /pods/pod2/restart; GET /pods\n\n", ctl)
	fmt.Fprintf(&b, "  %-5s %-26s %-26s %s\n", "pod", "API (sidecar)", "admin (sidecar)", "vLLM (simulator)")
	for _, p := range c.Pods() {
		fmt.Fprintf(&b, "  %-5s %-26s %-26s %s\n", p.Name, "http://"+p.API, "http://"+p.Admin, p.SimURL)
	}
	fmt.Fprintf(&b, "\n  logs  %s/pod<N>-sim.log, pod<N>-sidecar.log (kept after it stops)\n\n", filepath.Join(dir, "logs"))
	fmt.Fprintf(&b, "Try:\n  curl -si %s/v1/chat/completions -H 'content-type: application/json' \\\n"+
		"    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}' | grep -i '^x-kvroute'\n",
		service, cfg.Model)
	return b.String()
}

// control serves the fault hooks: POST /pods/NAME/kill (SIGKILL the pod's
// processes, as a node failure would), POST /pods/NAME/restart (start it
// again, with an empty cache), GET /pods. A killed pod leaves both
// Services' endpoints, as Kubernetes removes a pod that fails its readiness
// probe (there after a few seconds, here at once), and a restarted one
// comes back.
func control(ctx context.Context, c *chaos.Cluster, svc, plain *chaos.Service, log io.Writer) http.Handler {
	m := http.NewServeMux()
	endpoints := func() {
		var api, sims []string
		for _, p := range c.Pods() {
			if sim, sc := c.Running(p.Index); sim && sc {
				api, sims = append(api, p.API), append(sims, p.SimAddr)
			}
		}
		svc.SetBackends(api)
		plain.SetBackends(sims)
	}
	index := func(w http.ResponseWriter, name string) (int, bool) {
		for _, p := range c.Pods() {
			if p.Name == name {
				return p.Index, true
			}
		}
		http.Error(w, fmt.Sprintf("no pod %q", name), http.StatusNotFound)
		return 0, false
	}
	m.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) {
		for _, p := range c.Pods() {
			sim, sc := c.Running(p.Index)
			fmt.Fprintf(w, "%s  simulator running: %t  sidecar running: %t\n", p.Name, sim, sc)
		}
	})
	m.HandleFunc("POST /pods/{name}/kill", func(w http.ResponseWriter, r *http.Request) {
		i, ok := index(w, r.PathValue("name"))
		if !ok {
			return
		}
		err := c.Kill(i)
		endpoints()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(log, "kvcluster: %s killed\n", r.PathValue("name"))
		fmt.Fprintf(w, "%s killed\n", r.PathValue("name"))
	})
	m.HandleFunc("POST /pods/{name}/restart", func(w http.ResponseWriter, r *http.Request) {
		i, ok := index(w, r.PathValue("name"))
		if !ok {
			return
		}
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		context.AfterFunc(r.Context(), cancel)
		err := c.Restart(rctx, i)
		endpoints()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(log, "kvcluster: %s restarted\n", r.PathValue("name"))
		fmt.Fprintf(w, "%s restarted (empty cache)\n", r.PathValue("name"))
	})
	return m
}

// detach starts this program again in its own session with the same flags
// minus --detach, its output in DIR/kvcluster.log, waits until it has
// written the info file and prints it.
func detach(o options, args []string, stdout io.Writer) error {
	if pid, ok := running(o.Dir); ok {
		return fmt.Errorf("a cluster already runs from %s (pid %d); stop it with `make cluster-down`", o.Dir, pid)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	os.Remove(filepath.Join(o.Dir, infoFile))
	logPath := filepath.Join(o.Dir, logFile)
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	childArgs := slices.DeleteFunc(slices.Clone(args), func(a string) bool {
		return a == "--detach" || a == "-detach" || a == "--detach=true" || a == "-detach=true"
	})
	childArgs = append(childArgs, "--dir", o.Dir)
	cmd := exec.Command(exe, childArgs...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // survives the terminal and make
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()                   // ends when the child exits
	deadline := time.After(o.ReadyTimeout + 5*time.Minute) // + a cold build of the binaries
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			tail, _ := os.ReadFile(logPath)
			return fmt.Errorf("the cluster exited during start-up (%v):\n%s", err, tail)
		case <-deadline:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			return fmt.Errorf("no cluster within the deadline; see %s", logPath)
		case <-tick.C:
		}
		if info, err := os.ReadFile(filepath.Join(o.Dir, infoFile)); err == nil {
			fmt.Fprintf(stdout, "%sIts own log: %s\nStop: `make cluster-down` (or bin/kvcluster down --dir %s).\n", info, logPath, o.Dir)
			return nil
		}
	}
}

// runDown stops the cluster whose pid file is in --dir and waits for it to
// exit.
func runDown(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvcluster down", flag.ContinueOnError)
	cli.Usage(fs, "kvcluster down [--dir DIR]", "Stops the cluster started with --detach from DIR and waits until its pods are gone.")
	dir := fs.String("dir", "out/cluster", "the cluster's directory")
	wait := fs.Duration("timeout", 30*time.Second, "how long to wait for it to exit")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	pid, ok := running(abs)
	if !ok {
		fmt.Fprintf(stdout, "kvcluster: no cluster running from %s\n", abs)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(*wait)
	for alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d still runs after %v; see %s", pid, *wait, filepath.Join(abs, logFile))
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(stdout, "kvcluster: stopped (pid %d); logs kept in %s\n", pid, filepath.Join(abs, "logs"))
	return nil
}

// running returns the pid in dir's pid file when that process is alive and
// is a kvcluster (a pid can be reused after a crash).
func running(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && !strings.Contains(string(cmdline), "kvcluster") {
		return 0, false
	}
	return pid, true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no procfs: trust kill(0)
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}
