//go:build integration

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/gossip"
)

// BenchmarkSidecarMemory64Peers measures one real sidecar's resident memory
// in a mesh of 64: the sidecar (with its simulator) plus 63 in-process
// gossip meshes, each publishing a full digest of 100k random keys sized
// for 100k blocks at 1% (bloom.ParamsFor(100_000, 0.01), ~117 KiB). The
// sidecar's own digest is sized the same (--capacity-blocks 100000). It
// reports VmRSS and VmHWM from /proc once all 64 peers show a digest and
// again after two full-digest rounds (the meshes resend every 10 s, as in
// production), plus the Go heap the sidecar's /metrics reports.
//
// The 63 meshes accept only the sidecar as a member (a memberlist
// AliveDelegate): the sidecar sees a 64-node cluster, while the test
// process is spared 63×62 digest copies (~460 MB) and their traffic, which
// would measure the test rather than the sidecar.
func BenchmarkSidecarMemory64Peers(b *testing.B) {
	const peers = 63
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 1, subnet: 3, timeScale: 1, progress: testProgress{b},
		args: []string{"--capacity-blocks", "100000"}}, b.Cleanup)
	if err != nil {
		b.Fatal(err)
	}
	pod := f.c.Pod(0)
	pid, err := pidByArg("--admin-listen", pod.Admin)
	if err != nil {
		b.Fatal(err)
	}
	rss0, hwm0 := procMem(b, pid)

	params := bloom.ParamsFor(100_000, 0.01)
	rng := seeded(b.Name())
	meshes := make([]*gossip.Mesh, peers)
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, m := range meshes {
			if m != nil {
				wg.Go(func() { m.Shutdown() })
			}
		}
		wg.Wait()
	})
	host := subnet(4)
	var joinWG sync.WaitGroup
	errs := make([]error, peers)
	for i := range peers {
		name := fmt.Sprintf("peer%02d", i)
		ip := fmt.Sprintf("%s.%d", host, i+2)
		cfg := gossip.DefaultConfig()
		cfg.NodeName = name
		cfg.BindAddr, cfg.AdvertiseAddr, cfg.BindPort = ip, ip, 7946
		cfg.APIAddr = net.JoinHostPort(ip, "8000")
		cfg.Models = []string{model}
		cfg.Label = "kvroute" // the sidecar's default --cluster-label; no secret on either side
		cfg.Join = []string{pod.Gossip}
		cfg.Memberlist = func(mc *memberlist.Config) { mc.Alive = onlyMembers{name, pod.Name} }
		keys := make([]blockkey.Key, 100_000)
		for k := range keys {
			keys[k] = blockkey.Key(rng.Uint64())
		}
		d := bloom.Build(bloom.Header{Node: name, Epoch: 1, Version: 1, Params: params}, keys)
		joinWG.Go(func() {
			m, err := gossip.Join(ctx, cfg)
			if err != nil {
				errs[i] = err
				return
			}
			meshes[i] = m
			errs[i] = m.PublishDigest(d)
		})
	}
	joinWG.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	begin := time.Now()
	waitFor(b, 60*time.Second, "64 peers with digests", func(ctx context.Context) (bool, string) {
		ps, err := f.peers(ctx, pod.Admin)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, p := range ps {
			if p.HasDigest {
				n++
			}
		}
		return len(ps) == peers+1 && n == peers+1, fmt.Sprintf("%d peers, %d with a digest", len(ps), n)
	})
	settled := time.Since(begin)
	b.ResetTimer()
	rss1, hwm1 := procMem(b, pid)
	heap1 := metricValue(f.metrics1(b), "go_memstats_heap_inuse_bytes")

	// Two rounds of full digests from every peer (FullDigestInterval 10 s)
	// and from the sidecar to every peer.
	steady := time.NewTimer(21 * time.Second)
	<-steady.C
	rss2, hwm2 := procMem(b, pid)
	heap2 := metricValue(f.metrics1(b), "go_memstats_heap_inuse_bytes")
	b.StopTimer()

	mib := func(kb int) float64 { return float64(kb) / 1024 }
	b.ReportMetric(mib(rss1), "MiB-rss-at-64")
	b.ReportMetric(mib(hwm2), "MiB-hwm")
	b.ReportMetric(mib(rss2), "MiB-rss-steady")
	// Printed, not logged: go test cuts a benchmark's log to a few lines.
	fmt.Printf("\nsidecar pid %d, digest %d bits (%.0f KiB) x %d peers; all digests in %v\n"+
		"%-34s %9s %9s %12s\n%-34s %8.1fM %8.1fM %12s\n%-34s %8.1fM %8.1fM %11.1fM\n%-34s %8.1fM %8.1fM %11.1fM",
		pid, params.M, float64(params.M)/8/1024, peers+1, settled.Round(time.Millisecond),
		"", "VmRSS", "VmHWM", "Go heap",
		"alone (before the peers)", mib(rss0), mib(hwm0), "",
		"64 peers with digests", mib(rss1), mib(hwm1), heap1/(1<<20),
		"after 2 full-digest rounds (21 s)", mib(rss2), mib(hwm2), heap2/(1<<20))
	fmt.Println()
}

// metrics1 is metrics for a benchmark (pod 0).
func (f *fixture) metrics1(b *testing.B) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := f.do(ctx, "GET", f.c.Pod(0).Admin, "/metrics", nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return string(r.Body)
}

// onlyMembers is a memberlist AliveDelegate that admits only the named
// nodes to the local member list.
type onlyMembers struct{ self, sidecar string }

func (o onlyMembers) NotifyAlive(n *memberlist.Node) error {
	if n.Name == o.self || n.Name == o.sidecar {
		return nil
	}
	return errors.New("not a member this benchmark peer talks to")
}

// pidByArg finds the process whose command line holds flag followed by
// value (the harness does not expose pids).
func pidByArg(flag, value string) (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue // the process ended
		}
		args := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
		for i := 0; i+1 < len(args); i++ {
			if string(args[i]) == flag && string(args[i+1]) == value {
				return strconv.Atoi(filepath.Base(d))
			}
		}
	}
	return 0, fmt.Errorf("no process with %s %s", flag, value)
}

// procMem returns VmRSS and VmHWM of pid, in KiB.
func procMem(b *testing.B, pid int) (rssKB, hwmKB int) {
	b.Helper()
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.Atoi(f[0])
		switch k {
		case "VmRSS":
			rssKB = n
		case "VmHWM":
			hwmKB = n
		}
	}
	return rssKB, hwmKB
}
