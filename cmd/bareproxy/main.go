// Command bareproxy is a bare httputil.ReverseProxy in front of one
// upstream: no parsing, no routing, no metrics. It is e2e
// BenchmarkOverhead's reference for what any Go proxy hop costs on the
// machine at hand, so the sidecar's own share of its added latency can be
// told apart from the hop's.
//
//	bareproxy --listen 127.0.0.1:8100 --upstream http://127.0.0.1:8001
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/cmd/internal/cli"
)

// buffered reads each request body whole before proxying it, as the sidecar
// does (it must, to route). Streaming the client's body through instead
// lost about one streamed answer in 400 to "use of closed network
// connection" on the upstream side under the benchmark's load.
func buffered(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// streamed passes a body on as it arrives, as the sidecar's hop does
// (behind its Content-Length and in full duplex, see forward's serveHop);
// a body without a length is read whole.
func streamed(next http.Handler) http.Handler {
	whole := buffered(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength < 0 || http.NewResponseController(w).EnableFullDuplex() != nil {
			whole.ServeHTTP(w, r)
			return
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(r.Body, r.ContentLength), r.Body}
		next.ServeHTTP(w, r)
	})
}

// pool lends ReverseProxy its copy buffers, as the sidecar's does, so the
// reference is no slower than it needs to be.
type pool struct{ p sync.Pool }

func (b *pool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *pool) Put(buf []byte) { b.p.Put(&buf) }

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Stdout, os.Stderr))
}

// options is the parsed command line.
type options struct {
	listen   string
	upstream *url.URL
	stream   bool
}

// parseFlags parses args; --help and --version print to stdout and return
// cli.ErrDone, a flag error is printed to stderr with the usage.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bareproxy", flag.ContinueOnError)
	cli.Usage(fs, "bareproxy [--listen ADDR] [--upstream URL] [--stream]",
		"A bare httputil.ReverseProxy in front of one upstream: the overhead benchmark's reference\n"+
			"for what any Go proxy hop costs on this machine.")
	listen := fs.String("listen", "127.0.0.1:8100", "address to serve on")
	upstream := fs.String("upstream", "http://127.0.0.1:8001", "base URL every request goes to")
	stream := fs.Bool("stream", false, "pass bodies on as they arrive, as the serving end of the sidecars' hop does (default: read each whole first, as the sidecar that routes must)")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	u, err := url.Parse(*upstream)
	if err != nil || u.Host == "" {
		return options{}, fmt.Errorf("--upstream %q: not an absolute URL", *upstream)
	}
	return options{listen: *listen, upstream: u, stream: *stream}, nil
}

// cmdMain is the program with its streams; it returns the exit status.
func cmdMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return cli.Fail("bareproxy", err, stderr)
	}
	// The sidecar's transport settings, so the two hops differ only in
	// what the sidecar does per request.
	tr := &http.Transport{
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		WriteBufferSize:     32 << 10,
	}
	var h http.Handler = &httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(o.upstream) },
		Transport:  tr,
		BufferPool: &pool{},
	}
	if o.stream {
		h = streamed(h)
	} else {
		h = buffered(h)
	}
	srv := &http.Server{Addr: o.listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { // exits with the process
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "bareproxy:", err)
		return 1
	}
	return 0
}
