package membership

import (
	"testing"

	"github.com/rs/zerolog"
)

func TestParseLevel(t *testing.T) {
	tests := []struct {
		line     string
		wantLvl  zerolog.Level
		wantText string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1\n", zerolog.DebugLevel, "Stream connection from=127.0.0.1:1"},
		{"[WARN] memberlist: Was able to connect to b over TCP", zerolog.WarnLevel, "Was able to connect to b over TCP"},
		{"[ERR] memberlist: Failed to send ping", zerolog.ErrorLevel, "Failed to send ping"},
		{"[ERROR] x", zerolog.ErrorLevel, "x"},
		{"[INFO] memberlist: Marking b as failed", zerolog.InfoLevel, "Marking b as failed"},
		{"no prefix", zerolog.InfoLevel, "no prefix"},
		{"", zerolog.InfoLevel, ""},
	}
	for _, tt := range tests {
		lvl, text := parseLevel(tt.line)
		if lvl != tt.wantLvl || text != tt.wantText {
			t.Errorf("parseLevel(%q) = %v, %q; want %v, %q", tt.line, lvl, text, tt.wantLvl, tt.wantText)
		}
	}
}
