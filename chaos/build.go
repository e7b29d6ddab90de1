package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Binary names, as `go build -o DIR/ ./cmd/...` writes them.
const (
	SimBinary     = "vllm-sim"
	SidecarBinary = "sidecar"
	ProxyBinary   = "kvproxy"
	// BareProxyBinary is a bare reverse proxy, the overhead benchmark's
	// reference hop.
	BareProxyBinary = "bareproxy"
)

const modulePath = "github.com/kvroute/kvroute"

// DefaultBinDir is where binaries are built when ClusterConfig.BinDir is
// empty: the user cache directory, else the temp directory.
func DefaultBinDir() string {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "kvroute", "bin")
}

// builtOnce remembers what this process already built into which directory,
// so a benchmark that starts many clusters builds once.
var builtOnce sync.Map // "dir\x00name" → struct{}

// Build compiles the named commands (SimBinary, SidecarBinary, ProxyBinary, ...)
// into dir with `go build`, from the module that contains the working
// directory. It needs the go tool and the source tree.
func Build(ctx context.Context, dir string, names ...string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, modulePath+"/cmd/"+n)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", names, err, out.Bytes())
	}
	return nil
}

// ensureBinaries returns dir with the named binaries present. In
// DefaultBinDir they are rebuilt once per process; in a caller's dir only
// missing ones are built.
// building, if set, is told what is about to be built.
func ensureBinaries(ctx context.Context, dir string, names []string, building func([]string)) (string, error) {
	always := dir == ""
	if always {
		dir = DefaultBinDir()
	}
	var need []string
	for _, n := range names {
		if _, done := builtOnce.Load(dir + "\x00" + n); done {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, n)); always || err != nil {
			need = append(need, n)
		}
	}
	if len(need) == 0 {
		return dir, nil
	}
	if building != nil {
		building(need)
	}
	if err := Build(ctx, dir, need...); err != nil {
		return dir, err
	}
	for _, n := range need {
		builtOnce.Store(dir+"\x00"+n, struct{}{})
	}
	return dir, nil
}

// errNoModule: the binaries are missing and there is no source to build.
var errNoModule = errors.New("build: no go.mod of " + modulePath + " above the working directory; pass BinDir with prebuilt binaries")

// moduleRoot finds the directory of the kvroute go.mod above the working
// directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("build: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errNoModule
		}
		dir = parent
	}
}

// PreviousRelease is the commit of kvroute v0.1.0, the release before this
// tree's (CHANGELOG.md): the sidecar a rolling upgrade starts from, and the
// one the mixed-version tests run beside this tree's (docs/compat.md).
const PreviousRelease = "a2f31aa72cc06f3ba15c4ad9402ffbb0887fb807"

// PreviousVersion is PreviousRelease's release name, stamped into its
// build (its source says "(devel)": it predates the version constant).
const PreviousVersion = "v0.1.0"

// ErrNoCommit reports a commit BuildSidecarAt cannot find in the clone (a
// shallow clone, or an archive without .git).
var ErrNoCommit = errors.New("commit not in this clone")

// BuildSidecarAt returns the path of the sidecar built from commit, building
// it on first use into out/sidecar-<commit> under the module root, where it
// stays: a commit's source never changes, so the build is done once per
// clone. The source is `git archive` of the commit in a temporary
// directory, built with this machine's go tool, module and build caches
// (the pinned dependencies of that commit must be in the module cache or
// reachable through GOPROXY). version, if set, is stamped with -ldflags -X
// as a release build would be. building, if set, is told before a build.
func BuildSidecarAt(ctx context.Context, commit, version string, building func(string)) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "out", "sidecar-"+commit)
	bin := filepath.Join(dir, SidecarBinary)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	git := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		return cmd
	}
	if out, err := git("cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build sidecar at %s: %w (git: %v %s); fetch it or use a full clone", commit, ErrNoCommit, err, bytes.TrimSpace(out))
	}
	if building != nil {
		building(commit)
	}
	src, err := os.MkdirTemp("", "kvroute-src-")
	if err != nil {
		return "", fmt.Errorf("build sidecar at %s: %w", commit, err)
	}
	defer os.RemoveAll(src)
	archive := git("archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	// One buffer each: exec copies each process's stderr in a goroutine of
	// its own, and a shared bytes.Buffer is a data race.
	var archiveErr, untarErr bytes.Buffer
	untar.Stdin, err = archive.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("build sidecar at %s: %w", commit, err)
	}
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("build sidecar at %s: tar: %w", commit, err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("build sidecar at %s: git archive: %w\n%s", commit, err, archiveErr.Bytes())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("build sidecar at %s: tar: %w\n%s", commit, err, untarErr.Bytes())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build sidecar at %s: %w", commit, err)
	}
	// Into a temporary name first, so a build cut short leaves no binary
	// that a later run would take for finished.
	tmp := bin + ".tmp"
	args := []string{"build", "-o", tmp}
	if version != "" {
		args = append(args, "-ldflags", "-X "+modulePath+"/buildinfo.version="+version)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/"+SidecarBinary)...)
	cmd.Dir = src
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build sidecar at %s: go build: %w\n%s", commit, err, out.Bytes())
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("build sidecar at %s: %w", commit, err)
	}
	return bin, nil
}
