//go:build integration

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// TestBinarySmoke builds vllm-sim, runs it as vLLM would be run, serves one
// request, reads the resulting KV events back through replay, and checks
// that SIGTERM ends it cleanly.
func TestBinarySmoke(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "vllm-sim")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sock := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	cmd := exec.Command(bin, "--host", "127.0.0.1", "--port", "0", "--served-model-name", "smoke",
		"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":%q,"replay_endpoint":"tcp://127.0.0.1:*","topic":"kv@smoke"}`, sock),
		"--sim-time-scale", "100")
	cmd.Env = append(cmd.Environ(), "PYTHONHASHSEED=42")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan map[string]any, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case lines <- m:
				default:
				}
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })

	var addr, replay string
	deadline := time.After(60 * time.Second)
	for addr == "" {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("vllm-sim exited before listening")
			}
			if r, ok := m["replay"].(string); ok {
				replay = r
				// An ipc:// endpoint is bound, as vLLM binds it; the log
				// must say so, since exactly one side of the pair binds.
				if m["pub_bound"] != true || !strings.Contains(fmt.Sprint(m["message"]), "PUB binds") {
					t.Errorf("kv events log line %v; want pub_bound true and \"PUB binds\"", m)
				}
			}
			if a, ok := m["addr"].(string); ok && m["message"] == "listening" {
				addr = a
			}
		case <-deadline:
			t.Fatal("no listening line within 60s")
		}
	}
	base := "http://" + addr
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-deadline:
			t.Fatalf("health never 200: %v", err)
		default:
		}
	}
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"smoke","prompt":%q,"max_tokens":4}`, strings.Repeat("abc def ", 40))))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 || r.Usage.CompletionTokens != 4 {
		t.Fatalf("completion = %d %+v %v", resp.StatusCode, r, err)
	}
	resp.Body.Close()

	// The request's blocks were published before anyone subscribed; replay
	// must still have them.
	d := newDealer(t, replay)
	var stored int
	waitUntil := time.Now().Add(10 * time.Second)
	for stored == 0 && time.Now().Before(waitUntil) {
		if _, err := d.s.SendMessage("", seqBytes(0)); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := d.s.RecvMessageBytes(0)
			if err != nil {
				t.Fatal(err)
			}
			if len(msg) == 4 && len(msg[3]) == 0 {
				break
			}
			b, err := kvevent.DecodeFrames(msg[1:])
			if err != nil {
				t.Fatal(err)
			}
			if b.Topic != "kv@smoke" {
				t.Errorf("topic = %q", b.Topic)
			}
			for _, e := range b.Events {
				if e.Kind == kvevent.BlockStored {
					stored += len(e.BlockHashes)
				}
			}
		}
	}
	if stored == 0 {
		t.Error("replay holds no BlockStored after a 320-token prompt")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit within 20s of SIGTERM")
	}
}
