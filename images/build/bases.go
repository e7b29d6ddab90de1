package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// bases makes the images the Dockerfile starts FROM, which cannot be
// pulled here, from Debian packages and the local Go toolchain, and keeps
// them in cache/bases:
//
//	debian:<suite>-slim   debootstrap --variant=minbase <suite>, without apt lists, docs and man pages
//	golang:<go>-<suite>   that, plus what the golang image adds (gcc, libc6-dev, make, pkg-config,
//	                      git, ca-certificates) and this machine's Go in /usr/local/go
//	scratch               empty
type bases struct {
	cache  string // e.g. /var/cache/kvroute/images
	mirror string // a Debian mirror reachable from this machine
	goroot string
	log    func(format string, a ...any)
	// cmdOut takes what debootstrap and the RUNs print (the build log).
	cmdOut io.Writer
}

type base struct {
	root string
	cfg  imageConfig
}

const basePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (bs *bases) get(ctx context.Context, ref string) (*base, error) {
	if ref == "scratch" {
		dir := filepath.Join(bs.cache, "bases", "scratch")
		return &base{root: dir}, os.MkdirAll(dir, 0o755)
	}
	repo, tag := splitTag(ref)
	switch repo {
	case "debian":
		suite, ok := strings.CutSuffix(tag, "-slim")
		if !ok {
			return nil, fmt.Errorf("FROM %s: only debian:<suite>-slim has a local substitute", ref)
		}
		root, err := bs.debian(ctx, suite)
		if err != nil {
			return nil, err
		}
		return &base{root: root, cfg: imageConfig{Env: []string{basePath}}}, nil
	case "golang":
		goVer, suite, ok := strings.Cut(tag, "-")
		if !ok {
			return nil, fmt.Errorf("FROM %s: want golang:<go version>-<debian suite>", ref)
		}
		have := strings.TrimPrefix(runtime.Version(), "go")
		if have != goVer && !strings.HasPrefix(have, goVer+".") {
			return nil, fmt.Errorf("FROM %s: this machine's Go is %s; the substitute copies it", ref, runtime.Version())
		}
		root, err := bs.golang(ctx, goVer, suite)
		if err != nil {
			return nil, err
		}
		return &base{root: root, cfg: imageConfig{
			WorkingDir: "/go",
			Env: []string{"PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"GOLANG_VERSION=" + have, "GOPATH=/go", "GOTOOLCHAIN=local"},
		}}, nil
	}
	return nil, fmt.Errorf("FROM %s: no local substitute (known: debian:<suite>-slim, golang:<go>-<suite>, scratch)", ref)
}

// debian debootstraps a minimal Debian once; about 3 minutes.
func (bs *bases) debian(ctx context.Context, suite string) (string, error) {
	dir := filepath.Join(bs.cache, "bases", "debian-"+suite+"-slim")
	if done(dir) {
		return dir, nil
	}
	bs.log("== base debian:%s-slim: debootstrap --variant=minbase %s from %s (about 3 min, once)", suite, suite, bs.mirror)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := sh(ctx, bs.cmdOut, "debootstrap", "--variant=minbase", suite, tmp, bs.mirror); err != nil {
		return "", fmt.Errorf("debootstrap: %w", err)
	}
	// What the slim image leaves out, and no apt state or logs.
	for _, g := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
		"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "var/log/*.log", "var/log/apt/*",
		"var/cache/debconf/*-old", "var/lib/dpkg/*-old", "debootstrap"} {
		matches, _ := filepath.Glob(filepath.Join(tmp, g))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return "", err
			}
		}
	}
	// The docker image's apt settings: no cached debs, no recommends.
	if err := os.WriteFile(filepath.Join(tmp, "etc/apt/apt.conf.d/docker-clean"), []byte(
		"DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };\n"+
			"APT::Update::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };\n"+
			"Dir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, "etc/resolv.conf"), nil, 0o644); err != nil {
		return "", err
	}
	return dir, finish(tmp, dir)
}

func (bs *bases) golang(ctx context.Context, goVer, suite string) (string, error) {
	dir := filepath.Join(bs.cache, "bases", "golang-"+goVer+"-"+suite)
	if done(dir) {
		return dir, nil
	}
	deb, err := bs.debian(ctx, suite)
	if err != nil {
		return "", err
	}
	bs.log("== base golang:%s-%s: debian:%s-slim + build tools + %s (once)", goVer, suite, suite, bs.goroot)
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := cpTree(ctx, deb, tmp); err != nil {
		return "", err
	}
	b := &builder{bases: bs, caches: map[string]string{}, log: bs.log}
	cfg := imageConfig{Env: []string{basePath}}
	in := instr{cmd: "RUN", args: "apt-get update && apt-get install -y --no-install-recommends " +
		"ca-certificates gcc libc6-dev make pkg-config git && rm -rf /var/lib/apt/lists/*"}
	if err := b.run(ctx, tmp, &cfg, nil, in); err != nil {
		return "", err
	}
	if err := cpTree(ctx, bs.goroot, filepath.Join(tmp, "usr/local/go")); err != nil {
		return "", err
	}
	for _, d := range []string{"go/bin", "go/src"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o777); err != nil {
			return "", err
		}
	}
	return dir, finish(tmp, dir)
}

func done(dir string) bool {
	_, err := os.Stat(dir + ".done")
	return err == nil
}

func finish(tmp, dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	// A marker beside the tree, not in it, so that it never reaches a layer.
	return os.WriteFile(dir+".done", nil, 0o644)
}

func sh(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}
