package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns a flag set whose parse errors are not printed by the flag package:
// parse prints them as one line.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: idem %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args into fs. When it returns done, the command must return code: 0
// after --help (usage on stdout), 2 after a bad flag or a stray argument (one line on
// stderr).
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, done bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK, true
	case err != nil:
		return usageError(stderr, fs.Name(), err.Error()), true
	case fs.NArg() > 0:
		return usageError(stderr, fs.Name(), fmt.Sprintf("unexpected argument %q", fs.Arg(0))), true
	}
	return 0, false
}

// usageError prints "idem <command>: msg" as one line and returns exitUsage.
func usageError(stderr io.Writer, command, msg string) int {
	fmt.Fprintf(stderr, "%s: %s\n", command, oneLine(msg))
	return exitUsage
}

// failure prints "idem <command>: err" as one line and returns exitFailure.
func failure(stderr io.Writer, command string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", command, oneLine(err.Error()))
	return exitFailure
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// storeFlag registers the required --store flag of migrate and purge.
func storeFlag(fs *flag.FlagSet) *string {
	return fs.String("store", "", "idempotency store `URL` (required): sqlite:PATH, postgres://…, redis://…, redis+cluster://…")
}

// requiredStore parses the value of a required --store flag; errors name the flag.
func requiredStore(raw string) (storeURL, error) {
	if raw == "" {
		return storeURL{}, errors.New("--store is required")
	}
	u, err := parseStoreURL(raw)
	if err != nil {
		return u, fmt.Errorf("--store: %w", err)
	}
	return u, nil
}
