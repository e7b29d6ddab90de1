package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNormalizeSSE(t *testing.T) {
	tests := []struct {
		name, a, b string
		same       bool
	}{
		{"ids and timestamps differ",
			`data: {"id":"cmpl-1a","object":"text_completion","created":1700000000,"choices":[{"text":"Hi"}]}` + "\n\n",
			`data: {"id":"cmpl-2b","object":"text_completion","created":1700000042,"choices":[{"text":"Hi"}]}` + "\n\n",
			true},
		{"text differs",
			`data: {"id":"a","created":1,"choices":[{"text":"Hi"}]}` + "\n\n",
			`data: {"id":"a","created":1,"choices":[{"text":"Ho"}]}` + "\n\n",
			false},
		{"framing differs",
			`data: {"id":"a"}` + "\n\n" + `data: {"id":"b"}` + "\n\n",
			`data: {"id":"a"}` + "\n\n" + `data: {"id":"b"}` + "\n",
			false},
		{"an event is missing",
			`data: {"id":"a"}` + "\n\n" + "data: [DONE]\n\n",
			"data: [DONE]\n\n",
			false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(normalizeSSE([]byte(tt.a))) == string(normalizeSSE([]byte(tt.b)))
			if got != tt.same {
				t.Errorf("normalizeSSE(%q) == normalizeSSE(%q) is %v; want %v", tt.a, tt.b, got, tt.same)
			}
		})
	}
}

func TestSSEEvents(t *testing.T) {
	tests := []struct {
		body string
		n    int
		done bool
	}{
		{"", 0, false},
		{"data: {}\n\ndata: {}\n\ndata: [DONE]\n\n", 3, true},
		{"data: {}\n\ndata: {}\n\n", 2, false},
		{": comment\n\ndata: [DONE]\n\n", 1, true},
	}
	for _, tt := range tests {
		n, done := sseEvents([]byte(tt.body))
		if n != tt.n || done != tt.done {
			t.Errorf("sseEvents(%q) = %d, %v; want %d, %v", tt.body, n, done, tt.n, tt.done)
		}
	}
}

func TestMetricValue(t *testing.T) {
	text := `# HELP kvroute_hop_rejected_total Hop headers that were not trusted.
# TYPE kvroute_hop_rejected_total counter
kvroute_hop_rejected_total{reason="bad_mac"} 3
kvroute_hop_rejected_total{reason="malformed"} 1
kvroute_forward_retries_total 7
kvroute_forward_retries_total_extra 9
`
	tests := []struct {
		series string
		want   float64
	}{
		{`kvroute_hop_rejected_total{reason="bad_mac"}`, 3},
		{`kvroute_hop_rejected_total{reason="malformed"}`, 1},
		{`kvroute_hop_rejected_total{reason="stale"}`, 0},
		{`kvroute_forward_retries_total`, 7},
		{`kvroute_missing_total`, 0},
	}
	for _, tt := range tests {
		if got := metricValue(text, tt.series); got != tt.want {
			t.Errorf("metricValue(%s) = %v; want %v", tt.series, got, tt.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // reversed: percentile must sort
	}
	tests := []struct {
		name string
		d    []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of 4", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100", ms(hundred...), 100, 100 * time.Millisecond},
		{"p0", ms(hundred...), 0, time.Millisecond},
	}
	for _, tt := range tests {
		in := slices.Clone(tt.d)
		if got := percentile(tt.d, tt.p); got != tt.want {
			t.Errorf("%s: percentile(p%v) = %v; want %v", tt.name, tt.p, got, tt.want)
		}
		if !slices.Equal(in, tt.d) {
			t.Errorf("%s: percentile modified its input", tt.name)
		}
	}
}

func TestSeededPromptsAreDistinctPerName(t *testing.T) {
	a, b := tokens(seeded("TestA"), 64), tokens(seeded("TestB"), 64)
	again := tokens(seeded("TestA"), 64)
	if slices.Equal(a, b) {
		t.Error("tokens for TestA and TestB are equal; want distinct prompts per test")
	}
	if !slices.Equal(a, again) {
		t.Error("tokens(seeded(TestA)) differ between calls; want a repeatable draw")
	}
	for _, x := range a {
		if x < 1000 || x >= 21000 {
			t.Fatalf("token %d outside [1000, 21000)", x)
		}
	}
}

func TestSchedDelays(t *testing.T) {
	const out = `           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   31594.128749 [0000]  perf[5862]                          0.000      0.000      0.000 
   31594.166337 [0000]  vllm-sim[5839/5820]                 0.003      1.500      2.523 
   31594.170894 [0001]  <idle>                              0.000      0.000      4.557 
   31594.170895 [0001]  sidecar[5846/5843]                  0.080      0.009      4.140 
   31594.174651 [0000]  vllm-sim[5840/5820]                 0.008      0.250      2.435 
`
	names, d, err := schedDelays(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"perf on cpu 0", "vllm-sim on cpu 0", "sidecar on cpu 1"}; !slices.Equal(names, want) {
		t.Fatalf("names = %q; want %q", names, want)
	}
	if got := d["vllm-sim on cpu 0"]; !slices.Equal(got, []time.Duration{1500 * time.Microsecond, 250 * time.Microsecond}) {
		t.Errorf("vllm-sim delays = %v", got)
	}
	tab := schedTable(names, d, 2)
	if !strings.Contains(tab, "vllm-sim on cpu 0") || strings.Contains(tab, "sidecar") || !strings.Contains(tab, "1500µs") {
		t.Errorf("table:\n%s", tab)
	}
}
