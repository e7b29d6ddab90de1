package route

import (
	"math"
	"testing"
	"time"
)

func TestShareAt(t *testing.T) {
	e := math.Exp(-1) // one ShareWindow
	for _, tt := range []struct {
		name  string
		share float64
		busy  bool
		dt    time.Duration
		want  float64
	}{
		{"no time passed", 0.3, true, 0, 0.3},
		{"busy a window from idle", 0, true, ShareWindow, 1 - e},
		{"idle a window from full", 1, false, ShareWindow, e},
		{"busy stays full", 1, true, time.Hour, 1},
		{"idle long: none", 0.9, false, 100 * ShareWindow, 0},
		{"negative time: as reported", 0.4, false, -time.Second, 0.4},
		{"out of range: clamped", 7, false, 0, 1},
		{"negative: none", -2, true, 0, 0},
		{"NaN: none", math.NaN(), false, 0, 0},
	} {
		if got := ShareAt(tt.share, tt.busy, tt.dt); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: ShareAt(%v, %v, %v) = %v; want %v", tt.name, tt.share, tt.busy, tt.dt, got, tt.want)
		}
	}
}

// ShareCrossing is when an idle engine's share reaches the bound: ShareAt
// then is at the bound (within the millisecond it adds), not before.
func TestShareCrossing(t *testing.T) {
	d := ShareCrossing(0.95, 0.9)
	if got := ShareAt(0.95, false, d); got >= 0.9 || got < 0.9-1e-3 {
		t.Errorf("ShareAt(0.95, idle, ShareCrossing %v) = %v; want just below 0.9", d, got)
	}
	if got := ShareAt(0.95, false, d-2*time.Millisecond); got < 0.9 {
		t.Errorf("2 ms before the crossing: %v; want still at or above 0.9", got)
	}
	if d := ShareCrossing(0.5, 0.9); d != 0 {
		t.Errorf("ShareCrossing below the bound = %v; want 0", d)
	}
	if d := ShareCrossing(0.5, 0); d != math.MaxInt64 {
		t.Errorf("ShareCrossing to 0 = %v; want never", d)
	}
}
