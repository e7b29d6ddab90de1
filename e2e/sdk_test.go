//go:build integration

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The official Anthropic and OpenAI SDKs (from npm, pinned in
// e2e/sdk/package-lock.json) call the mesh with nothing changed but their
// base URL: Messages plain and streamed, Responses plain, streamed, stored,
// read back and continued through every sidecar. Needs node and npm (the
// machine image has them; the test fails, not skips, without them, so that
// CI cannot pass without running it).
func TestOfficialSDKs(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: this test runs the official SDKs (apt-get install nodejs npm)")
	}
	dir, _ := filepath.Abs("sdk")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	f := apiCluster(t)
	var urls, admins []string
	for _, p := range f.c.Pods() {
		urls = append(urls, "http://"+p.API)
		admins = append(admins, "http://"+p.Admin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "calls.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KVROUTE_URLS="+strings.Join(urls, ","), "KVROUTE_ADMIN_URLS="+strings.Join(admins, ","), "MODEL="+model)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node calls.mjs: %v\n%s\n%s", err, out, stderr.Bytes())
	}
	type call struct {
		API      string `json:"api"`
		Via      int    `json:"via"`
		ServedBy string `json:"served_by"`
		Text     string `json:"text"`
		Cached   int    `json:"cached"`
		ID       string `json:"id"`
		Status   string `json:"status"`
	}
	var calls []call
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var c call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("a line of calls.mjs: %v: %s", err, sc.Bytes())
		}
		t.Logf("%s via %d: served by %s, cached %d, %q", c.API, c.Via, c.ServedBy, c.Cached, c.Text)
		calls = append(calls, c)
	}
	by := map[string][]call{}
	for _, c := range calls {
		by[c.API] = append(by[c.API], c)
	}
	for _, api := range []string{"messages", "responses"} {
		cs := by[api]
		if len(cs) != len(urls) {
			t.Fatalf("%s: %d calls, want %d", api, len(cs), len(urls))
		}
		// The first call placed the prompt; the others, through every
		// other sidecar, were routed to it and hit its cache.
		for _, c := range cs[1:] {
			if c.ServedBy != cs[0].ServedBy || c.Cached < 1500 {
				t.Errorf("%s via %d: served by %s with %d cached; want %s, the holder, with the ~2k-token prompt cached",
					api, c.Via, c.ServedBy, c.Cached, cs[0].ServedBy)
			}
		}
	}
	for _, api := range []string{"messages-stream", "responses-stream"} {
		if cs := by[api]; len(cs) != 1 || cs[0].Text == "" || cs[0].Cached < 1500 {
			t.Errorf("%s: %+v; want one streamed answer with text and the prompt cached", api, cs)
		}
	}
	stored := by["responses-store"]
	if len(stored) != 1 || stored[0].ID == "" {
		t.Fatalf("responses-store: %+v", stored)
	}
	for _, api := range []string{"responses-retrieve", "responses-continue"} {
		if len(by[api]) != len(urls) {
			t.Fatalf("%s: %d calls, want %d", api, len(by[api]), len(urls))
		}
		for _, c := range by[api] {
			if c.ServedBy != stored[0].ServedBy {
				t.Errorf("%s via %d: served by %s; want %s, which stores %s", api, c.Via, c.ServedBy, stored[0].ServedBy, stored[0].ID)
			}
		}
	}
}
