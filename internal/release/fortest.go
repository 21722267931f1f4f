package release

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// ForTest returns the path of r's binary for a test, built by the zero Builder (from
// the repository around the test's directory, into the user's cache) and logging how
// long a build took. Without r's commit in the history (a shallow clone) the test
// skips, or fails under CI=true; any other failure fails it.
func ForTest(t testing.TB, r Release) string {
	t.Helper()
	bin, err := Builder{}.Build(context.Background(), r)
	switch {
	case errors.Is(err, ErrNoHistory):
		testenv.Unavailable(t, "idem %s cannot be built: %v", r, err)
	case err != nil:
		t.Fatal(err)
	case bin.Built > 0:
		t.Logf("built idem %s in %v (cached at %s)", r, bin.Built.Round(100*time.Millisecond), bin.Path)
	}
	return bin.Path
}
