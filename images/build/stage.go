package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// builder runs the stages of one Dockerfile in chroots made from the
// local base images.
type builder struct {
	stages  []stage
	context string            // the build context (the repository root)
	ignore  []string          // .dockerignore patterns
	work    string            // one rootfs directory per built stage
	bases   *bases            // substitutes for the FROM images
	caches  map[string]string // RUN cache mount target -> host directory
	// buildArgs are the --build-arg values; an ARG that names one sees it.
	buildArgs map[string]string
	usedArgs  map[string]bool
	built     map[string]*result
	log       func(format string, a ...any)
}

type result struct {
	root string
	cfg  imageConfig
}

func (b *builder) stage(name string) (*stage, bool) {
	for i := range b.stages {
		if b.stages[i].name == name {
			return &b.stages[i], true
		}
	}
	return nil, false
}

// build returns the filesystem and config of a stage, building the
// stages it depends on first (each once).
func (b *builder) build(ctx context.Context, name string) (*result, error) {
	if r, ok := b.built[name]; ok {
		return r, nil
	}
	st, ok := b.stage(name)
	if !ok {
		return nil, fmt.Errorf("no stage %q", name)
	}
	root := filepath.Join(b.work, name)
	if err := os.RemoveAll(root); err != nil {
		return nil, err
	}
	var cfg imageConfig
	if parent, ok := b.stage(st.from); ok {
		p, err := b.build(ctx, parent.name)
		if err != nil {
			return nil, err
		}
		if err := cpTree(ctx, p.root, root); err != nil {
			return nil, err
		}
		cfg = p.cfg
		cfg.Env = append([]string(nil), p.cfg.Env...)
		cfg.ExposedPorts = nil
		for k := range p.cfg.ExposedPorts {
			cfg.ExposePort(k)
		}
	} else {
		base, err := b.bases.get(ctx, st.from)
		if err != nil {
			return nil, err
		}
		if err := cpTree(ctx, base.root, root); err != nil {
			return nil, err
		}
		cfg = base.cfg
	}
	b.log("== stage %s (FROM %s)", name, st.from)
	// NAME=value of the stage's ARGs: the environment of its RUNs, not of
	// the image, and not of the stages built FROM it (as docker).
	var args []string
	for _, in := range st.steps {
		if err := b.step(ctx, root, &cfg, &args, in); err != nil {
			return nil, fmt.Errorf("stage %s line %d %s: %w", name, in.line, in.cmd, err)
		}
	}
	r := &result{root: root, cfg: cfg}
	b.built[name] = r
	return r, nil
}

func (c *imageConfig) ExposePort(p string) {
	if !strings.Contains(p, "/") {
		p += "/tcp"
	}
	if c.ExposedPorts == nil {
		c.ExposedPorts = map[string]struct{}{}
	}
	c.ExposedPorts[p] = struct{}{}
}

func (b *builder) step(ctx context.Context, root string, cfg *imageConfig, args *[]string, in instr) error {
	switch in.cmd {
	case "ARG":
		k, v, ok, err := argDecl(in)
		if err != nil {
			return err
		}
		if bv, given := b.buildArgs[k]; given {
			v, ok = bv, true
			if b.usedArgs == nil {
				b.usedArgs = map[string]bool{}
			}
			b.usedArgs[k] = true
		}
		if ok {
			*args = append(*args, k+"="+v)
		}
	case "ENV":
		k, v, ok := strings.Cut(in.args, "=")
		if !ok {
			k, v, _ = strings.Cut(in.args, " ")
		}
		setEnv(cfg, strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`))
	case "WORKDIR":
		cfg.WorkingDir = in.args
		return os.MkdirAll(filepath.Join(root, in.args), 0o755)
	case "USER":
		cfg.User = in.args
	case "ENTRYPOINT":
		v, err := execForm(in)
		if err != nil {
			return err
		}
		cfg.Entrypoint, cfg.Cmd = v, nil // as docker: a new ENTRYPOINT resets CMD
	case "CMD":
		v, err := execForm(in)
		if err != nil {
			return err
		}
		cfg.Cmd = v
	case "EXPOSE":
		for _, p := range strings.Fields(in.args) {
			cfg.ExposePort(p)
		}
	case "LABEL":
		k, v, _ := strings.Cut(in.args, "=")
		if cfg.Labels == nil {
			cfg.Labels = map[string]string{}
		}
		cfg.Labels[k] = strings.Trim(v, `"`)
	case "COPY":
		return b.copy(ctx, root, cfg, in)
	case "RUN":
		return b.run(ctx, root, cfg, *args, in)
	}
	return nil
}

func setEnv(cfg *imageConfig, k, v string) {
	for i, e := range cfg.Env {
		if strings.HasPrefix(e, k+"=") {
			cfg.Env[i] = k + "=" + v
			return
		}
	}
	cfg.Env = append(cfg.Env, k+"="+v)
}

// run executes a RUN in a private mount namespace: the proc, dev,
// resolv.conf and cache mounts vanish with the process, also when the
// build is interrupted. args (NAME=value) are the stage's ARGs.
func (b *builder) run(ctx context.Context, root string, cfg *imageConfig, args []string, in instr) error {
	if cfg.User != "" && cfg.User != "root" && cfg.User != "0" {
		return fmt.Errorf("RUN as user %q is not supported", cfg.User)
	}
	targets, err := cacheMounts(in)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "bin/sh")); err != nil {
		return fmt.Errorf("no /bin/sh in the stage: %w", err)
	}
	script := []string{
		"set -e",
		`mount -t proc proc "$R/proc"`,
		`mount --rbind /dev "$R/dev"`,
		`touch "$R/etc/resolv.conf" && mount --bind /etc/resolv.conf "$R/etc/resolv.conf"`,
	}
	var mounts []string
	for i, t := range targets {
		host, ok := b.caches[t]
		if !ok {
			host = filepath.Join(b.bases.cache, "run-cache", strings.ReplaceAll(strings.Trim(t, "/"), "/", "_"))
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(root, t), 0o755); err != nil {
			return err
		}
		script = append(script, fmt.Sprintf(`mount --bind "$C%d" "$R%s"`, i, t))
		mounts = append(mounts, fmt.Sprintf("C%d=%s", i, host))
	}
	dir := cfg.WorkingDir
	if dir == "" {
		dir = "/"
	}
	script = append(script, `exec chroot "$R" /usr/bin/env -i "$@" /bin/sh -c "cd \"$WD\" && $CMD"`)
	env := append([]string{"R=" + root, "WD=" + dir, "CMD=" + in.args, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, mounts...)
	cmdArgs := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", strings.Join(script, "\n"), "run"}, runEnv(args, cfg)...)
	b.log("   RUN %s", shorten(in.args))
	cmd := exec.CommandContext(ctx, "unshare", cmdArgs...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = b.bases.cmdOut, b.bases.cmdOut
	return cmd.Run()
}

// runEnv is the environment of a RUN's command (env -i: nothing of this
// machine's): docker's defaults, then the stage's ARGs, then the image's
// ENV, so that an ENV of the same name wins as in docker.
func runEnv(args []string, cfg *imageConfig) []string {
	env := []string{"HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive"}
	env = append(env, args...)
	return append(env, cfg.Env...)
}

// copy implements COPY [--from=stage] src... dst with docker's rules for
// the cases used here: a directory's contents go into dst, a file into dst
// (a directory when it ends in / or there are several sources); files from
// the context are owned by root.
func (b *builder) copy(ctx context.Context, root string, cfg *imageConfig, in instr) error {
	f := strings.Fields(in.args)
	if len(f) < 2 {
		return fmt.Errorf("COPY wants src... dst")
	}
	srcs, dst := f[:len(f)-1], f[len(f)-1]
	intoDir := strings.HasSuffix(dst, "/") || dst == "." || len(srcs) > 1
	if !path.IsAbs(dst) {
		dst = path.Join("/", cfg.WorkingDir, dst)
	}
	from, fromStage := b.context, false
	if v := in.flags["from"]; len(v) == 1 {
		r, err := b.build(ctx, v[0])
		if err != nil {
			return err
		}
		from, fromStage = r.root, true
	}
	for _, s := range srcs {
		src := filepath.Join(from, filepath.FromSlash(s))
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		target := filepath.Join(root, filepath.FromSlash(dst))
		if !fi.IsDir() && intoDir {
			target = filepath.Join(target, filepath.Base(src))
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if fromStage {
			if err := cpTree(ctx, src, target); err != nil {
				return err
			}
			continue
		}
		rel, _ := filepath.Rel(b.context, src)
		if err := copyContext(src, target, filepath.ToSlash(rel), b.ignored); err != nil {
			return err
		}
	}
	b.log("   COPY %s", shorten(in.args))
	return nil
}

// ignored reports whether a context path (slash-separated, relative to
// the context) matches a .dockerignore pattern or lies under one.
func (b *builder) ignored(rel string) bool {
	for _, p := range b.ignore {
		for r := rel; r != "." && r != "/" && r != ""; r = path.Dir(r) {
			if ok, _ := path.Match(p, r); ok {
				return true
			}
			if ok, _ := path.Match(p, path.Base(r)); ok && !strings.Contains(p, "/") && r == rel {
				return true
			}
		}
	}
	return false
}

func copyContext(src, dst, rel string, ignored func(string) bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		sub, _ := filepath.Rel(src, p)
		r := path.Join(rel, filepath.ToSlash(sub))
		if r != "." && ignored(r) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		t := filepath.Join(dst, sub)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(t, info.Mode().Perm()|0o700); err != nil {
				return err
			}
		case info.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			os.Remove(t)
			if err := os.Symlink(l, t); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(t, data, info.Mode().Perm()); err != nil {
				return err
			}
			if err := os.Chmod(t, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil
		}
		return os.Lchown(t, 0, 0)
	})
}

// cpTree copies a tree keeping owners, modes, links and times.
func cpTree(ctx context.Context, src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		src += "/."
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
	return nil
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 100 {
		return s[:97] + "..."
	}
	return s
}
