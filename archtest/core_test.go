// Package archtest enforces the project's dependency rules (docs/reference/style.md P1):
// the core packages never link sockets, HTTP, memberlist, gin, zmq or logging.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

var core = []string{"kvevent", "blockkey", "kvindex", "bloom", "route", "tokenids", "prompt", "textprefix", "respown"}

var forbidden = []string{
	"net/http",
	"github.com/pebbe/zmq4",
	"github.com/hashicorp/memberlist",
	"github.com/gin-gonic/gin",
	"github.com/rs/zerolog",
	"github.com/prometheus/client_golang/prometheus",
	"math/rand",
	"math/rand/v2",
}

func TestCoreHasNoIO(t *testing.T) {
	for _, p := range core {
		pkg := "github.com/kvroute/kvroute/" + p
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Errorf("go list -deps %s: %v\n%s", pkg, err, out)
			continue
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for _, f := range forbidden {
			if deps[f] {
				t.Errorf("core package %s depends on %s", p, f)
			}
		}
	}
}
