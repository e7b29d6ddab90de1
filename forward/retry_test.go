package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestRetryable(t *testing.T) {
	c := RetryConfig{MaxAttempts: 3}
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	tests := []struct {
		name    string
		err     error
		attempt int
		want    bool
	}{
		{"nil", nil, 0, false},
		{"dial refused", dial, 0, true},
		{"wrapped dial", fmt.Errorf("forward: %w", dial), 1, true},
		{"reset before response", reset, 0, true},
		{"closed before response", fmt.Errorf("read: %w", io.EOF), 0, true},
		{"cut before response", io.ErrUnexpectedEOF, 1, true},
		{"attempts exhausted", dial, 2, false},
		{"peer 503", &UpstreamStatusError{Peer: "p", Status: 503}, 0, true},
		{"peer 500", &UpstreamStatusError{Peer: "p", Status: 500}, 0, false},
		{"client canceled", context.Canceled, 0, false},
		{"wrapped cancel", fmt.Errorf("x: %w", context.Canceled), 0, false},
		{"timeout reading", errors.New("some read error"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryable(tt.err, tt.attempt, c); got != tt.want {
				t.Errorf("retryable(%v, %d) = %v; want %v", tt.err, tt.attempt, got, tt.want)
			}
		})
	}
}
