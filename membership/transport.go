package membership

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// transport is memberlist's NetTransport (net_transport.go, v0.7.0) with
// one change: a received packet is handed on in a buffer of its own size.
// NetTransport allocates 64 KiB for every UDP packet it reads and passes
// that buffer on, because memberlist may keep a packet after handling it.
// A load report is ~100 bytes, so in a 4-pod mesh at 20 requests a second
// those buffers were 71% of a sidecar's allocations (156 of 220 MB in
// 40 s) and most of its 3 GCs a second. Here one read buffer is reused
// and each packet is copied out of it. Streams (TCP) are NetTransport's as
// they were.
type transport struct {
	bytes    *sockBytes
	bind     net.IP
	tcp      *net.TCPListener
	udp      *net.UDPConn
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	wg       sync.WaitGroup
	closing  atomic.Bool
	failures func(error) // a listener's read or accept error, while not shutting down
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// sockBytes counts the bytes a transport moves, both ways: what the scale
// harness reports as the mesh's whole upkeep, memberlist's included.
type sockBytes struct{ sent, recv atomic.Uint64 }

// countedConn counts a TCP stream's bytes into b.
type countedConn struct {
	net.Conn
	b *sockBytes
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.b.recv.Add(uint64(n))
	return n, err
}

func (c countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.b.sent.Add(uint64(n))
	return n, err
}

// maxPacket is the largest UDP payload.
const maxPacket = 65536

// udpRecvBuf is the socket receive buffer asked for, as NetTransport does:
// bursts of packets wait there while memberlist handles one.
const udpRecvBuf = 2 << 20

// newTransport listens on addr:port by TCP and UDP (port 0: one the
// kernel picks for TCP, then the same for UDP), counting the bytes it
// moves into b (nil: not counted). failures is told of read and accept
// errors; nil ignores them.
func newTransport(addr string, port int, b *sockBytes, failures func(error)) (*transport, error) {
	if b == nil {
		b = &sockBytes{}
	}
	ip := net.ParseIP(addr)
	if ip == nil {
		return nil, fmt.Errorf("gossip transport: bind address %q is not an IP", addr)
	}
	// On port 0 the UDP port the kernel gave TCP may be taken: try again,
	// ten times as memberlist does for its own transport.
	tries := 1
	if port == 0 {
		tries = 10
	}
	var tcp *net.TCPListener
	var udp *net.UDPConn
	var err error
	for range tries {
		if tcp, udp, err = listenPair(ip, port); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gossip transport: %w", err)
	}
	for size := udpRecvBuf; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	if failures == nil {
		failures = func(error) {}
	}
	t := &transport{bytes: b, bind: ip, tcp: tcp, udp: udp, failures: failures,
		packetCh: make(chan *memberlist.Packet), streamCh: make(chan net.Conn)}
	t.wg.Add(2)
	go t.acceptLoop()
	go t.readLoop()
	return t, nil
}

// listenPair listens on ip:port by TCP, then by UDP on the port TCP got.
func listenPair(ip net.IP, port int) (*net.TCPListener, *net.UDPConn, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, nil, fmt.Errorf("TCP listener on %s port %d: %w", ip, port, err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		tcp.Close()
		return nil, nil, fmt.Errorf("UDP listener on %s port %d: %w", ip, port, err)
	}
	return tcp, udp, nil
}

// Port is the port listened on.
func (t *transport) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr implements memberlist.Transport as NetTransport does:
// ip if given, else the bind address, or a private IP of this host when
// bound to every address.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("gossip transport: advertise address %q is not an IP", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	if !t.bind.IsUnspecified() {
		return t.bind, t.Port(), nil
	}
	priv, err := sockaddr.GetPrivateIP()
	if err != nil {
		return nil, 0, fmt.Errorf("gossip transport: interface addresses: %w", err)
	}
	a := net.ParseIP(priv)
	if a == nil {
		return nil, 0, errors.New("gossip transport: no private IP address found, and no advertise address given")
	}
	return a, t.Port(), nil
}

// WriteTo implements memberlist.Transport.
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	n, err := t.udp.WriteTo(b, ua)
	t.bytes.sent.Add(uint64(n))
	return time.Now(), err
}

// PacketCh implements memberlist.Transport.
func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", a.Addr)
	if err != nil {
		return nil, err
	}
	return countedConn{c, t.bytes}, nil
}

// StreamCh implements memberlist.Transport.
func (t *transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: it closes both listeners and
// waits for their loops.
func (t *transport) Shutdown() error {
	t.closing.Store(true)
	t.tcp.Close()
	t.udp.Close()
	t.wg.Wait()
	return nil
}

// readLoop hands each packet on in a buffer of its own size.
func (t *transport) readLoop() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		at := time.Now()
		if err != nil {
			if t.closing.Load() {
				return
			}
			t.failures(fmt.Errorf("gossip transport: read: %w", err))
			continue
		}
		if n < 1 {
			continue
		}
		t.bytes.recv.Add(uint64(n))
		t.packetCh <- &memberlist.Packet{Buf: bytes.Clone(buf[:n]), From: from, Timestamp: at}
	}
}

// acceptLoop hands each TCP connection on, backing off after errors as
// NetTransport does (5 ms doubling to 1 s).
func (t *transport) acceptLoop() {
	defer t.wg.Done()
	const base, most = 5 * time.Millisecond, time.Second
	var delay time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closing.Load() {
				return
			}
			delay = min(max(2*delay, base), most)
			t.failures(fmt.Errorf("gossip transport: accept: %w", err))
			time.Sleep(delay)
			continue
		}
		delay = 0
		t.streamCh <- countedConn{c, t.bytes}
	}
}
