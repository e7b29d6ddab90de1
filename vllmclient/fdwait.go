package vllmclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// fdWait waits on Go's netpoller for a ZMQ socket to signal, through the
// socket's ZMQ_FD, instead of blocking in zmq_poll. A blocking cgo call
// holds its P, and with one P (the sidecar's --procs 1) nothing else runs
// until sysmon takes the P back: at once when busy, after up to 10 ms when
// it has backed off. The subscriber polled ~300 times a second under the
// overhead benchmark, so requests queued behind those windows.
//
// ZMQ_FD is edge-triggered: it signals that the socket's state may have
// changed, and ZMQ drains it whenever the socket's events are checked. So
// the wait checks ZMQ_EVENTS itself, after Go's poller has armed the
// descriptor (RawConn.Read clears any earlier readiness before calling its
// function): a signal after that check wakes the wait, and one before it
// shows in the events. Checking before arming lost wake-ups under load.
type fdWait struct {
	s  *zmq.Socket
	f  *os.File
	rc syscall.RawConn
}

// errNoNetpoll: the ZMQ_FD cannot be watched by Go's poller.
var errNoNetpoll = errors.New("zmq fd not pollable")

// newFDWait watches s's ZMQ_FD through a duplicate, which it owns; ZMQ
// keeps its own descriptor.
func newFDWait(s *zmq.Socket) (*fdWait, error) {
	fd, err := s.GetFd()
	if err != nil {
		return nil, fmt.Errorf("zmq fd: %w", err)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("dup zmq fd: %w", err)
	}
	syscall.CloseOnExec(dup)
	if err := syscall.SetNonblock(dup, true); err != nil {
		syscall.Close(dup)
		return nil, fmt.Errorf("zmq fd nonblock: %w", err)
	}
	f := os.NewFile(uintptr(dup), "zmq-fd")
	// A descriptor Go's poller took supports deadlines; one it refused
	// (os.NewFile then uses blocking I/O) does not.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %v", errNoNetpoll, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fdWait{s: s, f: f, rc: rc}, nil
}

// wait returns when the socket has a message to read, d has passed or ctx
// is done; in every case the caller checks the socket (or ctx) again.
func (w *fdWait) wait(ctx context.Context, d time.Duration) error {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	// After the deadline is set, so a cancellation cannot be overwritten.
	defer context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Unix(1, 0)) })()
	err := w.rc.Read(func(uintptr) bool {
		// Called once armed and after every wake-up; false waits again.
		// The descriptor is ZMQ's to read, never ours. An error (ETERM
		// at shutdown) ends the wait for the caller's poll to report.
		ev, err := w.s.GetEvents()
		return err != nil || ev&zmq.POLLIN != 0
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return err
}

func (w *fdWait) close() { w.f.Close() }
