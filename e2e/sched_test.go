package e2e

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// schedLine is one line of `perf sched timehist`: a task leaving a CPU,
// with how long it had waited to run after it was woken (sch delay).
var schedLine = regexp.MustCompile(`^\s*[\d.]+\s+\[(\d+)\]\s+(.+?)\[\d+(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$`)

// schedDelays reads `perf sched timehist` output and returns, per task
// name and CPU, the delays from wake-up to running, in order of first
// appearance. A delay is what a woken process (a sidecar reading a
// request, an engine answering) waits for a CPU held by another.
func schedDelays(r io.Reader) (names []string, delays map[string][]time.Duration, err error) {
	delays = map[string][]time.Duration{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := schedLine.FindStringSubmatch(sc.Text())
		if m == nil || m[2] == "<idle>" {
			continue
		}
		ms, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			return nil, nil, fmt.Errorf("sch delay %q: %v", m[4], err)
		}
		cpu, _ := strconv.Atoi(m[1])
		key := fmt.Sprintf("%s on cpu %d", strings.TrimSpace(m[2]), cpu)
		if _, ok := delays[key]; !ok {
			names = append(names, key)
		}
		delays[key] = append(delays[key], time.Duration(ms*float64(time.Millisecond)))
	}
	return names, delays, sc.Err()
}

// schedTable is schedDelays as a table, busiest task first, leaving out
// tasks switched in fewer than min times.
func schedTable(names []string, delays map[string][]time.Duration, min int) string {
	names = slices.Clone(names)
	sort.SliceStable(names, func(i, j int) bool { return len(delays[names[i]]) > len(delays[names[j]]) })
	var b strings.Builder
	fmt.Fprintf(&b, "%-26s %10s %9s %9s %9s %9s %9s\n", "task", "runs", "p50", "p99", "p99.9", "max", "over 1ms")
	for _, n := range names {
		ds := delays[n]
		if len(ds) < min {
			continue
		}
		over := 0
		for _, d := range ds {
			if d > time.Millisecond {
				over++
			}
		}
		µs := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + "µs" }
		fmt.Fprintf(&b, "%-26s %10d %9s %9s %9s %9s %9d\n", n, len(ds), µs(percentile(ds, 50)), µs(percentile(ds, 99)),
			µs(percentile(ds, 99.9)), µs(slices.Max(ds)), over)
	}
	return b.String()
}
