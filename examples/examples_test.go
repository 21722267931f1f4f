package examples

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// exampleTimeout bounds the vet and tests of one example module, builds included.
const exampleTimeout = 10 * time.Minute

// Every example is its own module: the README's quick starts (sqlite, postgres,
// postgres-sql, redis) and the frameworks (chi, echo, fiber, gin). Its tests start it on
// a loopback port and send a duplicate POST, which must be replayed
// (exampletest.CheckCharges). They run here with the go command, with the modules'
// go.sum as committed (-mod=readonly) and no workspace, as a user who clones the
// repository runs them.
func TestExamplesPassTheirTests(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("-short: the examples build their frameworks")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go command is not on PATH: %v", err)
	}
	mods, err := filepath.Glob("*/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, filepath.Dir(m))
	}
	if want := []string{"chi", "echo", "fiber", "gin", "postgres", "postgres-sql", "redis", "sqlite"}; !slices.Equal(names, want) {
		t.Fatalf("example modules %q, want %q", names, want)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			for _, args := range [][]string{{"vet", "./..."}, {"test", "-count=1", "./..."}} {
				ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
				cmd := exec.CommandContext(ctx, goBin, args...)
				cmd.Dir = name
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil {
					t.Fatalf("(cd examples/%s && go %s) failed: %v\n%s\n"+
						"(a missing go.sum entry after a change of the root module's requirements: (cd examples/%[1]s && go mod tidy))",
						name, args, err, out)
				}
				t.Logf("go %s: %s", args, out)
			}
		})
	}
}
