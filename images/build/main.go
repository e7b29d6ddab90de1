// Command build makes the images of images/Dockerfile without a registry
// or a Docker daemon: each stage runs in a chroot made from a local
// substitute of its FROM image (see bases.go), following the Dockerfile's
// instructions as `docker build` does, and each target is written as a
// `docker save` archive that `docker load` and `ctr images import` read.
//
//	go run ./images/build [flags] target=tag...
//	go run ./images/build sidecar=ghcr.io/kvroute/sidecar:v0.1.0 vllm-sim=ghcr.io/kvroute/vllm-sim:v0.1.0
//
// It needs root (chroot, mount namespaces) and a Debian mirror for
// debootstrap and apt. The RUNs with a cache mount of /go/pkg/mod or
// /root/.cache/go-build get this machine's module and build caches; with
// --build-arg GOPROXY=off (make images, after `go mod download` here) the
// build stage fetches no module: inside the chroot neither this machine's
// proxy settings nor its certificate authorities apply.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
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
	buildArgs := map[string]string{}
	fs.Func("build-arg", "NAME=value for the Dockerfile's ARG NAME (repeatable); NAME alone takes this environment's value, as docker build", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if k == "" {
			return fmt.Errorf("want NAME=value")
		}
		if !ok {
			v, ok = os.LookupEnv(k)
		}
		if ok {
			buildArgs[k] = v
		}
		return nil
	})
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
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	// What debootstrap, apt and go print goes to a file, not the terminal
	// (a thousand lines on a first build); its end is shown on failure.
	logPath := filepath.Join(*out, "build.log")
	cmdOut, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer cmdOut.Close()
	logf := func(format string, a ...any) {
		fmt.Printf(format+"\n", a...)
		fmt.Fprintf(cmdOut, format+"\n", a...)
	}
	logf("== images/build: what the commands print is in %s", logPath)
	b := &builder{
		stages: stages, context: absCtx, ignore: ignore, work: filepath.Join(*cache, "work"), caches: caches, buildArgs: buildArgs,
		bases: &bases{cache: *cache, mirror: *mirror, goroot: goroot, log: logf, cmdOut: cmdOut},
		built: map[string]*result{}, log: logf,
	}
	if err := b.save(ctx, fs.Args(), *out); err != nil {
		return fmt.Errorf("%w\n%s(the end of %s)", err, tail(logPath, 25), logPath)
	}
	return nil
}

// save builds each target=tag and writes it as out/<target>.tar.
func (b *builder) save(ctx context.Context, targets []string, out string) error {
	start := time.Now()
	for _, a := range targets {
		target, tag, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want target=tag", a)
		}
		r, err := b.build(ctx, target)
		if err != nil {
			return err
		}
		t0 := time.Now()
		dst := filepath.Join(out, target+".tar")
		id, err := writeSave(dst, r.root, tag, r.cfg, time.Unix(0, 0))
		if err != nil {
			return fmt.Errorf("%s: %w", dst, err)
		}
		st, _ := os.Stat(dst)
		b.log("== %s -> %s (%s, %.0f MB, %s, written in %.1fs)", target, dst, tag, float64(st.Size())/1e6, id[:19], time.Since(t0).Seconds())
		b.log("   %s", r.cfg)
	}
	for _, k := range slices.Sorted(maps.Keys(b.buildArgs)) {
		if !b.usedArgs[k] {
			b.log("warning: --build-arg %s: no ARG %s in the stages built", k, k)
		}
	}
	if err := os.RemoveAll(b.work); err != nil {
		return err
	}
	b.log("== images built in %.0fs", time.Since(start).Seconds())
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

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.SplitAfter(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "") + "\n"
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
