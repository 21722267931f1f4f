package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// buildTimeout bounds the one `go build` of the command.
const buildTimeout = 5 * time.Minute

var (
	buildOnce sync.Once
	buildDir  string
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// idemBinary returns the path of the idem binary, building it once per test run. A build
// failure fails every test that needs the binary with the compiler's output.
func idemBinary(t testing.TB) string {
	t.Helper()
	bin, err := buildIdem()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// buildIdem builds the binary once and returns its path; safe on any goroutine.
func buildIdem() (string, error) {
	buildOnce.Do(func() {
		if p := os.Getenv("IDEM_E2E_BIN"); p != "" {
			binPath = p
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "idem-e2e-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "idem")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		args := []string{"build", "-o", binPath}
		if os.Getenv("IDEM_E2E_RACE") == "1" {
			args = append(args, "-race")
		}
		args = append(args, "github.com/idem-go/idem/cmd/idem")
		out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go %v: %v\n%s", args, err, out)
		}
	})
	if buildErr != nil {
		return "", fmt.Errorf("building the idem command failed: %v", buildErr)
	}
	return binPath, nil
}
