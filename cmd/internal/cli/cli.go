// Package cli holds the command-line conventions every kvroute binary
// follows, as the Go and Kubernetes tools do: -h/--help prints the usage on
// stdout and exits 0 (so `| less` shows it), --version prints one line on
// stdout and exits 0, and a bad flag prints the error and the usage on
// stderr and exits 2.
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/buildinfo"
)

// ErrDone means Parse already answered the command line (--help or
// --version): the program exits 0 without doing anything else. It wraps
// flag.ErrHelp, so code that checks for that keeps working.
var ErrDone = fmt.Errorf("help or version printed: %w", flag.ErrHelp)

// Usage sets fs's usage text: the synopsis lines, a description, then the
// flags with their defaults.
func Usage(fs *flag.FlagSet, synopsis, description string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n", synopsis)
		if description != "" {
			fmt.Fprintf(w, "%s\n\n", description)
		}
		fmt.Fprintln(w, "Flags:")
		fs.PrintDefaults()
	}
}

// Parse adds --version to fs and parses args. It returns ErrDone after
// printing the usage (-h, --help) or the version to stdout; any other error
// has been printed to stderr with the usage, and the caller exits 2.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	version := fs.Bool("version", false, "print the version and exit")
	// flag writes both the help and a parse error's message plus usage to
	// one writer; collect it, then send it where it belongs.
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, werr := stdout.Write(buf.Bytes())
		return errors.Join(ErrDone, werr)
	case err != nil:
		stderr.Write(buf.Bytes())
		return &FlagError{err}
	case *version:
		_, werr := fmt.Fprintln(stdout, buildinfo.String(fs.Name()))
		return errors.Join(ErrDone, werr)
	}
	return nil
}

// FlagError is a command line that package flag rejected; Parse has
// already printed it with the usage, so the caller need not repeat it.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// Printed reports whether err is a FlagError, already shown to the user.
func Printed(err error) bool {
	var fe *FlagError
	return errors.As(err, &fe)
}

// ExitCode is the process status for an error of Parse: 0 for ErrDone, 2
// for a bad command line.
func ExitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, ErrDone):
		return 0
	default:
		return 2
	}
}

// Fail ends a command line that Parse or the program's own checks
// rejected: it prints err as "program: err" on stderr unless Parse already
// showed it (or it is ErrDone), and returns the exit status.
func Fail(program string, err error, stderr io.Writer) int {
	if !Printed(err) && !errors.Is(err, ErrDone) {
		fmt.Fprintf(stderr, "%s: %v\n", program, err)
	}
	return ExitCode(err)
}
