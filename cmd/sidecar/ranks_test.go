package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
)

// The rank count in use follows what vLLM runs when the flag says more,
// says so once, and comes back with the engines; a scrape that names no
// engines changes nothing.
func TestRankCheck(t *testing.T) {
	var set []int
	var logs bytes.Buffer
	c := &rankCheck{flag: 4, set: func(n int) { set = append(set, n) }, log: zerolog.New(&logs)}
	for _, engines := range []int{0, 4, 4, 2, 2, 0, 4, 6} {
		c.observe(engines)
	}
	if d := cmp.Diff([]int{4, 2, 4}, set); d != "" {
		t.Errorf("counts set (-want +got):\n%s", d)
	}
	if n := strings.Count(logs.String(), "above the engines"); n != 1 {
		t.Errorf("%d warnings; want 1:\n%s", n, logs.String())
	}
	one := &rankCheck{flag: 1, set: func(n int) { t.Errorf("one rank: set %d", n) }, log: zerolog.Nop()}
	one.observe(3)
}
