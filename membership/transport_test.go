package membership

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

func startTransport(t testing.TB) *transport {
	t.Helper()
	tr, err := newTransport("127.0.0.1", 0, nil, func(err error) { t.Errorf("transport: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown() })
	return tr
}

func recvPacket(t testing.TB, tr *transport) *memberlist.Packet {
	t.Helper()
	select {
	case p := <-tr.PacketCh():
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no packet within 5 s")
		return nil
	}
}

// Each packet arrives whole, from its sender, in a buffer of its own size
// that the next packet does not touch (memberlist may keep one).
func TestTransportPackets(t *testing.T) {
	a, b := startTransport(t), startTransport(t)
	to := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port()))
	first, second := []byte("a load report of about this size"), bytes.Repeat([]byte{0xee}, 1400)
	for _, msg := range [][]byte{first, second} {
		if _, err := a.WriteTo(msg, to); err != nil {
			t.Fatal(err)
		}
	}
	p1, p2 := recvPacket(t, b), recvPacket(t, b)
	for i, c := range []struct {
		p    *memberlist.Packet
		want []byte
	}{{p1, first}, {p2, second}} {
		if !bytes.Equal(c.p.Buf, c.want) || cap(c.p.Buf) >= maxPacket {
			t.Errorf("packet %d: %d bytes (cap %d); want %d bytes in a buffer of about that size", i+1, len(c.p.Buf), cap(c.p.Buf), len(c.want))
		}
		if c.p.From.String() != net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port())) || c.p.Timestamp.IsZero() {
			t.Errorf("packet %d: from %v at %v; want a's port and a time", i+1, c.p.From, c.p.Timestamp)
		}
	}
}

// A dialed stream reaches the listener's StreamCh with its bytes.
func TestTransportStreams(t *testing.T) {
	a, b := startTransport(t), startTransport(t)
	c, err := a.DialAddressTimeout(memberlist.Address{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port()))}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() { c.Write([]byte("push-pull")); c.Close() }()
	select {
	case s := <-b.StreamCh():
		got, _ := io.ReadAll(s)
		s.Close()
		if string(got) != "push-pull" {
			t.Errorf("stream carried %q; want push-pull", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no stream within 5 s")
	}
}

// The advertised address is the one given, else the bound one, with the
// port picked when bound to port 0.
func TestTransportAdvertise(t *testing.T) {
	tr := startTransport(t)
	if ip, port, err := tr.FinalAdvertiseAddr("10.1.2.3", 7946); err != nil || ip.String() != "10.1.2.3" || port != 7946 {
		t.Errorf("given: %v %d %v; want 10.1.2.3 7946", ip, port, err)
	}
	if ip, port, err := tr.FinalAdvertiseAddr("", 0); err != nil || ip.String() != "127.0.0.1" || port != tr.Port() {
		t.Errorf("bound: %v %d %v; want 127.0.0.1 %d", ip, port, err, tr.Port())
	}
	if _, _, err := tr.FinalAdvertiseAddr("not-an-ip", 1); err == nil {
		t.Error("a bad advertise address was accepted")
	}
	if _, err := newTransport("nowhere", 0, nil, nil); err == nil {
		t.Error("a bad bind address was accepted")
	}
}

// BenchmarkTransportPacket receives ~100-byte packets (a load report's
// size) through memberlist's NetTransport and through transport: B/op is
// what each allocates per packet.
func BenchmarkTransportPacket(b *testing.B) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: newStdLogger(zerolog.Nop())})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nt.Shutdown() })
	ours := startTransport(b)
	msg := bytes.Repeat([]byte{1}, 100)
	for _, c := range []struct {
		name string
		tr   memberlist.Transport
		port int
	}{{"net", nt, nt.GetAutoBindPort()}, {"ours", ours, ours.Port()}} {
		b.Run(c.name, func(b *testing.B) {
			to := net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ours.WriteTo(msg, to); err != nil {
					b.Fatal(err)
				}
				<-c.tr.PacketCh()
			}
		})
	}
}
