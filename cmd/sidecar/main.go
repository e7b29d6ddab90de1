// Command sidecar is kvroute's sidecar binary. Subcommands:
//
//	sidecar [serve] [flags]   run the sidecar (the default)
//	sidecar events [flags]    print a vLLM KV-event stream as JSON lines
package main

import (
	"errors"
	"fmt"
	"os"
)

// exitCoder lets a subcommand choose its exit status.
type exitCoder interface{ ExitCode() int }

func main() {
	if err := run(os.Args[1:]); err != nil {
		code := 1
		var ec exitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
		os.Exit(code)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "events" {
		return runEvents(args[1:])
	}
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	return runServe(args)
}

type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
func (e exitError) ExitCode() int { return e.code }
