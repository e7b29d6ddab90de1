package membership

import (
	"log"
	"strings"

	"github.com/rs/zerolog"
)

// levelWriter turns memberlist's "[LEVEL] memberlist: text" lines into
// zerolog events, so its warnings are not lost among its debug chatter.
type levelWriter struct{ log zerolog.Logger }

func newStdLogger(l zerolog.Logger) *log.Logger {
	return log.New(levelWriter{log: l.With().Str("component", "memberlist").Logger()}, "", 0)
}

func (w levelWriter) Write(p []byte) (int, error) {
	lvl, msg := parseLevel(string(p))
	w.log.WithLevel(lvl).Msg(msg)
	return len(p), nil
}

// parseLevel splits a memberlist log line into its level and message. A line
// without a known prefix is logged at info, trimmed.
func parseLevel(line string) (zerolog.Level, string) {
	line = strings.TrimSpace(line)
	levels := []struct {
		prefix string
		level  zerolog.Level
	}{
		{"[TRACE]", zerolog.TraceLevel},
		{"[DEBUG]", zerolog.DebugLevel},
		{"[INFO]", zerolog.InfoLevel},
		{"[WARN]", zerolog.WarnLevel},
		{"[ERR]", zerolog.ErrorLevel},
		{"[ERROR]", zerolog.ErrorLevel},
	}
	for _, l := range levels {
		if rest, ok := strings.CutPrefix(line, l.prefix); ok {
			rest = strings.TrimSpace(rest)
			rest = strings.TrimPrefix(rest, "memberlist: ")
			return l.level, rest
		}
	}
	return zerolog.InfoLevel, line
}
