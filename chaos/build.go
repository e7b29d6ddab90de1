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
