package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

func TestHelpAndVersionOnStdout(t *testing.T) {
	for _, arg := range []string{"--help", "--version"} {
		var out bytes.Buffer
		_, err := parseFlags([]string{arg}, &out)
		if !errors.Is(err, flag.ErrHelp) || out.Len() == 0 {
			t.Errorf("%s: err %v, %d bytes of output; want ErrHelp and text", arg, err, out.Len())
		}
	}
}

func TestScenarioFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	os.WriteFile(path, []byte(`{"pods": 6, "duration": "90s", "rate": 12, "blocks_per_pod": 16384, "faults": [{"at": "10s", "fault": "kill-pod", "pod": 2}]}`), 0o644)
	o, err := parseFlags([]string{"--scenario", path, "--rate", "5", "--netns", "--blocks-per-pod", "4096",
		"--fault", "at=20s,fault=gossip-loss,pod=all,percent=5,for=10s", "--sidecar-args", "--max-queue-wait 2s  --max-queue 8"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	s := o.cfg.Scenario
	if s.Name != "s" || s.Pods != 6 || s.Duration.D() != 90*time.Second || s.Rate != 5 || !o.cfg.Netns || s.BlocksPerPod != 4096 {
		t.Errorf("scenario %+v, netns %v; want the file's name, pods and duration, --rate 5, --blocks-per-pod 4096, netns", s, o.cfg.Netns)
	}
	if got := o.cfg.SidecarArgs; !slices.Equal(got, []string{"--max-queue-wait", "2s", "--max-queue", "8"}) {
		t.Errorf("sidecar args %q", got)
	}
	want := chaos.Fault{At: chaos.Duration(20 * time.Second), Fault: "gossip-loss", Pod: chaos.PodRef{All: true},
		Percent: 5, For: chaos.Duration(10 * time.Second)}
	if len(s.Faults) != 2 || s.Faults[1] != want {
		t.Errorf("faults %+v; want the file's and %+v", s.Faults, want)
	}
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--netns", "--loopback"}, "exclude each other"},
		{[]string{"--fault", "kill-pod"}, "key=value"},
		{[]string{"--fault", "at=1s,fault=kill-pod,pod=x"}, "random"},
		{[]string{"--fault", "at=1s,fault=gossip-delay,pod=1,ms=fast"}, "wants a number"},
		{[]string{"--pods", "2", "--fault", "at=1s,fault=kill-pod,pod=3"}, "pod 3 not in 1..2"},
		{[]string{"--workload", "poetry"}, "--workload"},
		{[]string{"--scenario", "/nonexistent.json"}, "no such file"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--loopback", "--fault", "at=1s,fault=partition,pod=1"}, "needs netns mode"},
	}
	for _, tc := range tests {
		_, err := parseFlags(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v; want an error containing %q", tc.args, err, tc.want)
		}
	}
}
