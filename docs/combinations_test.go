package docs

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// The configuration-matrix suite (internal/matrix, SPEC §16) is a module of its own, so
// that the frameworks it mounts idem in stay out of the root module's requirements;
// the README's test command runs it here, with -race, its go.sum as committed
// (-mod=readonly) and no workspace, as it runs the example modules. It also checks
// that combinations.md is the table it asserts.
func TestConfigurationMatrix(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("-short: the matrix builds gin and chi and runs every combination")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go command is not on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"vet", "./..."}, {"test", "-race", "-count=1", "./..."}} {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = "../internal/matrix"
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("(cd internal/matrix && go %s) failed: %v\n%s\n"+
				"(a missing go.sum entry after a change of the root module's requirements: (cd internal/matrix && go mod tidy))",
				args, err, out)
		}
		t.Logf("go %s: %s", args, out)
	}
}
