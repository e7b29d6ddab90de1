package forward

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// A body written through a dialed connection arrives whole and in order,
// and the copy borrows its buffer instead of allocating 32 KiB for it.
func TestBodyConnCopiesThroughPool(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	// Allocated here, before the count: the test counts the process's
	// allocations.
	recv := bytes.NewBuffer(make([]byte, 0, 2<<20))
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		io.Copy(recv, c)
		got <- recv.Bytes()
	}()
	d := &httpDialer{timeout: time.Second, bufs: &copyBuffers{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	rf, ok := c.(io.ReaderFrom)
	if !ok {
		t.Fatalf("%T is no io.ReaderFrom", c)
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), 10_000) // 160 KB, five buffers
	var sent int64
	// What net/http passes: the body behind a LimitedReader. Bytes, not
	// allocations, tell a new 32 KiB buffer from the pool's.
	const runs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		n, err := rf.ReadFrom(io.LimitReader(bytes.NewReader(body[:64<<10]), 64<<10))
		if err != nil {
			t.Fatal(err)
		}
		sent += n
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 24<<10 {
		t.Errorf("ReadFrom allocated %d bytes per body; want the pool's buffer, not a new one", per)
	}
	n, err := rf.ReadFrom(io.LimitReader(bytes.NewReader(body), int64(len(body))))
	if err != nil || n != int64(len(body)) {
		t.Fatalf("ReadFrom = %d, %v; want %d", n, err, len(body))
	}
	sent += n
	c.Close()
	b := <-got
	if int64(len(b)) != sent || !bytes.Equal(b[len(b)-len(body):], body) {
		t.Fatalf("received %d bytes; want %d ending in the body", len(b), sent)
	}
}

// TestCopyBuffersReuse checks that a buffer given back is lent again
// whole, and that the round trip allocates nothing.
func TestCopyBuffersReuse(t *testing.T) {
	var b copyBuffers
	buf := b.Get()
	if len(buf) != copyBufferSize {
		t.Fatalf("len %d; want %d", len(buf), copyBufferSize)
	}
	if n := testing.AllocsPerRun(100, func() { b.Put(b.Get()) }); n != 0 {
		t.Errorf("Get and Put allocate %v times", n)
	}
	b.Put(buf[:10]) // a copy's slice of it: the whole buffer comes back
	if got := b.Get(); len(got) != copyBufferSize {
		t.Errorf("after a short Put: len %d; want %d", len(got), copyBufferSize)
	}
}
