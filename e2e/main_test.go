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

// buildTimeout bounds the one build of the command: a build with a cold cache took
// 4 min 54 s on a loaded two-core machine (CGO_ENABLED=0 and -trimpath, as the image
// builds it, share no cache with the tests' -race builds). Past it, the build is
// killed and its output, and the bound, are the failure.
const buildTimeout = 10 * time.Minute

// buildWaitDelay bounds how long a killed build's children (the compiler) may hold
// its output open: without it, CombinedOutput waits for them past buildTimeout.
const buildWaitDelay = 10 * time.Second

var (
	buildOnce sync.Once
	buildDir  string
	binPath   string
	buildErr  error
	// binStatic: binPath was built by scripts/build-static, as the image's binary
	// is (the Docker test uses it rather than building the command a second time).
	binStatic bool
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
		if os.Getenv("IDEM_E2E_RACE") == "1" {
			buildErr = runBuild("go", "build", "-o", binPath, "-race", "github.com/idem-go/idem/cmd/idem")
			return
		}
		// The image's build (static, -trimpath): one build serves every process test
		// and the Docker test, and -trimpath lets a clone in another directory reuse
		// the build cache.
		buildErr = runBuild("scripts/build-static", binPath)
		binStatic = buildErr == nil
	})
	if buildErr != nil {
		return "", fmt.Errorf("building the idem command failed: %v", buildErr)
	}
	return binPath, nil
}

// runBuild runs a build command in the module's root within buildTimeout, and returns
// its output with its error.
func runBuild(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = ".." // the module's root, the build stage's WORKDIR
	cmd.WaitDelay = buildWaitDelay
	start := time.Now()
	out, err := cmd.CombinedOutput()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s %v: not done within %v (killed): %v\n%s", name, args, buildTimeout, err, out)
	case err != nil:
		return fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
	}
	if took := time.Since(start); took > buildTimeout/2 {
		fmt.Fprintf(os.Stderr, "e2e: %s took %v of its %v\n", name, took.Round(time.Second), buildTimeout)
	}
	return nil
}
