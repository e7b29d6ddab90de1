package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A real `go test -json` run of a module with passing, failing, skipped and
// panicking tests: the summary shows the failures in full with their
// "--- FAIL" line first, every skip with its reason, the counts, and no
// -v framing.
func TestRealRun(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.26\n",
		"a/a_test.go": `package a

import "testing"

func TestPass(t *testing.T) {}

func TestFail(t *testing.T) { t.Log("the log of a failure"); t.Error("boom") }

func TestNeedsTool(t *testing.T) { t.Skip("needs frobnicate: not installed") }

func TestTable(t *testing.T) {
	for _, n := range []string{"one", "two", "three", "four"} {
		t.Run(n, func(t *testing.T) { t.Skip("kubectl not installed") })
	}
}
`,
		"b/b_test.go": `package b

import "testing"

func TestOK(t *testing.T) { t.Log("not shown: the package passed") }
`,
		"c/c_test.go": `package c

import "testing"

func TestCrash(t *testing.T) { panic("crash") }
`,
		"d/d.go": "package d\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
	in, err := cmd.Output()
	if err == nil {
		t.Fatal("go test passed; the module has failing tests")
	}
	if len(in) == 0 {
		t.Fatalf("go test printed nothing: %v", err)
	}
	var out bytes.Buffer
	s := newSummary(&out, "example.com/m/")
	if err := s.read(bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if s.finish() {
		t.Error("finish reported success")
	}
	got := out.String()
	t.Logf("summary:\n%s", got)
	for _, want := range []string{
		"--- FAIL: TestFail (", "the log of a failure", "boom",
		"ok  \texample.com/m/b", "FAIL\texample.com/m/a", "FAIL\texample.com/m/c", "panic: crash",
		"== test: 3 passed, 2 failed, 5 skipped (tests and subtests):",
		"   SKIP a TestNeedsTool: a_test.go:9: needs frobnicate: not installed\n",
		"   SKIP a TestTable/one, TestTable/two, 2 more: a_test.go:13: kubectl not installed\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if i, j := strings.Index(got, "--- FAIL: TestFail"), strings.Index(got, "the log of a failure"); i < 0 || j < i {
		t.Error("the --- FAIL line does not come before the test's log")
	}
	for _, not := range []string{"=== RUN", "not shown", "example.com/m/d", "--- SKIP", "PASS\n"} {
		if strings.Contains(got, not) {
			t.Errorf("summary shows %q", not)
		}
	}
}

func TestPassThroughAndOK(t *testing.T) {
	in := `go: downloading example.com/x v1.0.0
{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"T"}
{"Action":"output","Package":"p","Test":"T","Output":"=== RUN   T\n"}
{"Action":"output","Package":"p","Test":"T","Output":"--- PASS: T (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"T"}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p"}
`
	var out bytes.Buffer
	s := newSummary(&out, "")
	if err := s.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if !s.finish() {
		t.Error("finish reported a failure")
	}
	want := "go: downloading example.com/x v1.0.0\nok  \tp\t0.01s\n== test: 1 passed, 0 failed, 0 skipped (tests and subtests).\n"
	if out.String() != want {
		t.Errorf("summary %q; want %q", out.String(), want)
	}
}

// A build failure reaches the output, and fails the run.
func TestBuildFailure(t *testing.T) {
	in := `{"ImportPath":"p [p.test]","Action":"build-output","Output":"# p\n"}
{"ImportPath":"p [p.test]","Action":"build-output","Output":"./p.go:3:1: syntax error\n"}
{"ImportPath":"p [p.test]","Action":"build-fail"}
{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}
{"Action":"fail","Package":"p","FailedBuild":"p [p.test]"}
`
	var out bytes.Buffer
	s := newSummary(&out, "")
	if err := s.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if s.finish() {
		t.Error("finish reported success")
	}
	for _, want := range []string{"./p.go:3:1: syntax error\n", "FAIL\tp [build failed]\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary %q lacks %q", out.String(), want)
		}
	}
}

// The stream is go test's, but any bytes must be summarised without a
// panic, and the counts must be those of the test events in it.
func FuzzSummary(f *testing.F) {
	f.Add([]byte(`{"Action":"output","Package":"p","Test":"T","Output":"    x_test.go:1: why\n"}
{"Action":"skip","Package":"p","Test":"T"}
{"Action":"fail","Package":"p","Test":"U"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}
{"Action":"fail","Package":"p"}
`))
	f.Add([]byte("not json\n{\"Action\":\"pass\"}\n{\"Action\":\"output\",\"Package\":\"p\",\"Test\":\"T\",\"Output\":\"--- FAIL: T \"}\n{\"Action\":\"fail\",\"Package\":\"p\",\"Test\":\"T\"}"))
	f.Add([]byte("{\"Action\":\"output\",\"Output\":\"\\u003cno newline\"}\n{}\n{\"Action\":\"pass\",\"Package\":\"\"}\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		s := newSummary(&out, "p/")
		if err := s.read(bytes.NewReader(in)); err != nil {
			t.Fatal(err)
		}
		ok := s.finish()
		var pass, fail, skip int
		for _, l := range bytes.Split(in, []byte("\n")) {
			var e event
			if t := bytes.TrimSpace(l); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &e) != nil || e.Test == "" {
				continue
			}
			switch e.Action {
			case "pass":
				pass++
			case "fail":
				fail++
			case "skip":
				skip++
			}
		}
		if s.passed != pass || s.failed != fail || s.skipped != skip {
			t.Errorf("counts %d/%d/%d; the input has %d/%d/%d", s.passed, s.failed, s.skipped, pass, fail, skip)
		}
		if ok && fail > 0 {
			t.Error("success with a failed test")
		}
		if !strings.Contains(out.String(), " skipped (tests and subtests)") {
			t.Error("no counts line")
		}
	})
}

// The reason of a skip is its t.Skip message, not the progress the test
// logged before it.
func TestReasonIsTheSkipMessage(t *testing.T) {
	lines := []string{
		"=== RUN   TestLong\n",
		"    cluster_test.go:42: started 4 pods\n",
		"    cluster_test.go:42:   [ 5.0s] sent 21\n",
		"    run_test.go:99: KNOWN BUG: 12 unclear\n",
		"        and a second line\n",
		"--- SKIP: TestLong (61.00s)\n",
	}
	if got, want := reason(lines), "run_test.go:99: KNOWN BUG: 12 unclear and a second line"; got != want {
		t.Errorf("reason = %q; want %q", got, want)
	}
	if got := reason([]string{"--- SKIP: TestX (0.00s)\n"}); got != "(no reason given)" {
		t.Errorf("reason of a bare skip = %q", got)
	}
}
