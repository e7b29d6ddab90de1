package chaos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// delayer holds the packets an NFQUEUE rule hands it for a fixed time,
// then lets them go: netem's delay in user space, for kernels without
// sch_netem. It speaks the nfnetlink_queue protocol directly (the kernel's
// include/uapi/linux/netfilter/nfnetlink_queue.h): bind a queue, read
// packet ids, send an accept verdict per id after the delay. Packet
// contents are never copied (copy mode META).
type delayer struct {
	fd    int
	queue uint16
	delay time.Duration

	mu      sync.Mutex // serialises verdict sends
	closed  chan struct{}
	wg      sync.WaitGroup // the read loop
	pending sync.WaitGroup // verdicts not yet sent
}

// nfnetlink_queue constants (linux/netfilter/nfnetlink*.h).
const (
	nfnlSubsysQueue   = 3
	nfqnlMsgPacket    = 0
	nfqnlMsgVerdict   = 1
	nfqnlMsgConfig    = 2
	nfqaCfgCmd        = 1
	nfqaCfgParams     = 2
	nfqaPacketHdr     = 1
	nfqaVerdictHdr    = 2
	nfqnlCfgCmdBind   = 1
	nfqnlCopyMeta     = 1
	nfAccept          = 1
	nlmsgHdrLen       = 16
	nfgenHdrLen       = 4
	nlmsgTypeError    = 2
	nlmsgFlagsRequest = 1
	nlmsgFlagsAck     = 4
)

// startDelayer opens a netlink socket inside the network namespace at
// nsPath, binds queue and starts delaying its packets. Its goroutine exits
// on Close.
func startDelayer(nsPath string, queue uint16, delay time.Duration) (*delayer, error) {
	fd, err := socketIn(nsPath)
	if err != nil {
		return nil, err
	}
	d := &delayer{fd: fd, queue: queue, delay: delay, closed: make(chan struct{})}
	// Reads wake up every 200ms to notice Close.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nfqueue: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20) // best effort
	cmd := []byte{nfqnlCfgCmdBind, 0, 0, unix.AF_INET}
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, 0xffff)
	params[4] = nfqnlCopyMeta
	for _, a := range [][]byte{attr(nfqaCfgCmd, cmd), attr(nfqaCfgParams, params)} {
		if err := d.request(nfqnlMsgConfig, a); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	d.wg.Go(d.loop)
	return d, nil
}

// socketIn creates a netfilter netlink socket in the namespace at nsPath
// (a socket stays in the namespace it was created in). The switch happens
// on a locked thread that is switched back before it is unlocked. If the
// switch back fails the thread stays locked and dies with the goroutine;
// that must stay the exception, since a child process started from that
// thread gets its Pdeathsig SIGKILL when the thread exits.
func socketIn(nsPath string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("nfqueue: %w", err)}
			return
		}
		defer orig.Close()
		f, err := os.Open(nsPath)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("nfqueue: %w", err)}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("nfqueue: setns %s: %w", nsPath, err)}
			return
		}
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		}
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			ch <- result{-1, fmt.Errorf("nfqueue: netlink socket: %w", err)}
			return
		}
		ch <- result{fd, nil}
	}()
	r := <-ch
	return r.fd, r.err
}

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, val []byte) []byte {
	n := 4 + len(val)
	b := make([]byte, (n+3)&^3)
	binary.LittleEndian.PutUint16(b, uint16(n))
	binary.LittleEndian.PutUint16(b[2:], typ)
	copy(b[4:], val)
	return b
}

// message builds an nfnetlink_queue message for this queue.
func (d *delayer) message(msg uint16, flags uint16, attrs ...[]byte) []byte {
	n := nlmsgHdrLen + nfgenHdrLen
	for _, a := range attrs {
		n += len(a)
	}
	b := make([]byte, nlmsgHdrLen+nfgenHdrLen, n)
	binary.LittleEndian.PutUint32(b, uint32(n))
	binary.LittleEndian.PutUint16(b[4:], nfnlSubsysQueue<<8|msg)
	binary.LittleEndian.PutUint16(b[6:], flags)
	b[16] = unix.AF_UNSPEC
	binary.BigEndian.PutUint16(b[18:], d.queue)
	for _, a := range attrs {
		b = append(b, a...)
	}
	return b
}

// request sends a config message and waits for its ack.
func (d *delayer) request(msg uint16, a []byte) error {
	if err := unix.Sendto(d.fd, d.message(msg, nlmsgFlagsRequest|nlmsgFlagsAck, a), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("nfqueue config: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(d.fd, buf, 0)
	if err != nil {
		return fmt.Errorf("nfqueue config ack: %w", err)
	}
	if n >= nlmsgHdrLen+4 && binary.LittleEndian.Uint16(buf[4:]) == nlmsgTypeError {
		if code := int32(binary.LittleEndian.Uint32(buf[16:])); code != 0 {
			return fmt.Errorf("nfqueue config queue %d: %w", d.queue, unix.Errno(-code))
		}
	}
	return nil
}

// loop reads queued packets until Close and schedules their verdicts.
func (d *delayer) loop() {
	buf := make([]byte, 1<<16)
	for {
		select {
		case <-d.closed:
			return
		default:
		}
		n, _, err := unix.Recvfrom(d.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue // timeout tick, or the kernel dropped some: they bypass or drop, as netem's limit would
			}
			return
		}
		for _, id := range packetIDs(buf[:n]) {
			d.pending.Add(1)
			time.AfterFunc(d.delay, func() { defer d.pending.Done(); d.accept(id) })
		}
	}
}

// packetIDs extracts the packet ids of every NFQNL_MSG_PACKET in b.
func packetIDs(b []byte) []uint32 {
	var ids []uint32
	for len(b) >= nlmsgHdrLen {
		n := int(binary.LittleEndian.Uint32(b))
		if n < nlmsgHdrLen || n > len(b) {
			break
		}
		typ := binary.LittleEndian.Uint16(b[4:])
		if typ == nfnlSubsysQueue<<8|nfqnlMsgPacket && n >= nlmsgHdrLen+nfgenHdrLen {
			as := b[nlmsgHdrLen+nfgenHdrLen : n]
			for len(as) >= 4 {
				l := int(binary.LittleEndian.Uint16(as))
				t := binary.LittleEndian.Uint16(as[2:]) & 0x3fff
				if l < 4 || l > len(as) {
					break
				}
				if t == nfqaPacketHdr && l >= 8 {
					ids = append(ids, binary.BigEndian.Uint32(as[4:]))
				}
				as = as[min((l+3)&^3, len(as)):]
			}
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return ids
}

// accept releases one packet.
func (d *delayer) accept(id uint32) {
	v := make([]byte, 8)
	binary.BigEndian.PutUint32(v, nfAccept)
	binary.BigEndian.PutUint32(v[4:], id)
	d.mu.Lock()
	defer d.mu.Unlock()
	_ = unix.Sendto(d.fd, d.message(nfqnlMsgVerdict, nlmsgFlagsRequest, attr(nfqaVerdictHdr, v)), 0,
		&unix.SockaddrNetlink{Family: unix.AF_NETLINK}) // a lost verdict: the kernel drops the packet at queue teardown
}

// Close stops reading, lets every held packet go after its delay, and
// closes the socket. Remove the NFQUEUE rules first: a packet queued after
// the read loop stopped would wait for the socket to close and be dropped.
func (d *delayer) Close() {
	select {
	case <-d.closed:
		return
	default:
	}
	close(d.closed)
	d.wg.Wait()
	d.pending.Wait()
	unix.Close(d.fd)
}
