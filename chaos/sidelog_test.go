package chaos

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReadAttempts(t *testing.T) {
	dir := t.TempDir()
	log := `# chaos: 2026-12-01T10:00:00Z start pod1-sidecar
{"level":"info","node":"pod1","time":"2026-12-01T10:00:01Z","message":"engine serving"}
{"level":"debug","node":"pod1","component":"forward","req":"pod1-7","served_by":"pod3","decision":"affinity-retried","tried":["pod2","pod3"],"predicted_cached":64,"time":"2026-12-01T10:00:05Z","message":"routed"}
{"level":"debug","node":"pod1","component":"forward","served_by":"pod1","decision":"none","tried":["local"],"time":"2026-12-01T10:00:06Z","message":"routed"}
{"level":"debug","node":"pod1","message":"routed","tried":
not json at all "routed"
`
	if err := os.WriteFile(filepath.Join(dir, "pod1-sidecar.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "pod1-sim.log"), []byte(`{"message":"routed","tried":["x"]}`), 0o644)
	got, err := readAttempts(dir)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC)
	want := []Attempt{{At: at, Req: "pod1-7", Node: "pod1", Target: "pod2"}, {At: at, Req: "pod1-7", Node: "pod1", Target: "pod3"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("readAttempts mismatch (-want +got):\n%s", d)
	}
}
