package forward

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
)

// RetryConfig bounds how a request is retried before its first response
// byte reaches the client (docs/design.md D5).
type RetryConfig struct {
	// MaxAttempts counts every try, the final local one included.
	// Default 3: the chosen peer, the next candidate, then local vLLM.
	MaxAttempts int
}

// UpstreamStatusError is an upstream answer that means "try elsewhere":
// a peer that is draining or overloaded answered 503 before any body byte
// was written to the client.
type UpstreamStatusError struct {
	Peer   string
	Status int
}

func (e *UpstreamStatusError) Error() string {
	return "upstream " + e.Peer + " answered " + http.StatusText(e.Status)
}

// retryable reports whether a failed attempt may be tried again on the next
// candidate. It is called only before anything has reached the client
// (ReverseProxy writes nothing until RoundTrip returns), and says yes only
// for failures where the upstream cannot have started serving the request:
// the connection was never made (dial), was refused, reset or closed before
// a response, or the upstream refused the work (503). A client that went
// away is never retried.
func retryable(err error, attempt int, c RetryConfig) bool {
	if err == nil || attempt+1 >= c.MaxAttempts {
		return false
	}
	if errors.Is(err, errEngineDown) { // abandoned at a hung engine: it never answered
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var st *UpstreamStatusError
	if errors.As(err, &st) {
		return st.Status == 503
	}
	if dialFailed(err) {
		return true
	}
	// EOF before a response: the upstream died with the request in hand
	// (an engine killed mid-prefill). Generation has no side effects, so
	// another pod may serve it.
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// dialFailed reports whether err is an attempt that could not connect:
// nothing of the request reached the upstream.
func dialFailed(err error) bool {
	var op *net.OpError
	return err != nil && (errors.As(err, &op) && op.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED))
}
