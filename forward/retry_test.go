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
		wrote   bool
		attempt int
		want    bool
	}{
		{"nil", nil, false, 0, false},
		{"dial refused", dial, false, 0, true},
		{"wrapped dial", fmt.Errorf("forward: %w", dial), false, 1, true},
		{"reset before response", reset, false, 0, true},
		{"closed before response", fmt.Errorf("read: %w", io.EOF), false, 0, true},
		{"cut before response", io.ErrUnexpectedEOF, false, 1, true},
		{"after first byte", dial, true, 0, false},
		{"attempts exhausted", dial, false, 2, false},
		{"peer 503", &UpstreamStatusError{Peer: "p", Status: 503}, false, 0, true},
		{"peer 500", &UpstreamStatusError{Peer: "p", Status: 500}, false, 0, false},
		{"client canceled", context.Canceled, false, 0, false},
		{"wrapped cancel", fmt.Errorf("x: %w", context.Canceled), false, 0, false},
		{"timeout reading", errors.New("some read error"), false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryable(tt.err, tt.wrote, tt.attempt, c); got != tt.want {
				t.Errorf("retryable(%v, %v, %d) = %v; want %v", tt.err, tt.wrote, tt.attempt, got, tt.want)
			}
		})
	}
}
