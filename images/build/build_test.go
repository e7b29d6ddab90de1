package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The real Dockerfile parses, with the stages and the dependencies the
// Makefile's targets rely on.
func TestParseDockerfile(t *testing.T) {
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stages, err := parse(f)
	if err != nil {
		t.Fatal(err)
	}
	from := map[string]string{}
	entry := map[string][]string{}
	for _, st := range stages {
		from[st.name] = st.from
		for _, in := range st.steps {
			if in.cmd == "ENTRYPOINT" {
				v, err := execForm(in)
				if err != nil {
					t.Fatal(err)
				}
				entry[st.name] = v
			}
			if in.cmd == "RUN" {
				if _, err := cacheMounts(in); err != nil {
					t.Errorf("stage %s: %v", st.name, err)
				}
			}
		}
	}
	want := map[string]string{"build": "golang:1.26-bookworm", "runtime": "debian:bookworm-slim",
		"sidecar": "runtime", "vllm-sim": "runtime", "pause": "scratch"}
	for name, f := range want {
		if from[name] != f {
			t.Errorf("stage %s FROM %q; want %q", name, from[name], f)
		}
	}
	for name, e := range map[string]string{"sidecar": "/usr/local/bin/sidecar", "vllm-sim": "/usr/local/bin/vllm-sim", "pause": "/pause"} {
		if len(entry[name]) != 1 || entry[name][0] != e {
			t.Errorf("stage %s ENTRYPOINT %q; want [%q]", name, entry[name], e)
		}
	}
	// make images passes --build-arg GOPROXY=off to the stage that runs go mod download.
	var goproxy bool
	for _, st := range stages {
		for _, in := range st.steps {
			if in.cmd == "ARG" {
				name, _, hasDef, err := argDecl(in)
				if err != nil {
					t.Fatal(err)
				}
				goproxy = goproxy || (st.name == "build" && name == "GOPROXY" && !hasDef)
			}
		}
	}
	if !goproxy {
		t.Error("stage build declares no ARG GOPROXY (without a default)")
	}
	if stages[len(stages)-1].name != "sidecar" {
		t.Errorf("last stage %s; want sidecar (the default target of docker build)", stages[len(stages)-1].name)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"no from", "RUN true\n", "before FROM"},
		{"unknown", "FROM scratch\nHEALTHCHECK NONE\n", "not supported"},
		{"bad from", "FROM a b\n", "FROM wants"},
		{"empty", "# nothing\n", "no FROM"},
	} {
		_, err := parse(strings.NewReader(c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v; want one containing %q", c.name, err, c.want)
		}
	}
	in, err := split(1, `RUN --mount=type=bind,target=/x true`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cacheMounts(in); err == nil {
		t.Error("a bind mount was accepted")
	}
}

func TestArgDecl(t *testing.T) {
	for _, c := range []struct {
		args, name, def string
		hasDef          bool
		err             string
	}{
		{args: "GOPROXY", name: "GOPROXY"},
		{args: "GOFLAGS=-mod=mod", name: "GOFLAGS", def: "-mod=mod", hasDef: true},
		{args: "EMPTY=", name: "EMPTY", hasDef: true},
		{args: `MSG="a b"`, name: "MSG", def: "a b", hasDef: true},
		{args: "A B", err: "one name"},
		{args: "=x", err: "one name"},
		{args: "MSG=a b", err: "double quotes"},
		{args: "P=$HOME/x", err: "$"},
	} {
		name, def, hasDef, err := argDecl(instr{line: 3, cmd: "ARG", args: c.args})
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ARG %s: error %v; want one containing %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || name != c.name || def != c.def || hasDef != c.hasDef {
			t.Errorf("ARG %s = %q, %q, %v, %v; want %q, %q, %v", c.args, name, def, hasDef, err, c.name, c.def, c.hasDef)
		}
	}
}

// An ARG is set in the RUNs of its stage from --build-arg, else from its
// default, else not at all; an ENV of the same name wins, and the image's
// config never holds it.
func TestArgsReachRun(t *testing.T) {
	b := &builder{buildArgs: map[string]string{"GOPROXY": "off", "UNUSED": "x"}}
	var cfg imageConfig
	var args []string
	for _, line := range []string{"ARG GOPROXY", "ARG MODE=fast", "ARG NOTSET", "ENV MODE=slow"} {
		in, err := split(1, line)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.step(t.Context(), t.TempDir(), &cfg, &args, in); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
	if !slices.Equal(args, []string{"GOPROXY=off", "MODE=fast"}) {
		t.Errorf("ARGs %q; want GOPROXY=off MODE=fast", args)
	}
	if !b.usedArgs["GOPROXY"] || b.usedArgs["UNUSED"] {
		t.Errorf("used build args %v; want GOPROXY only", b.usedArgs)
	}
	env := runEnv(args, &cfg)
	last := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		last[k] = v // env(1) keeps the last of a name
	}
	if last["GOPROXY"] != "off" || last["MODE"] != "slow" {
		t.Errorf("RUN environment %q: want GOPROXY=off and the ENV's MODE=slow", env)
	}
	if _, ok := last["NOTSET"]; ok {
		t.Errorf("RUN environment %q sets NOTSET", env)
	}
	for _, e := range cfg.Env {
		if strings.HasPrefix(e, "GOPROXY=") {
			t.Errorf("image config holds the ARG: %q", cfg.Env)
		}
	}
}

func TestIgnored(t *testing.T) {
	b := &builder{ignore: []string{".git", "out", "*.test"}}
	for rel, want := range map[string]bool{
		".git": true, ".git/config": true, "out/images/x.tar": true, "cmd/sidecar/sidecar.test": true,
		"cmd/sidecar/main.go": false, "outside/x": false, "go.mod": false,
	} {
		if got := b.ignored(rel); got != want {
			t.Errorf("ignored(%q) = %v; want %v", rel, got, want)
		}
	}
}

// A saved archive is what docker load and ctr import expect: the manifest
// names the config and the layer, and the config's diff_id is the sha256
// of the layer's bytes.
func TestWriteSave(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/local/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/app"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/local/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "proc/1"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "app.tar")
	cfg := imageConfig{User: "65532:65532", Entrypoint: []string{"/usr/local/bin/app"}}
	id, err := writeSave(out, root, "example.org/app:v1", cfg, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	files := readTar(t, out)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || len(manifest[0].Layers) != 1 || manifest[0].RepoTags[0] != "example.org/app:v1" {
		t.Fatalf("manifest %+v", manifest)
	}
	config := files[manifest[0].Config]
	sum := sha256.Sum256(config)
	if "sha256:"+hex.EncodeToString(sum[:]) != id {
		t.Errorf("image id %s is not the config's digest", id)
	}
	var c struct {
		Config imageConfig
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(config, &c); err != nil {
		t.Fatal(err)
	}
	layer := files[manifest[0].Layers[0]]
	lsum := sha256.Sum256(layer)
	if len(c.RootFS.DiffIDs) != 1 || c.RootFS.DiffIDs[0] != "sha256:"+hex.EncodeToString(lsum[:]) {
		t.Errorf("diff_ids %v; want the layer's sha256", c.RootFS.DiffIDs)
	}
	if c.Config.User != "65532:65532" || c.Config.Entrypoint[0] != "/usr/local/bin/app" {
		t.Errorf("config %+v", c.Config)
	}
	tr := tar.NewReader(strings.NewReader(string(layer)))
	names := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = h
	}
	if h := names["usr/local/bin/app"]; h == nil || h.Mode&0o111 == 0 {
		t.Errorf("layer lacks the executable usr/local/bin/app: %v", h)
	}
	if h := names["bin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/local/bin" {
		t.Errorf("layer lacks the symlink bin: %v", h)
	}
	if names["proc/"] == nil || names["proc/1/"] != nil {
		t.Errorf("proc: want the directory without its contents")
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func TestSplitTag(t *testing.T) {
	for in, want := range map[string][2]string{
		"ghcr.io/kvroute/sidecar:v0.1.0": {"ghcr.io/kvroute/sidecar", "v0.1.0"},
		"localhost:5000/x":               {"localhost:5000/x", "latest"},
		"debian:bookworm-slim":           {"debian", "bookworm-slim"},
	} {
		r, tag := splitTag(in)
		if r != want[0] || tag != want[1] {
			t.Errorf("splitTag(%q) = %q, %q; want %q", in, r, tag, want)
		}
	}
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "build.log")
	if err := os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := tail(p, 2); got != "c\nd\n" {
		t.Errorf("tail 2 = %q; want the last two lines", got)
	}
	if got := tail(p, 10); got != "a\nb\nc\nd\n" {
		t.Errorf("tail 10 = %q; want the whole file", got)
	}
	if got := tail(filepath.Join(t.TempDir(), "none"), 2); got != "" {
		t.Errorf("tail of a missing file = %q", got)
	}
}
