package check

import (
	"fmt"
	"slices"
	"strings"
)

// Names returns the names of every check, in the order [Run] runs them.
func Names() []string {
	var names []string
	for _, c := range Checks() {
		names = append(names, c.Name)
	}
	return names
}

// Select returns the checks to run, in the order of [Checks]: those named in only
// (every check when only is empty) but those named in skip. A name that is no
// check's is an error that lists the names, and so is a selection that leaves no
// check to run.
func Select(only, skip []string) ([]*Check, error) {
	for _, list := range []struct {
		what  string
		names []string
	}{{"--only", only}, {"--skip", skip}} {
		for _, n := range list.names {
			if !slices.Contains(Names(), n) {
				return nil, fmt.Errorf("%s: unknown check %q; the checks are %s", list.what, n, strings.Join(Names(), ", "))
			}
		}
	}
	var out []*Check
	for _, c := range Checks() {
		if (len(only) == 0 || slices.Contains(only, c.Name)) && !slices.Contains(skip, c.Name) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--only %s with --skip %s leaves no check to run", strings.Join(only, ","), strings.Join(skip, ","))
	}
	return out, nil
}
