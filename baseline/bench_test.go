package baseline

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/route"
)

// benchPods is 8 pods with some load, as a benchmark run has.
func benchPods() []Pod {
	pods := podsWith(3, 1, 4, 1, 5, 9, 2, 6)
	for i := range pods {
		pods[i].Load = Load{Waiting: float64(i % 3), KVUsage: float64(i) / 10}
	}
	return pods
}

func BenchmarkPick(b *testing.B) {
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprintf("pod%d", i+1)
	}
	text := strings.Repeat("a 4k-character prompt shared by a whole conversation.. ", 75)
	tokens := make([]uint32, 1024)
	for i := range tokens {
		tokens[i] = uint32(i * 31)
	}
	ms := make([]route.Matcher, 8)
	for i := range ms {
		ms[i] = prefixMatcher(i * 8)
	}
	policies := []struct {
		name string
		p    Policy
	}{
		{NameRoundRobin, &RoundRobin{}},
		{NameLeastLoaded, LeastLoaded{}},
		{NameCHWBL, NewCHWBL(names, CHWBLConfig{})},
		{NameApproxPrefix, NewApproxPrefix(8, ApproxConfig{}, rand.New(rand.NewPCG(1, 1)))},
		{NameCentralPrecise, NewPrecise(DefaultPreciseConfig("m"), ms)},
	}
	req := Request{Model: "m", FirstUser: text, Input: text, Tokens: tokens}
	pods := benchPods()
	for _, tc := range policies {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.p.Pick(req, pods, t0)
			}
		})
	}
}
