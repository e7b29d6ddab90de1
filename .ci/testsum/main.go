// Command testsum turns `go test -json` into what go test prints without -v
// (a line per package, the whole output of every failed test) plus what it
// hides: every skipped test with its reason, and the counts. A test that
// cannot run on this machine (no kubectl, not root) must say so in the
// default output, not pass silently.
//
//	go test -json ./... 2>&1 | testsum [-trim github.com/kvroute/kvroute/]
//
// Lines that are not JSON (go's own errors on stderr) pass through. It
// exits 1 when a test or a package failed.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	trim := flag.String("trim", "", "prefix cut from package paths in the list of skips (the module path and a slash)")
	flag.Parse()
	s := newSummary(os.Stdout, *trim)
	if err := s.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	if !s.finish() {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json's TestEvent; the
// build-* actions are go build's, ImportPath naming the package).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

type key struct{ pkg, test string }

type skip struct{ pkg, test, reason string }

type summary struct {
	w    io.Writer
	trim string
	// out holds the output of each running test, and a package's own
	// (test == ""), until it ends.
	out                     map[key][]string
	skips                   []skip
	passed, failed, skipped int
	failedPkgs              int
}

func newSummary(w io.Writer, trim string) *summary {
	return &summary{w: w, trim: trim, out: map[key][]string{}}
}

// read consumes the stream to its end. Lines can be long (a test that
// prints a body), so they are read whole rather than with a Scanner.
func (s *summary) read(r io.Reader) error {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			s.line(line)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (s *summary) line(b []byte) {
	var e event
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &e) != nil || e.Action == "" {
		s.print(string(b))
		return
	}
	s.event(e)
}

func (s *summary) event(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		s.print(e.Output)
	case "output":
		if !framing(e.Output) {
			s.out[k] = append(s.out[k], e.Output)
		}
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.endPackage(e.Package, e.Action)
			return
		}
		lines := s.out[k]
		delete(s.out, k)
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
			s.print(failFirst(lines, e.Test)...)
		case "skip":
			s.skipped++
			s.skips = append(s.skips, skip{pkg: e.Package, test: e.Test, reason: reason(lines)})
		}
	}
}

// endPackage prints the package's line as go test does. A failed package
// also shows what its binary printed outside any test (a panic, a timeout)
// and the output of tests that never ended because it crashed.
func (s *summary) endPackage(pkg, action string) {
	own := s.out[key{pkg, ""}]
	delete(s.out, key{pkg, ""})
	switch action {
	case "skip": // no test files
		return
	case "pass":
		for _, l := range own {
			if strings.HasPrefix(l, "ok") {
				s.print(l)
				return
			}
		}
		s.print(fmt.Sprintf("ok  \t%s\n", pkg))
		return
	}
	s.failedPkgs++
	for k, lines := range s.out {
		if k.pkg == pkg {
			s.print(fmt.Sprintf("--- unfinished: %s\n", k.test))
			s.print(lines...)
			delete(s.out, k)
		}
	}
	s.print(own...)
}

// finish prints the skips, grouped by package and reason (a table test
// skips its cases for one reason), and the counts; false when anything
// failed.
func (s *summary) finish() bool {
	type group struct {
		pkg, reason string
		tests       []string
	}
	var groups []*group
	index := map[[2]string]*group{}
	for _, sk := range s.skips {
		g := index[[2]string{sk.pkg, sk.reason}]
		if g == nil {
			g = &group{pkg: sk.pkg, reason: sk.reason}
			index[[2]string{sk.pkg, sk.reason}] = g
			groups = append(groups, g)
		}
		g.tests = append(g.tests, sk.test)
	}
	colon := "."
	if len(groups) > 0 {
		colon = ":"
	}
	fmt.Fprintf(s.w, "== test: %d passed, %d failed, %d skipped (tests and subtests)%s\n", s.passed, s.failed, s.skipped, colon)
	for _, g := range groups {
		names := g.tests
		if len(names) > 3 {
			names = append(names[:2:2], fmt.Sprintf("%d more", len(g.tests)-2))
		}
		fmt.Fprintf(s.w, "   SKIP %s %s: %s\n", strings.TrimPrefix(g.pkg, s.trim), strings.Join(names, ", "), g.reason)
	}
	return s.failed == 0 && s.failedPkgs == 0
}

func (s *summary) print(lines ...string) {
	for _, l := range lines {
		io.WriteString(s.w, l)
		if !strings.HasSuffix(l, "\n") {
			io.WriteString(s.w, "\n")
		}
	}
}

// framing reports the lines -json's verbose mode adds around a test's own
// output, which go test without -v does not print.
func framing(l string) bool {
	t := strings.TrimLeft(l, " ")
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// failFirst puts the test's "--- FAIL" line before its logs, as go test
// prints a failure without -v (with -v the logs stream first).
func failFirst(lines []string, test string) []string {
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(strings.TrimLeft(lines[i], " "), "--- FAIL: "+test+" ") {
			return append(append([]string{lines[i]}, lines[:i]...), lines[i+1:]...)
		}
	}
	return lines
}

// reason is a skipped test's t.Skip message on one line: its last logged
// entry (file.go:NN: and what follows, continuation lines included), not
// the progress it logged before; the whole output when no line looks like
// a log entry.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "--- SKIP: ") {
			continue
		}
		if logEntry.MatchString(t) {
			parts = parts[:0]
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

// logEntry is how go test starts a t.Log or t.Skip line.
var logEntry = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)
