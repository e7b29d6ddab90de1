package forward

import (
	"context"
	"net"
	"time"
)

// httpDialer bounds connection set-up, so a dead peer costs one short
// timeout before the next candidate is tried.
type httpDialer struct {
	timeout time.Duration
}

func (d *httpDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := net.Dialer{Timeout: d.timeout, KeepAlive: 30 * time.Second}
	return nd.DialContext(ctx, network, addr)
}
