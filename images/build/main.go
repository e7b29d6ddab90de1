// Command build makes the images of images/Dockerfile without a registry
// or a Docker daemon: each stage runs in a chroot made from a local
// substitute of its FROM image (see bases.go), following the Dockerfile's
// instructions as `docker build` does, and each target is written as a
// `docker save` archive that `docker load` and `ctr images import` read.
//
//	go run ./images/build [flags] target=tag...
//	go run ./images/build sidecar=ghcr.io/kvroute/sidecar:v0.1.0 vllm-sim=ghcr.io/kvroute/vllm-sim:v0.1.0
//
// It needs root (chroot, mount namespaces) and, the first time, a Debian
// mirror for debootstrap and apt.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

var version = "dev"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images/build:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	file := fs.String("file", "images/Dockerfile", "the Dockerfile")
	bctx := fs.String("context", ".", "the build context")
	out := fs.String("out", "out/images", "where the image archives go (<target>.tar)")
	cache := fs.String("cache", envOr("KVROUTE_IMAGES_CACHE", "/var/cache/kvroute/images"), "base images and stage trees (env KVROUTE_IMAGES_CACHE)")
	mirror := fs.String("mirror", envOr("KVROUTE_DEBIAN_MIRROR", "http://deb.debian.org/debian"), "Debian mirror for debootstrap (env KVROUTE_DEBIAN_MIRROR)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintln(os.Stdout, "usage: build [flags] target=tag...\n\nBuilds Dockerfile targets offline into docker-save archives.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	if *showVersion {
		fmt.Println("build", version)
		return nil
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("no target=tag given")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (chroot and mount namespaces); run it with sudo")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	f, err := os.Open(*file)
	if err != nil {
		return err
	}
	stages, err := parse(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	ignore, err := readIgnore(*file, *bctx)
	if err != nil {
		return err
	}
	absCtx, err := filepath.Abs(*bctx)
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	goroot, err := goEnv("GOROOT")
	if err != nil {
		return err
	}
	caches := map[string]string{}
	if v, err := goEnv("GOMODCACHE"); err == nil {
		caches["/go/pkg/mod"] = v
	}
	if v, err := goEnv("GOCACHE"); err == nil {
		caches["/root/.cache/go-build"] = v
	}
	work := filepath.Join(*cache, "work")
	b := &builder{
		stages: stages, context: absCtx, ignore: ignore, work: work, caches: caches,
		bases: &bases{cache: *cache, mirror: *mirror, goroot: goroot, log: logf},
		built: map[string]*result{}, log: logf,
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	start := time.Now()
	for _, a := range fs.Args() {
		target, tag, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want target=tag", a)
		}
		r, err := b.build(ctx, target)
		if err != nil {
			return err
		}
		t0 := time.Now()
		dst := filepath.Join(*out, target+".tar")
		id, err := writeSave(dst, r.root, tag, r.cfg, time.Unix(0, 0))
		if err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
		st, _ := os.Stat(dst)
		logf("== %s -> %s (%s, %.0f MB, %s, written in %.1fs)", target, dst, tag, float64(st.Size())/1e6, id[:19], time.Since(t0).Seconds())
		logf("   %s", r.cfg)
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	logf("== images built in %.0fs", time.Since(start).Seconds())
	return nil
}

// readIgnore reads <Dockerfile>.dockerignore, else <context>/.dockerignore,
// as BuildKit does.
func readIgnore(file, bctx string) ([]string, error) {
	for _, p := range []string{file + ".dockerignore", filepath.Join(bctx, ".dockerignore")} {
		f, err := os.Open(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		defer f.Close()
		var pats []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			if strings.HasPrefix(l, "!") {
				return nil, fmt.Errorf("%s: exceptions (!) are not supported", p)
			}
			pats = append(pats, strings.Trim(filepath.ToSlash(filepath.Clean(l)), "/"))
		}
		return pats, sc.Err()
	}
	return nil, nil
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
