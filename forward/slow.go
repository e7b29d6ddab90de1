package forward

import (
	"errors"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
)

// Slow clients (Config.BodyTimeout, Config.WriteTimeout).
//
// A client's body is read whole before anything is proxied, under a read
// deadline of BodyTimeout from the request's headers: a body trickled in
// holds at most MaxBodyBytes of sidecar memory for at most that long, and
// never an engine slot. An answer is written to the client under a write
// deadline that each write renews to WriteTimeout: a client that stops
// reading a stream blocks a write once the socket's buffers are full, the
// write fails at the deadline, and ReverseProxy aborts the request, which
// closes the upstream connection, so the engine cancels the request and
// frees its slot. Forwarded requests (hops) come from a sidecar holding
// the whole body and are not bounded here: their sender's client is.

// bodyTimeoutKind and writeTimeoutKind are the request_errors_total kinds
// of clients cut off for slowness.
const (
	bodyTimeoutKind  = "body_timeout"
	writeTimeoutKind = "write_timeout"
)

// readClientBody is readRequest under Config.BodyTimeout, counted from
// the request's arrival; a body not in by then is answered 408.
func (h *Handler) readClientBody(c *gin.Context) ([]byte, bool) {
	if h.cfg.BodyTimeout <= 0 {
		return h.readRequest(c)
	}
	rc := http.NewResponseController(c.Writer)
	if err := rc.SetReadDeadline(h.now().Add(h.cfg.BodyTimeout)); err != nil {
		return h.readRequest(c) // a writer without deadlines (a test's recorder)
	}
	body, err := readBody(c.Writer, c.Request, h.cfg.MaxBodyBytes)
	// Lifted at once: a read past the deadline cancels the request, and
	// net/http lifts it only when its own read of the connection starts,
	// at the body's EOF, which a body read to its Content-Length may not
	// have hit yet.
	rc.SetReadDeadline(time.Time{})
	if err == nil {
		return body, true
	}
	if isTimeout(err) {
		h.metrics.badRequests.WithLabelValues(bodyTimeoutKind, apiOf(c).String()).Inc()
		c.Header("Connection", "close")
		writeError(c, http.StatusRequestTimeout, "request body not received within "+h.cfg.BodyTimeout.String())
		return nil, false
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		h.tooLarge(c)
		return nil, false
	}
	h.metrics.badRequests.WithLabelValues("read", apiOf(c).String()).Inc()
	writeError(c, http.StatusBadRequest, "could not read request body: "+err.Error())
	return nil, false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// slowReaderBound returns c's writer under Config.WriteTimeout, kept in w
// (the request's state: no allocation of its own); without a bound, or
// when the connection cannot take a deadline, the writer itself. The
// deadline stays on through net/http's last flush of the answer (a client
// that stops reading for its last bytes is cut off too), and the server
// lifts it before the connection's next request.
func (h *Handler) slowReaderBound(c *gin.Context, w *deadlineWriter) http.ResponseWriter {
	if h.cfg.WriteTimeout <= 0 {
		return c.Writer
	}
	// The controller is held by value, and the timeout is counted through
	// h and c, not a closure over them.
	*w = deadlineWriter{ResponseWriter: c.Writer, rc: *http.NewResponseController(c.Writer),
		timeout: h.cfg.WriteTimeout, h: h, c: c}
	if !w.renew() {
		return c.Writer
	}
	return w
}

// deadlineWriter renews the connection's write deadline before a write or
// flush once a quarter of the timeout has passed since the last renewal
// (setting it costs a timer update, not worth doing per SSE event): every
// write may block for between 3/4 of the timeout and all of it.
type deadlineWriter struct {
	http.ResponseWriter
	rc      http.ResponseController
	timeout time.Duration
	set     time.Time // when the deadline was last renewed
	// h counts the first write that timed out, for c's API.
	h    *Handler
	c    *gin.Context
	once atomic.Bool
}

func (w *deadlineWriter) renew() bool {
	now := w.h.now()
	if !w.set.IsZero() && now.Sub(w.set) < w.timeout/4 {
		return true
	}
	if err := w.rc.SetWriteDeadline(now.Add(w.timeout)); err != nil {
		return false
	}
	w.set = now
	return true
}

func (w *deadlineWriter) check(err error) {
	if err != nil && isTimeout(err) && w.once.CompareAndSwap(false, true) {
		w.h.metrics.badRequests.WithLabelValues(writeTimeoutKind, apiOf(w.c).String()).Inc()
	}
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	w.renew()
	n, err := w.ResponseWriter.Write(b)
	w.check(err)
	return n, err
}

// Flush is what ReverseProxy calls after each SSE event (through
// http.ResponseController, which finds it here).
func (w *deadlineWriter) FlushError() error {
	w.renew()
	err := w.rc.Flush()
	w.check(err)
	return err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
