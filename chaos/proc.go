package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is one child process in its own process group. Its waiter goroutine
// reaps it and exits when the process does; done is closed then.
type proc struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc // SIGTERM, then SIGKILL after the grace period
	done   chan struct{}
	err    error // Wait's result, valid once done is closed
	log    *os.File
}

// startProc starts bin with args, its stdout and stderr appended to logPath.
// The process outlives the caller's contexts: only stop or signal end it.
func startProc(name, bin string, args []string, env []string, logPath string, grace time.Duration) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	fmt.Fprintf(lf, "# chaos: %s start %s\n", time.Now().Format(time.RFC3339Nano), name)
	// The context is the process's own, cancelled by stop: exec then
	// delivers Cancel (SIGTERM to the group) and, WaitDelay later, SIGKILL.
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = grace
	if err := cmd.Start(); err != nil {
		cancel()
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, cancel: cancel, done: make(chan struct{}), log: lf}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(lf, "# chaos: %s exit %s: %v\n", time.Now().Format(time.RFC3339Nano), name, p.err)
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has been reaped.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop SIGTERMs the process, SIGKILLs it after the grace period, and
// returns once it is reaped.
func (p *proc) stop() {
	p.cancel()
	<-p.done
}

// kill SIGKILLs the process and returns once it is reaped.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill() // ErrProcessDone: already gone, which is the goal
	p.cancel()
	<-p.done
}

// signal sends sig to the process. Signals go to the process, not its
// group: os.Process signals through a pidfd, so a reaped pid that the
// kernel reused can never be hit, and the binaries start no children.
func (p *proc) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}
