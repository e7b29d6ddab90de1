// Command sidecar is kvroute's sidecar binary. Subcommands:
//
//	sidecar [serve] [flags]   run the sidecar (the default)
//	sidecar events [flags]    print a vLLM KV-event stream as JSON lines
//
// Both take --help (usage on stdout) and --version.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/mattn/go-isatty"

	"github.com/kvroute/kvroute/cmd/internal/cli"
)

// exitCoder lets a subcommand choose its exit status.
type exitCoder interface{ ExitCode() int }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		code := 1
		var ec exitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		if !cli.Printed(err) { // a flag error was printed with the usage
			fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		}
		os.Exit(code)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "events" {
		return runEvents(args[1:], stdout, os.Stderr)
	}
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	plainConsole(os.Stderr, os.Setenv)
	return runServe(args, stdout, os.Stderr)
}

// plainConsole turns off --log-format console's ANSI colours when the logs
// do not go to a terminal (a file, a pipe, kubectl logs), through the
// NO_COLOR convention that zerolog's ConsoleWriter honours.
func plainConsole(stderr *os.File, setenv func(string, string) error) {
	if _, set := os.LookupEnv("NO_COLOR"); set {
		return
	}
	if fd := stderr.Fd(); !isatty.IsTerminal(fd) && !isatty.IsCygwinTerminal(fd) {
		_ = setenv("NO_COLOR", "1") // cannot fail for a valid name
	}
}

type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
func (e exitError) ExitCode() int { return e.code }
