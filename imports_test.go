package idem_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// deps returns the packages outside the standard library that pkgs import, directly
// or not (themselves included), as `go list -deps` finds them.
func deps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// telemetry returns the Prometheus and OpenTelemetry packages among pkgs.
func telemetry(pkgs []string) []string {
	var out []string
	for _, p := range pkgs {
		if strings.Contains(p, "prometheus") || strings.Contains(p, "opentelemetry") {
			out = append(out, p)
		}
	}
	return out
}

// The root package imports the standard library, its own contracts (the
// store's, idemstore, the observer's, observe, and sealing's, seal, which import the
// standard library only), internal/logsummary (its log handler) and internal/corehooks (what
// it lends package admin, which imports its contracts only), and a user of it and one store
// compiles neither Prometheus nor
// OpenTelemetry (SPEC §15): they come with idemprom and idemotel only.
func TestImportGraphs(t *testing.T) {
	t.Parallel()
	want := []string{"github.com/idem-go/idem/idemstore", "github.com/idem-go/idem/seal", "github.com/idem-go/idem/internal/corehooks", "github.com/idem-go/idem/internal/logsummary", "github.com/idem-go/idem/observe", "github.com/idem-go/idem"}
	if got := deps(t, "."); !slices.Equal(got, want) {
		t.Errorf("the root package imports %v beside the standard library; want %v", got, want)
	}
	for _, contract := range []string{"./idemstore", "./observe", "./seal"} {
		if got := deps(t, contract); len(got) != 1 {
			t.Errorf("%s imports %v beside the standard library", contract, got[:len(got)-1])
		}
	}
	for _, store := range []string{"./store/sqlite", "./store/postgres", "./store/redis", "./store/memory"} {
		if got := telemetry(deps(t, ".", store)); len(got) > 0 {
			t.Errorf("idem and %s import %v", store, got)
		}
	}
	// No store imports an adapter or an observer (docs/architecture.md).
	adapters := []string{"grpcidem", "consume", "backstop", "internal/proxy", "idemprom", "idemotel", "cmd/idem", "internal/check"}
	for _, store := range []string{"./store/sqlite", "./store/postgres", "./store/redis", "./store/memory", "./admin"} {
		for _, p := range deps(t, store) {
			for _, a := range adapters {
				if p == "github.com/idem-go/idem/"+a {
					t.Errorf("%s imports the adapter %s", store, p)
				}
			}
		}
	}
	// The check sees them where they are.
	for _, adapter := range []string{"./idemprom", "./idemotel"} {
		if got := telemetry(deps(t, adapter)); len(got) == 0 {
			t.Errorf("%s imports no telemetry package: the check above proves nothing", adapter)
		}
	}
}
