package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// runVersion prints the command's version: the module version it was built at (a tag
// for `go install …@v0.1.0`, "(devel)" for a build from a checkout), the commit and
// whether the checkout had uncommitted changes when the build recorded them, and Go's.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "idem version: takes no arguments, got %q\n", args[0])
		return exitUsage
	}
	fmt.Fprintln(stdout, versionLine())
	return exitOK
}

// buildCommit is the commit a build without the checkout's VCS information was made
// from (scripts/build-static sets it with -X, from BUILD_COMMIT in a Docker build).
var buildCommit string

// versionLine is "idem VERSION [COMMIT[-dirty]] GOVERSION".
func versionLine() string {
	version, commit, dirty := "(unknown)", buildCommit, false
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	line := "idem " + version
	if commit != "" {
		line += " " + commit[:min(len(commit), 12)]
		if dirty {
			line += "-dirty"
		}
	}
	return line + " " + runtime.Version()
}
