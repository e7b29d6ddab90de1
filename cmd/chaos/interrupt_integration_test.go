//go:build integration

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C in the middle of a run stops the load, the pods and the
// Service, and removes the namespaces, the bridge and the guard rules.
func TestInterruptCleansUp(t *testing.T) {
	if syscall.Geteuid() != 0 {
		t.Skip("netns mode needs root (CAP_NET_ADMIN): run as root, as CI does, to test the cleanup after an interrupt")
	}
	if testing.Short() {
		t.Skip("builds and runs the chaos command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "chaos")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	prefix := fmt.Sprintf("ki%d", os.Getpid()%1000)
	subnet := fmt.Sprintf("10.253.%d", 1+os.Getpid()%45) // 46-249 are the chaos package tests'
	cmd := exec.CommandContext(ctx, bin, "--netns", "--prefix", prefix, "--subnet", subnet, "--pods", "2",
		"--duration", "60s", "--rate", "4", "--bin", filepath.Join(dir, "bin"), "--out", filepath.Join(dir, "out"))
	cmd.Dir = "../.." // the module root, for the binaries' build
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	ready := false
	for sc.Scan() {
		t.Log(sc.Text())
		if strings.Contains(sc.Text(), "sent ") { // the load is running
			ready = true
			break
		}
	}
	if !ready {
		t.Fatalf("no load progress before the output ended: %v", sc.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stderr)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("chaos exited after SIGINT: %v", err)
	case <-time.After(45 * time.Second):
		t.Fatal("chaos did not exit within 45s of SIGINT")
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), prefix+"-") {
		t.Errorf("namespaces left after SIGINT:\n%s", out)
	}
	if links, _ := exec.Command("ip", "-o", "link", "show").Output(); strings.Contains(string(links), prefix+"br") {
		t.Errorf("bridge %sbr left after SIGINT", prefix)
	}
	if exec.Command("iptables", "-w", "-n", "-L", strings.ToUpper(prefix)+"-GUARD").Run() == nil {
		t.Errorf("guard chain left after SIGINT")
	}
}
