package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Netns is the test network of netns mode: a bridge in the root namespace
// holding Subnet.1, one network namespace per pod with its own address on
// the bridge, and an egress guard. Every name it creates starts with
// Prefix, so CleanupNetns can remove what a crashed run left behind.
//
// The pod namespaces have no default route: they reach the bridge's /24
// and nothing else. The guard is the second wall: an iptables chain
// (Prefix upper-cased + "-GUARD") jumped from OUTPUT and FORWARD that drops,
// and counts, every packet from or to the /24 that would leave through an
// interface other than the bridge or lo. GuardHits reads the count; a run
// reports it and it must stay 0.
//
// Needs root (CAP_NET_ADMIN), ip(8) and iptables(8); gossip delay uses
// tc(8)'s netem where the kernel has it, else NFQUEUE and a delayer here.
type Netns struct {
	prefix, subnet string

	mu     sync.Mutex
	pods   map[string]string   // pod name → namespace
	seq    int                 // veth counter, so a replaced pod never reuses a name
	delays map[string]*delayer // user-space gossip delay per pod, without netem
}

// Bridge is the bridge's name for prefix.
func bridgeName(prefix string) string { return prefix + "br" }

// guardChain is the egress guard's iptables chain for prefix.
func guardChain(prefix string) string { return strings.ToUpper(prefix) + "-GUARD" }

// Pod-namespace chains: the partition and the gossip-loss rules.
const (
	partChain  = "CHAOS-PART"
	lossChain  = "CHAOS-LOSS"
	delayChain = "CHAOS-DELAY"
	// delayQueue is the NFQUEUE number of the user-space delay; queues are
	// per network namespace, so every pod uses the same one.
	delayQueue = 7
)

// ErrNeedRoot reports netns mode asked for without the privileges.
var ErrNeedRoot = errors.New("netns mode needs root (CAP_NET_ADMIN); use loopback mode")

// validPrefix keeps names short enough for interfaces (15 bytes with the
// veth counter) and free of shell or iptables meaning.
func validPrefix(p string) bool {
	if len(p) < 2 || len(p) > 6 {
		return false
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// SetupNetns removes leftovers of an earlier run with the same prefix,
// then creates the bridge with subnet.1/24 and the egress guard. subnet is
// the first three octets of a /24 that nothing else on the machine uses.
func SetupNetns(ctx context.Context, prefix, subnet string) (*Netns, error) {
	if !validPrefix(prefix) {
		return nil, fmt.Errorf("%w: netns prefix %q: want 2-6 of [a-z0-9]", ErrConfig, prefix)
	}
	if !validOctets(subnet) {
		return nil, fmt.Errorf("%w: netns subnet %q is not a.b.c", ErrConfig, subnet)
	}
	if syscall.Geteuid() != 0 {
		return nil, ErrNeedRoot
	}
	if _, err := CleanupNetns(ctx, prefix); err != nil {
		return nil, err
	}
	n := &Netns{prefix: prefix, subnet: subnet, pods: map[string]string{}, delays: map[string]*delayer{}}
	br, cidr := bridgeName(prefix), subnet+".0/24"
	g := guardChain(prefix)
	steps := [][]string{
		{"ip", "link", "add", br, "type", "bridge"},
		{"ip", "addr", "add", subnet + ".1/24", "dev", br},
		{"ip", "link", "set", br, "up"},
		{"iptables", "-w", "-N", g},
		// The bridge and lo are the only ways the range may take.
		{"iptables", "-w", "-A", g, "-o", br, "-j", "RETURN"},
		{"iptables", "-w", "-A", g, "-o", "lo", "-j", "RETURN"},
		{"iptables", "-w", "-A", g, "-s", cidr, "-j", "DROP"},
		{"iptables", "-w", "-A", g, "-d", cidr, "-j", "DROP"},
		{"iptables", "-w", "-I", "OUTPUT", "1", "-j", g},
		{"iptables", "-w", "-I", "FORWARD", "1", "-j", g},
	}
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			_, _ = CleanupNetns(context.WithoutCancel(ctx), prefix)
			return nil, fmt.Errorf("netns setup: %w", err)
		}
	}
	return n, nil
}

func validOctets(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || v > 255 {
			return false
		}
	}
	return true
}

// run runs one command and returns its output in the error.
func run(ctx context.Context, args ...string) error {
	_, err := output(ctx, args...)
	return err
}

func output(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.Bytes(), nil
}

// AddPod creates pod's namespace with ip on the bridge and returns the
// namespace's name. IPv6 is off inside, so nothing but the /24 exists there.
func (n *Netns) AddPod(ctx context.Context, pod, ip string) (string, error) {
	n.mu.Lock()
	n.seq++
	ns, veth := n.prefix+"-"+pod, n.prefix+"v"+strconv.Itoa(n.seq)
	n.mu.Unlock()
	in := func(args ...string) []string { return append([]string{"ip", "netns", "exec", ns}, args...) }
	steps := [][]string{
		{"ip", "netns", "add", ns},
		in("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"),
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "link", "set", veth, "master", bridgeName(n.prefix), "up"},
		{"ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		in("iptables", "-w", "-N", partChain),
		in("iptables", "-w", "-N", lossChain),
		in("iptables", "-w", "-N", delayChain),
		in("iptables", "-w", "-A", "INPUT", "-j", partChain),
		in("iptables", "-w", "-A", "OUTPUT", "-j", partChain),
		in("iptables", "-w", "-A", "OUTPUT", "-j", lossChain),
		in("iptables", "-w", "-A", "OUTPUT", "-j", delayChain),
	}
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			_ = removeNamespace(context.WithoutCancel(ctx), ns)
			return "", fmt.Errorf("add pod %s: %w", pod, err)
		}
	}
	n.mu.Lock()
	n.pods[pod] = ns
	n.mu.Unlock()
	return ns, nil
}

// RemovePod SIGKILLs whatever still runs in pod's namespace and deletes it
// (its veth goes with it): the pod's address is gone from the network.
func (n *Netns) RemovePod(ctx context.Context, pod string) error {
	n.mu.Lock()
	ns, ok := n.pods[pod]
	delete(n.pods, pod)
	d := n.delays[pod]
	delete(n.delays, pod)
	n.mu.Unlock()
	if d != nil {
		d.Close()
	}
	if !ok {
		return nil
	}
	return removeNamespace(ctx, ns)
}

func removeNamespace(ctx context.Context, ns string) error {
	if out, err := output(ctx, "ip", "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL) // only processes of our own namespace
			}
		}
	}
	return run(ctx, "ip", "netns", "del", ns)
}

// Exec is the command prefix that runs a program inside pod's namespace.
// ip(8) execs the program after setns, so the pid is the program's own.
func (n *Netns) Exec(pod string) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ns, ok := n.pods[pod]
	if !ok {
		return nil, fmt.Errorf("netns: no namespace for %s", pod)
	}
	return []string{"ip", "netns", "exec", ns}, nil
}

func (n *Netns) inPod(ctx context.Context, pod string, args ...string) error {
	pre, err := n.Exec(pod)
	if err != nil {
		return err
	}
	return run(ctx, append(pre, args...)...)
}

// Partition cuts pod from every other pod, in both directions, while the
// bridge's own address (the Service, the harness's probes) still reaches
// it: the mesh loses the member, the clients do not. on=false heals.
// Connections open across the cut stall, as they do behind a real one.
func (n *Netns) Partition(ctx context.Context, pod string, on bool) error {
	if err := n.inPod(ctx, pod, "iptables", "-w", "-F", partChain); err != nil || !on {
		return err
	}
	cidr, svc := n.subnet+".0/24", n.subnet+".1"
	rules := [][]string{
		{"-A", partChain, "-i", "lo", "-j", "RETURN"},
		{"-A", partChain, "-o", "lo", "-j", "RETURN"},
		{"-A", partChain, "-s", svc, "-j", "RETURN"},
		{"-A", partChain, "-d", svc, "-j", "RETURN"},
		{"-A", partChain, "-s", cidr, "-j", "DROP"},
		{"-A", partChain, "-d", cidr, "-j", "DROP"},
	}
	for _, r := range rules {
		if err := n.inPod(ctx, pod, append([]string{"iptables", "-w"}, r...)...); err != nil {
			return err
		}
	}
	return nil
}

// GossipLoss drops percent of the packets pod sends on the gossip port
// (memberlist UDP and TCP, both directions of a conversation); 0 clears it.
func (n *Netns) GossipLoss(ctx context.Context, pod string, port int, percent float64) error {
	if err := n.inPod(ctx, pod, "iptables", "-w", "-F", lossChain); err != nil || percent <= 0 {
		return err
	}
	p := strconv.FormatFloat(percent/100, 'f', 4, 64)
	for _, proto := range []string{"udp", "tcp"} {
		for _, dir := range []string{"--dport", "--sport"} {
			err := n.inPod(ctx, pod, "iptables", "-w", "-A", lossChain, "-p", proto, dir, strconv.Itoa(port),
				"-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP")
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// GossipDelay delays every packet pod sends on the gossip port by d; 0
// clears it. With tc's sch_netem it is an htb class with a netem child,
// selected by a u32 filter on the port, so API traffic is not slowed.
// Without netem (some kernels lack it) the same packets go through an
// NFQUEUE rule to a user-space delayer in the harness.
func (n *Netns) GossipDelay(ctx context.Context, pod string, port int, d time.Duration) error {
	_ = n.inPod(ctx, pod, "tc", "qdisc", "del", "dev", "eth0", "root") // absent unless delayed before
	if err := n.inPod(ctx, pod, "iptables", "-w", "-F", delayChain); err != nil {
		return err
	}
	n.mu.Lock()
	old := n.delays[pod]
	delete(n.delays, pod)
	n.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if d <= 0 {
		return nil
	}
	err := n.netemDelay(ctx, pod, port, d)
	if err == nil || !errors.Is(err, errNoNetem) {
		return err
	}
	return n.queueDelay(ctx, pod, port, d)
}

// errNoNetem: tc has no netem qdisc on this kernel.
var errNoNetem = errors.New("no sch_netem")

func (n *Netns) netemDelay(ctx context.Context, pod string, port int, d time.Duration) error {
	ms := strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	steps := [][]string{
		{"tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10", "r2q", "100000"},
		{"tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"},
		{"tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit"},
		{"tc", "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "netem", "delay", ms},
		{"tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
			"match", "ip", "dport", strconv.Itoa(port), "0xffff", "flowid", "1:20"},
		{"tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
			"match", "ip", "sport", strconv.Itoa(port), "0xffff", "flowid", "1:20"},
	}
	for _, s := range steps {
		if err := n.inPod(ctx, pod, s...); err != nil {
			_ = n.inPod(ctx, pod, "tc", "qdisc", "del", "dev", "eth0", "root")
			if strings.Contains(err.Error(), "qdisc kind is unknown") || strings.Contains(err.Error(), "netem") {
				return fmt.Errorf("%w: %v", errNoNetem, err)
			}
			return err
		}
	}
	return nil
}

// queueDelay starts the user-space delayer and sends the pod's gossip
// packets to it (--queue-bypass: if the delayer is gone they pass).
func (n *Netns) queueDelay(ctx context.Context, pod string, port int, d time.Duration) error {
	n.mu.Lock()
	ns := n.pods[pod]
	n.mu.Unlock()
	dl, err := startDelayer("/run/netns/"+ns, delayQueue, d)
	if err != nil {
		return fmt.Errorf("gossip delay without netem: %w", err)
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, dir := range []string{"--dport", "--sport"} {
			err := n.inPod(ctx, pod, "iptables", "-w", "-A", delayChain, "-p", proto, dir, strconv.Itoa(port),
				"-j", "NFQUEUE", "--queue-num", strconv.Itoa(delayQueue), "--queue-bypass")
			if err != nil {
				_ = n.inPod(ctx, pod, "iptables", "-w", "-F", delayChain)
				dl.Close()
				return err
			}
		}
	}
	n.mu.Lock()
	n.delays[pod] = dl
	n.mu.Unlock()
	return nil
}

// GuardHits returns how many packets the egress guard dropped so far.
func (n *Netns) GuardHits(ctx context.Context) (int64, error) {
	return guardHits(ctx, n.prefix)
}

func guardHits(ctx context.Context, prefix string) (int64, error) {
	out, err := output(ctx, "iptables", "-w", "-L", guardChain(prefix), "-v", "-x", "-n")
	if err != nil {
		return 0, err
	}
	return parseGuardHits(string(out))
}

// parseGuardHits sums the packet counters of the DROP rules in an
// `iptables -L CHAIN -v -x -n` listing.
func parseGuardHits(listing string) (int64, error) {
	var total int64
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "DROP" {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("guard counters: %q: %w", line, err)
		}
		total += v
	}
	return total, nil
}

// Close removes every namespace, the bridge and the guard (SIGKILLing
// whatever still runs in the namespaces). It returns the guard's final
// count, read just before the chain goes.
func (n *Netns) Close(ctx context.Context) (guardDrops int64, err error) {
	n.mu.Lock()
	ds := n.delays
	n.delays = map[string]*delayer{}
	n.mu.Unlock()
	for _, d := range ds {
		d.Close()
	}
	guardDrops, err = n.GuardHits(ctx)
	if _, cerr := CleanupNetns(ctx, n.prefix); cerr != nil {
		return guardDrops, errors.Join(err, fmt.Errorf("netns cleanup: %w", cerr))
	}
	return guardDrops, err
}

// CleanupNetns removes everything a netns run with prefix may have left:
// namespaces named prefix-*, with their processes, the bridge, the veths,
// and the guard chain with its jumps. It is idempotent and returns what it
// removed.
func CleanupNetns(ctx context.Context, prefix string) ([]string, error) {
	if !validPrefix(prefix) {
		return nil, fmt.Errorf("%w: netns prefix %q", ErrConfig, prefix)
	}
	var removed []string
	var errs []error
	out, err := output(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix+"-") {
			continue
		}
		if err := removeNamespace(ctx, f[0]); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "netns "+f[0])
		}
	}
	out, err = output(ctx, "ip", "-o", "link", "show")
	if err != nil {
		return removed, err
	}
	var links []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if name == bridgeName(prefix) || strings.HasPrefix(name, prefix+"v") {
			links = append(links, name)
		}
	}
	// veths first: deleting the bridge does not delete its ports.
	slices.SortFunc(links, func(a, b string) int {
		return boolCmp(a == bridgeName(prefix), b == bridgeName(prefix))
	})
	for _, l := range links {
		// A veth goes with its namespace, asynchronously: gone is fine.
		if err := run(ctx, "ip", "link", "del", l); err != nil {
			if run(ctx, "ip", "link", "show", l) == nil {
				errs = append(errs, err)
			}
		} else {
			removed = append(removed, "link "+l)
		}
	}
	g := guardChain(prefix)
	if run(ctx, "iptables", "-w", "-n", "-L", g) == nil {
		for _, hook := range []string{"OUTPUT", "FORWARD"} {
			for range 16 { // one jump per setup; bounded in case of a loop
				if run(ctx, "iptables", "-w", "-D", hook, "-j", g) != nil {
					break
				}
			}
		}
		if err := run(ctx, "iptables", "-w", "-F", g); err != nil {
			errs = append(errs, err)
		}
		if err := run(ctx, "iptables", "-w", "-X", g); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "iptables chain "+g)
		}
	}
	return removed, errors.Join(errs...)
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
