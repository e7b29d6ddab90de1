//go:build integration

package vllmclient_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

// binDir holds the binaries this test process built; TestMain removes it.
var binDir string

// builds maps a binary name to its *build, so each is built once per
// process however many tests need it.
var builds sync.Map

type build struct {
	once sync.Once
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvsim-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary returns the path of the named command (chaos.SimBinary,
// chaos.SidecarBinary), built from this module's source on first use, so a
// test never runs a stale binary.
func binary(t *testing.T, name string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(name, &build{})
	b := v.(*build)
	b.once.Do(func() {
		// Linking cgo binaries on a loaded 2-core machine can take a while.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b.err = chaos.Build(ctx, binDir, name)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return filepath.Join(binDir, name)
}
